// Rematerialization: which forward values a training pair's backward keeps, and which it
// computes again from those it keeps. A compiled training step splits into a forward that also
// outputs the values its backward reads, and a backward that takes them as inputs; every value
// kept lives from the forward to the end of the backward, and dominates a step's peak memory.
// A value made by cheap pointwise ops (elementwise, broadcast, reshape) from values that are kept
// anyway is better computed again inside the backward, where fusion folds the work into the
// gradient kernels that read the same inputs. A batch norm followed by relu, composed of such
// ops, then keeps x - mean (and per-channel statistics) instead of x - mean, the normalized x and
// the relu's output.
#pragma once

#include <span>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

struct SavePlan {
  std::vector<const ir::Value*> saved;      ///< kept: forward values the backward takes as inputs
  std::vector<const ir::Node*> recompute;   ///< forward nodes the backward runs again, in order
};

/// `g` holds the forward's nodes [0, `forward_end`) and then the nodes that read them (the
/// gradient). `needed`: the forward values those later nodes read. The graph's inputs are
/// available to both halves and never saved, except those in `overwritten` (inputs the call
/// copies new values into, as batch norm's running statistics: the backward would read the new
/// values), from which nothing is recomputed. Values in `keep` (the forward's outputs) are saved
/// when needed and never recomputed. A needed value is recomputed when the values its pointwise
/// producers start from cost fewer bytes to keep than it does; random ops are never recomputed.
SavePlan ChooseSaved(const ir::Graph& g, size_t forward_end, std::span<const ir::Value* const> needed,
                     std::span<const ir::Value* const> keep, std::span<const ir::Value* const> overwritten = {});

}  // namespace kiln::passes
