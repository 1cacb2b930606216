// Epilogue fusion decisions (DESIGN.md sections 8 and 9): an op of fusion kind
// out-elementwise-fusable whose library kernel takes an epilogue (a matmul or conv2d on oneDNN)
// and the chain of elementwise ops after it that the library applies while the output is in
// registers: activations, scalar affine steps (alpha * x + beta), binary ops with a same-shape or
// per-channel tensor. Each link is the only reader of the value before it, so every value read
// outside the chain is still written (in training, a pre-activation the backward reads ends the
// chain there).
//
// What the library can take is a query, not knowledge of passes/: the options carry callbacks the
// plan builder fills from the runtime's kernels (which anchors have an epilogue kernel, which
// scalar functions its post-ops apply). Binding the library call is the plan builder's.
//
// Not here: trees (x * sigmoid(x) reads x twice), broadcasts other than per channel, and which
// groups a GPU plan runs as cuBLASLt epilogues (codegen/plan/fuse_epilogue.cc decides that).
#pragma once

#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/runtime/scalar_fn.h"

namespace kiln::passes {

/// One step of a chain, applied to the chain's value x.
struct EpilogueOp {
  enum Kind : uint8_t { kUnary, kLinear, kBinary } kind = kUnary;
  UnaryFn unary = UnaryFn::kIdentity;  ///< kUnary
  float alpha = 1, beta = 0;           ///< kLinear: alpha * x + beta
  BinaryFn binary = BinaryFn::kAdd;    ///< kBinary: x op operand (x on the left)
  bool per_channel = false;            ///< kBinary: one operand value per channel, else the output's shape
  int operand = 0;                     ///< kBinary: index into EpilogueChain::operands
};

struct EpilogueChain {
  std::vector<int> members;  ///< node indices: the anchor, then the chain in order (the last is the root)
  std::vector<EpilogueOp> ops;               ///< one per member after the anchor
  std::vector<const ir::Value*> operands;    ///< the tensors binary steps read
};

struct EpilogueOptions {
  /// The channel axis of the output of `anchor` when its library kernel takes an epilogue, else -1.
  int (*anchor_channel_axis)(const ir::Node& anchor) = nullptr;
  /// The scalar functions the epilogue's steps may apply.
  bool (*supports_unary)(UnaryFn f) = nullptr;
  bool (*supports_binary)(BinaryFn f) = nullptr;
  /// Tensors a chain may read besides the anchor's inputs (the library call's arguments are few).
  int max_operands = 4;
};

/// The chains among the `live` nodes not `claimed` (row groups claim first), in anchor order; a
/// chain has at least one op after its anchor. Every option callback must be set.
std::vector<EpilogueChain> FindEpilogueChains(const ir::Graph& graph, const std::vector<bool>& live,
                                              const std::vector<bool>& claimed, const EpilogueOptions& options);

}  // namespace kiln::passes
