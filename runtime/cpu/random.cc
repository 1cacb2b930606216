#include "kiln/runtime/cpu/random.h"

#include <cmath>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/philox.h"

namespace kiln::host {

std::array<uint32_t, 4> Philox(uint64_t key, uint64_t counter) {
  const philox::Words u = philox::At(key, counter);
  return {u.w[0], u.w[1], u.w[2], u.w[3]};
}

namespace {
inline double ToUnit(uint32_t x) { return philox::ToUnit(x); }  // [0, 1), 24 bits

// Calls f(i, u[4]) for each block covering elements [b, e) of the output.
template <class F>
void ForBlocks(int64_t n, uint64_t seed, uint64_t offset, F&& f) {
  KILN_CHECK(offset % 4 == 0);
  int64_t blocks = (n + 3) / 4;
  ParallelFor(blocks, 4096, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      std::array<uint32_t, 4> u = Philox(seed, offset / 4 + static_cast<uint64_t>(blk));
      for (int k = 0; k < 4 && blk * 4 + k < n; ++k) f(blk * 4 + k, u, k);
    }
  });
}

// `below`: values must stay below it after rounding to the output dtype (uniform's half-open
// range); a draw that rounds up to it is replaced by `fallback`.
template <class G>
void Generate(const TensorView& out, uint64_t seed, uint64_t offset, G&& g,
              double below = INFINITY, double fallback = 0) {
  KILN_CHECK(out.is_contiguous());
  KILN_DISPATCH_ALL(out.dtype, {
    scalar_t* y = out.ptr<scalar_t>();
    ForBlocks(out.numel(), seed, offset, [&](int64_t i, const std::array<uint32_t, 4>& u, int k) {
      scalar_t v = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(g(u, k)));
      if (static_cast<double>(static_cast<compute_t<scalar_t>>(v)) >= below)
        v = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(fallback));
      y[i] = v;
    });
  });
}
}  // namespace

void RandomUniform(const TensorView& out, double low, double high, uint64_t seed, uint64_t offset) {
  Generate(out, seed, offset, [&](const std::array<uint32_t, 4>& u, int k) {
    return low + (high - low) * ToUnit(u[k]);
  }, high, low);
}

void RandomNormal(const TensorView& out, double mean, double std, uint64_t seed, uint64_t offset) {
  Generate(out, seed, offset, [&](const std::array<uint32_t, 4>& u, int k) {
    int pair = k & ~1;
    double u1 = 1.0 - ToUnit(u[pair]);  // (0, 1]
    double u2 = ToUnit(u[pair + 1]);
    double r = std::sqrt(-2.0 * std::log(u1));
    double z = (k & 1) ? r * std::sin(2 * M_PI * u2) : r * std::cos(2 * M_PI * u2);
    return mean + std * z;
  });
}

void RandomBernoulli(const TensorView& out, double p, uint64_t seed, uint64_t offset) {
  Generate(out, seed, offset, [&](const std::array<uint32_t, 4>& u, int k) { return ToUnit(u[k]) < p ? 1.0 : 0.0; });
}

}  // namespace kiln::host
