// Philox-4x32-10, the counter-based generator behind kiln's random ops, written once for the CPU
// kernels (runtime/cpu/random.cc) and the GPU kernels (codegen/cu/creation.cu, compiled by
// clang-19 as CUDA C++), so that one seed and counter give the same numbers on both devices.
// Plain C++ without the standard library: the GPU side has none.
#pragma once

#include "kiln/runtime/host_device.h"

namespace kiln::philox {

/// Four 32-bit words of the stream.
struct Words {
  unsigned w[4];
};

/// The four words of the stream keyed by `key` at `counter`.
KILN_HOST_DEVICE inline Words At(unsigned long long key, unsigned long long counter) {
  unsigned c0 = static_cast<unsigned>(counter), c1 = static_cast<unsigned>(counter >> 32), c2 = 0, c3 = 0;
  unsigned k0 = static_cast<unsigned>(key), k1 = static_cast<unsigned>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const unsigned long long p0 = 0xD2511F53ull * c0;
    const unsigned long long p1 = 0xCD9E8D57ull * c2;
    const unsigned n0 = static_cast<unsigned>(p1 >> 32) ^ c1 ^ k0;
    const unsigned n2 = static_cast<unsigned>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<unsigned>(p1);
    c3 = static_cast<unsigned>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// A word as a double in [0, 1) with 24 random bits.
KILN_HOST_DEVICE inline double ToUnit(unsigned x) { return (x >> 8) * (1.0 / 16777216.0); }

}  // namespace kiln::philox
