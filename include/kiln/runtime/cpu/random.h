// Counter-based random numbers (Philox-4x32-10). Element i of a draw at counter `offset` uses
// block (offset + i) / 4 of the stream keyed by `seed`, so the values do not depend on how many
// threads fill the tensor, and a draw is reproducible from (seed, offset) alone.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

/// Four 32-bit words of the Philox stream at `counter` for `key`.
std::array<uint32_t, 4> Philox(uint64_t key, uint64_t counter);

void RandomUniform(const TensorView& out, double low, double high, uint64_t seed, uint64_t offset);
void RandomNormal(const TensorView& out, double mean, double std, uint64_t seed, uint64_t offset);
void RandomBernoulli(const TensorView& out, double p, uint64_t seed, uint64_t offset);

}  // namespace kiln::host
