// Freeze folding, for hybridize(freeze=True) (DESIGN.md sections 6 and 8): graph inputs that the
// caller declares constant (the parameters of an inference graph) are evaluated into the nodes
// that depend on constants alone, once, when the graph is compiled. The pass names constants by
// handle; the frontend holds the data behind the handles and runs the nodes (passes/ do not run
// kernels, DESIGN.md section 2). Not here: where constants come from, or keeping them up to date
// (a frozen graph holds the values it was frozen with).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// Runs nodes on constant data for freeze_fold; the frontend implements it.
class ConstantEvaluator {
 public:
  virtual ~ConstantEvaluator() = default;
  /// Computes the outputs of `n` from the constants `in` (one handle per input of `n`; none for a
  /// `full`) exactly as the graph would, and returns a new handle per output; nullopt when it
  /// cannot (no kernel, a kernel that fails): the node then stays in the graph.
  virtual std::optional<std::vector<int>> Evaluate(const ir::Node& n, std::span<const int> in) = 0;
};

struct FreezeOptions {
  /// One entry per graph input: the handle of the constant it is, or -1 where it stays an input.
  std::vector<int> constants;
  ConstantEvaluator* evaluator = nullptr;  ///< none: constants are only moved behind the other inputs
};

/// What freezing did, and what the new graph's constant inputs hold.
struct FreezeResult {
  /// The new graph's inputs are the old non-constant inputs, in order, then one input per
  /// constant it still reads, holding these handles, in order.
  std::vector<int> constants;
  int inputs_frozen = 0;       ///< inputs declared constant (parameters that became constants)
  int nodes_folded = 0;        ///< nodes evaluated here, which the graph no longer runs
  int64_t constant_bytes = 0;  ///< bytes of the constants the new graph reads
};

/// freeze_fold.cc: evaluates every live deterministic node whose inputs are constants (declared
/// inputs, `full` fills, folded values), at least one of them not a fill, and whose outputs are
/// no larger than its non-fill inputs; keeps only the nodes the outputs still need. True when the
/// graph changed. `result` may be null.
bool RunFreezeFold(std::unique_ptr<ir::Graph>& g, const FreezeOptions& options,
                   FreezeResult* result = nullptr);

}  // namespace kiln::passes
