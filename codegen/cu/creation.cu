// The creation ops' GPU kernels: arange, and random numbers from the CPU's counter-based stream
// (Philox-4x32-10, include/kiln/runtime/philox.h, shared with runtime/cpu/random.cc), so one seed
// and offset give the same numbers on both devices. Element i of a draw at counter
// `offset` takes word i % 4 of block (offset + i) / 4 of the stream keyed by `seed`. Values are
// computed in double as on the CPU, then rounded to the output dtype; built with
// -ffp-contract=off (codegen/CMakeLists.txt) so no multiply-add is fused, as on the CPU.
//
// `state`: null for a draw whose seed and offset are the launch's arguments; in a plan replayed
// as a CUDA graph (whose kernel arguments are fixed when it is captured) the seed and the call's
// base offset are read from state[0] and state[1] in device memory, and `offset` is the draw's
// offset from that base. kiln_random_set_state writes them before a replay whose call draws
// elsewhere than the graph's last replay left off; the graph's own last kernel,
// kiln_random_advance, moves the base on by the call's draws, as the host's generator moves.
#include "cu_common.h"
#include "kiln/runtime/float16_bits.h"
#include "kiln/runtime/philox.h"

namespace {

// float16 and bfloat16 by their bits (include/kiln/runtime/float16_bits.h, as the CPU rounds
// them): T(double) goes through float, as the CPU's compute_t does.
using kiln::f16::FloatToBFloat16Bits;
using kiln::f16::FloatToHalfBits;
using kiln::f16::HalfBitsToFloat;

struct Half {
  unsigned short bits;
  __device__ explicit Half(double d) : bits(FloatToHalfBits(static_cast<float>(d))) {}
  __device__ explicit operator double() const { return HalfBitsToFloat(bits); }
};
struct BFloat16 {
  unsigned short bits;
  __device__ explicit BFloat16(double d) : bits(FloatToBFloat16Bits(static_cast<float>(d))) {}
  __device__ explicit operator double() const { return __builtin_bit_cast(float, static_cast<unsigned>(bits) << 16); }
};

using kiln::philox::Words;
using kiln::philox::ToUnit;

// out[i] = g(words, i % 4) for i < n, one Philox block per loop step (grid-stride).
template <class T, class G>
__device__ void Generate(T* out, long long n, unsigned long long seed, unsigned long long offset, G g) {
  const long long blocks = (n + 3) / 4;
  for (long long b = GlobalThread(); b < blocks; b += GridThreads()) {
    Words u = kiln::philox::At(seed, offset / 4 + static_cast<unsigned long long>(b));
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

extern "C" __global__ void kiln_random_set_state(unsigned long long* state, unsigned long long seed,
                                                  unsigned long long offset) {
  if (GlobalThread() == 0) state[0] = seed, state[1] = offset;
}
extern "C" __global__ void kiln_random_advance(unsigned long long* state, unsigned long long draws) {
  if (GlobalThread() == 0) state[1] += draws;
}

#define KILN_RANDOM_STATE                                                          \
  const unsigned long long* state, unsigned long long seed, unsigned long long offset
#define KILN_RANDOM_AT state ? state[0] : seed, (state ? state[1] : 0) + offset

#define KILN_RANDOM(T, suffix)                                                                           \
  extern "C" __global__ void kiln_random_uniform_##suffix(T* out, long long n, KILN_RANDOM_STATE,       \
                                                          double a, double b) {                          \
    Uniform(out, n, KILN_RANDOM_AT, a, b);                                                               \
  }                                                                                                      \
  extern "C" __global__ void kiln_random_normal_##suffix(T* out, long long n, KILN_RANDOM_STATE,        \
                                                         double a, double b) {                           \
    Normal(out, n, KILN_RANDOM_AT, a, b);                                                                \
  }                                                                                                      \
  extern "C" __global__ void kiln_random_bernoulli_##suffix(T* out, long long n, KILN_RANDOM_STATE,     \
                                                            double p, double) {                          \
    Bernoulli(out, n, KILN_RANDOM_AT, p);                                                                \
  }

/// arange: out[i] = start + step * i, computed in double as on the CPU.
#define KILN_ARANGE(T, suffix)                                                                        \
  extern "C" __global__ void kiln_arange_##suffix(T* out, long long n, double start, double step) { \
    for (long long i = GlobalThread(); i < n; i += GridThreads()) out[i] = static_cast<T>(start + step * i); \
  }

// Every dtype (ir/ops_creation.cc decides which each op takes: uniform and normal floats only).
#define KILN_CREATION(T, suffix) KILN_RANDOM(T, suffix) KILN_ARANGE(T, suffix)
KILN_CREATION(float, f32)
KILN_CREATION(double, f64)
KILN_CREATION(Half, f16)
KILN_CREATION(BFloat16, bf16)
KILN_CREATION(int, i32)
KILN_CREATION(long long, i64)
KILN_CREATION(unsigned char, u8)
KILN_CREATION(bool, b8)
