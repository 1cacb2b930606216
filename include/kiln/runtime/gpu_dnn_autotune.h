// Convolution algorithms chosen by measurement (as MXNet's cuDNN autotune and
// torch.backends.cudnn.benchmark): a problem's first call measures every algorithm cuDNN has for
// it (DnnFindConvolutionAlgorithms) and keeps the fastest, in memory and on disk (KILN_CACHE_DIR/dnn),
// so that later calls, plans captured as CUDA graphs and the next process run it without measuring.
// Where measuring is impossible (the stream captures a graph, a platform that cannot measure, no
// memory for the measurement's workspace) the platform's heuristic choice stands, and nothing is
// written. KILN_CUDNN_AUTOTUNE=0 keeps the heuristics everywhere.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/runtime/gpu.h"
#include "kiln/runtime/gpu_dnn.h"

namespace kiln::gpurt {

struct AutotuneStats {
  int64_t measured = 0;     ///< problems measured in this process
  int64_t memory_hits = 0;  ///< calls answered from memory
  int64_t disk_hits = 0;    ///< problems answered from the disk cache
  int64_t disk_writes = 0;  ///< choices written to the disk cache
  int64_t heuristic = 0;    ///< calls left to the heuristics (capturing, off, nothing measurable)
};

/// Sets `a.algo` to the algorithm chosen for its problem on `device`, measuring it (on `a`'s
/// buffers: the output is overwritten, a backward-filter call's too) when no choice is known.
/// `a.workspace` is unset on return: the caller sizes it for the chosen algorithm.
void ChooseAlgorithm(Platform& p, void* dnn, Stream s, int device, ConvForwardArgs& a);
void ChooseAlgorithm(Platform& p, void* dnn, Stream s, int device, ConvBackwardDataArgs& a);
void ChooseAlgorithm(Platform& p, void* dnn, Stream s, int device, ConvBackwardFilterArgs& a);

AutotuneStats GetAutotuneStats();

/// The text a problem's choice is kept under (memory and disk); exposed for tests.
std::string AlgorithmKey(Platform& p, int device, const ConvForwardArgs& a);

namespace detail {
/// Forgets the choices kept in memory and zeroes the statistics (tests: a "second process").
void ForgetAlgorithms();
}  // namespace detail

}  // namespace kiln::gpurt
