// The parts of bench_gpu that live in bench/gpu_models.cc (convolutions and model training on
// gpu(0)), and the "skipped" line every part prints when it cannot run. See bench/gpu.cc.
#pragma once

#include <cstdio>

namespace kiln::gpubench {

/// One JSON line saying why `bench` measured nothing (no GPU, simulated GPUs, no CUDA build...).
inline void Skipped(const char* bench, const char* why) {
  std::printf("{\"bench\": \"%s\", \"case\": \"skipped\", \"metric\": \"none\", \"value\": 0, \"unit\": \"%s\"}\n",
              bench, why);
  std::fflush(stdout);
}

/// The line a part prints after its correctness check on simulated GPUs.
inline constexpr const char* kSimulatedOnly = "simulated GPUs: correctness only, timings need a real GPU";

/// Each checks kiln on gpu(0) against the CPU at a small size (exits 1 on a mismatch); then, when
/// `timed` (a real GPU), measures; else prints the kSimulatedOnly line.
void ConvBench(bool quick, bool timed);      // gpu_conv
void ResNet18Bench(bool quick, bool timed);  // gpu_resnet18
void LeNetBench(bool quick, bool timed);     // gpu_lenet

}  // namespace kiln::gpubench
