// Memory planning (DESIGN.md section 8): the intermediates of a plan laid out in one arena by
// liveness. Steps run in order; a value takes the smallest free block that fits when its step
// writes it and gives the block back after its last reader. An elementwise step's output may
// instead take the block of an input of the same dtype and element count that dies there (in
// place): such a kernel reads element k of each operand before it writes element k. Other blocks
// are freed only after the step's outputs are placed, so no other step's output overlaps its
// inputs. With streams run concurrently, a block freed on a stream is taken again only on that
// stream (the executor's per-lane layout); reuse across streams would need waits.
//
// Not here: which steps exist and what they read (fusion), whether an op is elementwise (the
// caller says so per step), or where graph inputs and outputs live (they are not planned).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/runtime/dtype.h"

namespace kiln::passes {

/// A value the planner may place (an intermediate) or must leave alone (`planned` false: a graph
/// input or output, which the call provides).
struct MemoryValue {
  bool planned = true;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  /// Where its last reader is: a step index, kNoReader (nothing reads it: freed once written), or
  /// kNeverFreed (a reader that never runs as a step: its block is kept to the end).
  int last_reader = kNoReader;
  static constexpr int kNoReader = -1, kNeverFreed = -2;
};

/// One step: the values it reads and writes, whether its output may take a dying input's block,
/// and its stream.
struct MemoryStep {
  std::vector<int> reads, writes; ///< value indices
  bool elementwise = false;
  int stream = 0;
};

struct MemoryOptions {
  bool in_place = true;    ///< KILN_DISABLE_PASS=inplace turns it off
  bool per_stream = false; ///< reuse a freed block only on the stream that freed it
};

struct MemoryPlan {
  std::vector<int64_t> offset; ///< per value: byte offset in the arena, -1 when not planned
  size_t arena_bytes = 0;
  int intermediates = 0;     ///< values placed
  int in_place = 0;          ///< of those, written over an input that dies there
  size_t unshared_bytes = 0; ///< their blocks summed, as if none shared memory
};

/// A value's block: its bytes rounded up to 64.
size_t BlockBytes(DType dtype, int64_t numel);

/// Lays out the planned values of `values` written by `steps` (in run order).
MemoryPlan PlanMemory(std::span<const MemoryStep> steps, std::span<const MemoryValue> values,
                      const MemoryOptions& options);

/// The pass over a graph: lays out its values as a plan runs it, one step per node that runs, in
/// order (a node with a `#group=` note runs only as its group's last member, reading every operand
/// the group takes from outside; a group of elementwise ops only is elementwise), on the stream of
/// its `#stream=` note (0 when unset), and records each value's byte offset in its ValueNote
/// (printed `@arena+N`; -1 for graph inputs and outputs and the values a group computes inside;
/// a member's value read outside its group is written by the group's step, as a row group does).
/// Returns true when an offset changed; `arena_bytes`, when given, receives the arena's size.
bool RunMemoryPlanning(ir::Graph& graph, const MemoryOptions& options, size_t* arena_bytes = nullptr);

} // namespace kiln::passes
