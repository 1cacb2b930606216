// cuDNN on the simulated GPUs (internal to runtime/gpusim/; sim_dnn.cc): the platform's cuDNN
// calls check what cuDNN checks (gpu_dnn.h), then run stream-ordered on the stream's worker thread
// with the CPU's kernels (oneDNN convolution and pooling, plain loops for batch norm).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/runtime/gpu_dnn.h"
#include "sim.h"

namespace kiln::gpusim {

/// The workspace each simulated convolution call asks for (DnnConvolutionWorkspaceSize), as
/// cuDNN's non-implicit-GEMM algorithms do; a call given one checks it and writes it.
constexpr size_t kConvWorkspaceBytes = 4096;

/// The simulated cuDNN's algorithms of each convolution call, and what a measurement of them
/// reports (DnnFindConvolutionAlgorithms): a model, not a clock, so that a choice is the same on
/// every run. Each algorithm costs a fixed time plus the call's multiply-adds at its own rate;
/// FFT and Winograd algorithms run only unstrided, undilated, ungrouped problems (Winograd only
/// 3x3 and 5x5 filters) and need workspaces that grow with the problem. The heuristic choice
/// (algo -1) is implicit precomputed GEMM, with kConvWorkspaceBytes; on 3x3 problems of any size
/// a measurement prefers another.
enum class ConvCall { kForward, kBackwardData, kBackwardFilter };
struct ConvProblem {
  ConvCall call;
  int64_t n, c, h, w, k, r, s, oh, ow;
  gpurt::DnnConvDesc conv;
};
ConvProblem ProblemOf(const gpurt::ConvForwardArgs& a);
ConvProblem ProblemOf(const gpurt::ConvBackwardDataArgs& a);
ConvProblem ProblemOf(const gpurt::ConvBackwardFilterArgs& a);
/// Every algorithm of cuDNN's enum for the call, modelled (status kDnnNotSupported where it
/// cannot run the problem), in enum order.
std::vector<gpurt::DnnAlgoPerf> ModelAlgorithms(const ConvProblem& p);
/// The workspace algorithm `algo` (-1: the heuristic's) needs; throws DnnError kDnnBadParam for
/// an algorithm outside the enum and kDnnNotSupported for one that cannot run the problem.
size_t AlgorithmWorkspace(const ConvProblem& p, int algo, const char* call);

/// What the simulator's LibraryHandle returns: the library, and the stream it is bound to.
using LibraryHandleRec = std::pair<gpurt::Library, gpurt::Stream>;

// `handle` must be a kDnn handle bound to `h` (the stream as the caller named it; `s` is its
// worker, the device's default stream for nullptr).
void DnnConvolutionForward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                           const gpurt::ConvForwardArgs& a);
void DnnConvolutionBackwardData(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                                const gpurt::ConvBackwardDataArgs& a);
void DnnConvolutionBackwardFilter(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                                  const gpurt::ConvBackwardFilterArgs& a);
void DnnPoolingForward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                       const gpurt::PoolingForwardArgs& a);
void DnnPoolingBackward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                        const gpurt::PoolingBackwardArgs& a);
void DnnBatchNormBackward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                          const gpurt::BatchNormBackwardArgs& a);
void DnnBatchNormForward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                         const gpurt::BatchNormArgs& a, bool training);

} // namespace kiln::gpusim
