// cuDNN on real GPUs (internal to runtime/cuda/; dnn_cuda.cc): the handles the CUDA platform
// keeps per device and the calls its cuDNN methods make.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kiln/runtime/gpu_dnn.h"

namespace kiln::cuda {

/// The cuDNN handle of the current device (created on first use), bound to `s` (cudnnSetStream).
void* DnnHandle(gpurt::Stream s);

// Each checks that `handle` is bound to `s`, makes the shared checks of gpu_dnn.h, then calls
// cuDNN; `p` allocates the convolution's workspace where the args bring none.
void DnnConvolutionForward(gpurt::Platform& p, void* handle, gpurt::Stream s,
                           const gpurt::ConvForwardArgs& a);
void DnnConvolutionBackwardData(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                const gpurt::ConvBackwardDataArgs& a);
void DnnConvolutionBackwardFilter(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                  const gpurt::ConvBackwardFilterArgs& a);
/// The bytes of workspace the call with `a` needs (its algorithm chosen and cached).
size_t DnnConvolutionWorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                   const gpurt::ConvForwardArgs& a);
size_t DnnConvolutionWorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                   const gpurt::ConvBackwardDataArgs& a);
size_t DnnConvolutionWorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                   const gpurt::ConvBackwardFilterArgs& a);
/// Every algorithm of the call, run on its buffers (cudnnFind*AlgorithmEx), fastest first.
std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                                             const gpurt::ConvForwardArgs& a);
std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                                             const gpurt::ConvBackwardDataArgs& a);
std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                                             const gpurt::ConvBackwardFilterArgs& a);
/// cuDNN's version and the device's model ("" when unknown).
std::string DnnLibraryKey(int device);
void DnnPoolingForward(void* handle, gpurt::Stream s, const gpurt::PoolingForwardArgs& a);
void DnnPoolingBackward(void* handle, gpurt::Stream s, const gpurt::PoolingBackwardArgs& a);
void DnnBatchNormBackward(void* handle, gpurt::Stream s, const gpurt::BatchNormBackwardArgs& a);
void DnnBatchNormForward(void* handle, gpurt::Stream s, const gpurt::BatchNormArgs& a, bool training);

} // namespace kiln::cuda
