// The fusion steps of plan building (internal to codegen/plan/): plan.cc, fuse_rows.cc and
// fuse_epilogue.cc share this vocabulary, the decisions of passes/fusion.h.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "kiln/codegen/plan.h"

namespace kiln {

/// The fusion step's shared vocabulary (plan.cc, fuse_rows.cc, fuse_epilogue.cc): the decisions
/// of passes/fusion.h.
namespace fusion {
using passes::BroadcastIndex;
using passes::Fusable;
using passes::ScalarConst;
/// Epilogue groups (fuse_epilogue.cc, DESIGN.md section 9): the chains passes::FindEpilogueChains
/// finds among the nodes not `claimed` (a matmul/conv2d and the elementwise consumers oneDNN
/// post-ops express), each bound to one oneDNN call set at the chain's last node in `p`, members
/// marked in `claimed`. Returns the number of groups.
int FuseEpilogues(const ir::Graph& graph, const std::vector<bool>& live, Plan* p, std::vector<bool>* claimed);
/// The same on a GPU: the chains cuBLASLt's epilogue expresses (a float32 matmul, a per-output-
/// feature bias add, a relu; the longest such prefix of a chain), each one GEMM
/// (gpurt::MatmulOnGpu) that GpuEpilogueStep launches.
int FuseGpuEpilogues(const ir::Graph& graph, const std::vector<bool>& live, Plan* p, std::vector<bool>* claimed);
std::function<void(const exec::StepArgs&)> GpuEpilogueStep(std::shared_ptr<const host::EpilogueCall> call);
}  // namespace fusion

#if KILN_WITH_CODEGEN
namespace fusion {
/// Row groups (fuse_rows.cc): the groups passes::FindRowGroups decides (a reduction with its
/// elementwise producers and consumers), each built into one row kernel set at the group's last
/// node in `p`. Marks members in `claimed` (the elementwise groups formed afterwards leave them
/// alone). A group that fails to compile, or would run slower fused, is not formed.
void FuseRows(const ir::Graph& graph, const std::vector<bool>& live, Plan* p, std::vector<bool>* claimed);
}  // namespace fusion
#endif

}  // namespace kiln
