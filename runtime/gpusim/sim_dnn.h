// cuDNN on the simulated GPUs (internal to runtime/gpusim/; sim_dnn.cc): the platform's cuDNN
// calls check what cuDNN checks (gpu_dnn.h), then run stream-ordered on the stream's worker thread
// with the CPU's kernels (oneDNN convolution and pooling, plain loops for batch norm).
#pragma once

#include <utility>

#include "kiln/runtime/gpu_dnn.h"
#include "sim.h"

namespace kiln::gpusim {

/// The workspace each simulated convolution call asks for (DnnConvolutionWorkspaceSize), as
/// cuDNN's non-implicit-GEMM algorithms do; a call given one checks it and writes it.
constexpr size_t kConvWorkspaceBytes = 4096;

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
