// Which float32 math the GPU libraries may use, as PyTorch's torch.backends.cudnn.allow_tf32
// (default on) and torch.backends.cuda.matmul.allow_tf32 (default off): convolutions may run on
// TF32 tensor cores (inputs rounded to 10 mantissa bits, relative error ~1e-3) unless
// KILN_CONV_TF32=0; matmuls stay in full float32 unless KILN_MATMUL_TF32=1. kiln.set_math_mode()
// overrides either switch for the process. Read at each call; a CUDA graph replays the math it was
// captured with, so the executor keys a plan's graphs by the mode (runtime/executor.cc).
#pragma once

#include <cstdint>

namespace kiln::gpurt {

enum class MathOp { kConv, kMatmul };

/// Whether float32 `op`s on GPUs may use TF32 tensor cores: set_math_mode's choice, else the
/// switch (KILN_CONV_TF32, default 1; KILN_MATMUL_TF32, default 0). A switch that is neither 0
/// nor 1 is a ValueError.
bool Tf32Allowed(MathOp op);

/// Overrides `op`'s switch: 1 allows TF32, 0 keeps full float32, -1 goes back to the environment.
void SetTf32(MathOp op, int allowed);

}  // namespace kiln::gpurt
