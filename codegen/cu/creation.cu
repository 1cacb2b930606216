// The creation ops' GPU kernels: arange, and random numbers from the CPU's counter-based stream (runtime/cpu/random.cc, Philox-4x32-10),
// so one seed and offset give the same numbers on both devices. Element i of a draw at counter
// `offset` takes word i % 4 of block (offset + i) / 4 of the stream keyed by `seed`. Values are
// computed in double as on the CPU, then rounded to the output dtype; built with
// -ffp-contract=off (codegen/CMakeLists.txt) so no multiply-add is fused, as on the CPU.
#include "cu_common.h"

namespace {

struct Words {
  unsigned w[4];
};

__device__ Words Philox(unsigned long long key, unsigned long long counter) {
  unsigned c0 = static_cast<unsigned>(counter), c1 = static_cast<unsigned>(counter >> 32), c2 = 0, c3 = 0;
  unsigned k0 = static_cast<unsigned>(key), k1 = static_cast<unsigned>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    unsigned long long p0 = 0xD2511F53ull * c0;
    unsigned long long p1 = 0xCD9E8D57ull * c2;
    unsigned n0 = static_cast<unsigned>(p1 >> 32) ^ c1 ^ k0;
    unsigned n2 = static_cast<unsigned>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<unsigned>(p1);
    c3 = static_cast<unsigned>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

__device__ double ToUnit(unsigned x) { return (x >> 8) * (1.0 / 16777216.0); }  // [0, 1), 24 bits

// out[i] = g(words, i % 4) for i < n, one Philox block per loop step (grid-stride).
template <class T, class G>
__device__ void Generate(T* out, long long n, unsigned long long seed, unsigned long long offset, G g) {
  const long long blocks = (n + 3) / 4;
  for (long long b = GlobalThread(); b < blocks; b += GridThreads()) {
    Words u = Philox(seed, offset / 4 + static_cast<unsigned long long>(b));
    for (int k = 0; k < 4 && b * 4 + k < n; ++k) out[b * 4 + k] = g(u, k);
  }
}

template <class T>
__device__ void Uniform(T* out, long long n, unsigned long long seed, unsigned long long offset, double low,
                        double high) {
  Generate(out, n, seed, offset, [=](const Words& u, int k) {
    T v = static_cast<T>(low + (high - low) * ToUnit(u.w[k]));
    return static_cast<double>(v) >= high ? static_cast<T>(low) : v;  // the range stays half-open
  });
}

template <class T>
__device__ void Normal(T* out, long long n, unsigned long long seed, unsigned long long offset, double mean,
                       double std) {
  Generate(out, n, seed, offset, [=](const Words& u, int k) {
    const int pair = k & ~1;
    const double u1 = 1.0 - ToUnit(u.w[pair]);  // (0, 1]
    const double u2 = ToUnit(u.w[pair + 1]);
    const double r = __nv_sqrt(-2.0 * __nv_log(u1));
    const double z = (k & 1) ? r * __nv_sin(2 * kPi * u2) : r * __nv_cos(2 * kPi * u2);
    return static_cast<T>(mean + std * z);
  });
}

template <class T>
__device__ void Bernoulli(T* out, long long n, unsigned long long seed, unsigned long long offset, double p) {
  Generate(out, n, seed, offset, [=](const Words& u, int k) { return static_cast<T>(ToUnit(u.w[k]) < p ? 1.0 : 0.0); });
}

}  // namespace

#define KILN_RANDOM(T, suffix)                                                                              \
  extern "C" __global__ void kiln_random_uniform_##suffix(T* out, long long n, unsigned long long seed,     \
                                                          unsigned long long offset, double a, double b) { \
    Uniform(out, n, seed, offset, a, b);                                                                    \
  }                                                                                                         \
  extern "C" __global__ void kiln_random_normal_##suffix(T* out, long long n, unsigned long long seed,      \
                                                         unsigned long long offset, double a, double b) {  \
    Normal(out, n, seed, offset, a, b);                                                                     \
  }                                                                                                         \
  extern "C" __global__ void kiln_random_bernoulli_##suffix(T* out, long long n, unsigned long long seed,   \
                                                            unsigned long long offset, double p, double) { \
    Bernoulli(out, n, seed, offset, p);                                                                     \
  }

/// arange: out[i] = start + step * i, computed in double as on the CPU.
#define KILN_ARANGE(T, suffix)                                                                        \
  extern "C" __global__ void kiln_arange_##suffix(T* out, long long n, double start, double step) { \
    for (long long i = GlobalThread(); i < n; i += GridThreads()) out[i] = static_cast<T>(start + step * i); \
  }

KILN_RANDOM(float, f32)  // random ops draw floating dtypes only (ir/ops_creation.cc)
KILN_RANDOM(double, f64)
KILN_ARANGE(float, f32)
KILN_ARANGE(double, f64)
KILN_ARANGE(int, i32)
KILN_ARANGE(long long, i64)
