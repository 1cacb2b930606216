// The float32 math policy of GPU convolutions and matmuls (see math_mode.h).
#include "kiln/runtime/math_mode.h"

#include <atomic>

#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"

namespace kiln::gpurt {

namespace {

std::atomic<int> g_override[2] = {-1, -1};

const char* SwitchOf(MathOp op) { return op == MathOp::kConv ? "KILN_CONV_TF32" : "KILN_MATMUL_TF32"; }
const char* WhatOf(MathOp op) { return op == MathOp::kConv ? "convolutions" : "matmuls"; }

}  // namespace

bool Tf32Allowed(MathOp op) {
  const int o = g_override[static_cast<int>(op)].load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  const char* name = SwitchOf(op);
  const int64_t v = env::GetInt(name);
  if (v != 0 && v != 1)
    KILN_THROW(ValueError) << name << "=" << v << ": expected 0 (float32 " << WhatOf(op)
                           << " in full float32) or 1 (TF32 tensor cores: inputs rounded to 10 mantissa bits)";
  return v == 1;
}

void SetTf32(MathOp op, int allowed) {
  KILN_CHECK(allowed >= -1 && allowed <= 1) << "SetTf32: " << allowed;
  g_override[static_cast<int>(op)].store(allowed);
}

}  // namespace kiln::gpurt
