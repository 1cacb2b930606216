// Row fusion decisions (DESIGN.md section 9): which float32 reductions over which rows, with which
// elementwise producers and consumers, form one row group. A decision over the graph alone: the
// group says its members, the level of each member's value (per element or per row), how its rows
// are laid out and how each operand is read; building the row program and compiling it is
// the plan builder's (codegen/plan/fuse_rows.cc), which may refuse a group (it cannot be
// compiled, or it would run slower) through RowFusionOptions::accept.
//
// What groups form, and what does not, is described at the top of passes/row_fusion.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// How a group's rows lie in memory (codegen::RowProgram::Layout says the same for the kernel).
enum class RowLayout : uint8_t {
  kContiguous, ///< trailing axes reduced: row r is len contiguous elements
  kStrided,    ///< leading and trailing axes reduced around a kept block: stretches of `inner`
  kColumns,    ///< leading axes only: rows are columns
};

/// The reduction a row step computes.
enum class RowReduce : uint8_t { kSum, kMean, kMax, kMin };

/// Whether a member's value is per element (the whole shape, rows x len) or per row.
enum class RowLevel : uint8_t { kElement, kRow };

/// How the kernel reads an operand computed outside the group.
enum class RowRead : uint8_t {
  kElement,  ///< one value per element
  kRow,      ///< one value per row
  kColumn,   ///< one value per position in the row (contiguous rows only)
  kScalar,   ///< one value
  kOneHot,   ///< int64 labels, one per row, read as a one_hot of depth len
  kOneHot32, ///< the same with int32 labels
};

/// A reduction a row kernel can take, viewed as rows.
struct RowShape {
  RowReduce kind = RowReduce::kSum;
  RowLayout layout = RowLayout::kContiguous;
  int64_t len = 0, inner = 0; ///< elements per row; contiguous elements per stretch
};

/// The row shape of node `n` when it is a float32 sum, mean, max or min (not to a rank-0 scalar)
/// over trailing axes, leading axes, or both around one kept block whose trailing reduced part
/// holds 1 or at least 8 elements; nullopt otherwise.
std::optional<RowShape> RowReduction(const ir::Node& n);

/// reshape, expand_dims, squeeze: a row value keeps its rows through them.
bool KeepsRowOrder(const ir::Node& n);

/// A row group: its members and the geometry its values are read in.
struct RowGroup {
  std::vector<int> members;                     ///< node indices in graph order; the last is the root
  std::vector<RowLevel> levels;                 ///< per member: its value's level
  std::vector<std::optional<RowReduce>> reduce; ///< per member: the reduction it computes, if any
  RowLayout layout = RowLayout::kContiguous;
  Shape full; ///< the per-element shape
  int64_t rows = 0, len = 0, inner = 0;

  /// Node `i` is a member.
  bool IsMember(int i) const;
  /// `v` is the output of a member.
  bool IsMemberValue(const ir::Value* v) const;
  /// The level of member value `v`.
  RowLevel LevelOf(const ir::Value* v) const;
  /// The reduction member node `i` computes, if it is one.
  std::optional<RowReduce> ReductionOf(int i) const;
  /// How a one_hot node's labels are read, if `n` is one the kernel computes.
  std::optional<RowRead> OneHot(const ir::Node& n) const;
  /// broadcast_to of a float32 value to the whole shape (elementwise in the kernel).
  bool IsBroadcast(const ir::Node& n) const;
  /// How an operand `w` computed outside the group is read by a node at `level` with output
  /// shape `out`, or nullopt when the kernel cannot read it.
  std::optional<RowRead> ExternalRead(const ir::Value* w, RowLevel level, const Shape& out) const;
};

struct RowFusionOptions {
  /// Threads the kernel splits rows across: very long rows in fewer than min(64, 4 x threads)
  /// rows stay unfused (the kernel splits by rows only).
  int num_threads = 1;
  /// Asked of each group found, in seed order; a group refused is not formed and its nodes stay
  /// free for later groups. Unset: every group is formed.
  std::function<bool(const RowGroup&)> accept;
};

/// The row groups among the `live` nodes not `claimed`, seeded by each row reduction in graph
/// order; members of each group formed are marked in `claimed`. Deterministic: the same graph
/// and options give the same groups.
std::vector<RowGroup> FindRowGroups(const ir::Graph& graph, const std::vector<bool>& live,
                                    std::vector<bool>* claimed, const RowFusionOptions& options);

/// The pass over a graph: the groups FindRowGroups forms among the nodes with no `#group=` note
/// yet, each recorded on its members as a `#group=` note numbered after the graph's highest
/// group. True when a group was formed (a second run forms none).
bool RunRowFusion(ir::Graph& graph, const RowFusionOptions& options);

} // namespace kiln::passes
