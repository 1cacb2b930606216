// The random generator (runtime/cpu/random.cc, the counter in frontend/dispatch.cc): Philox-4x32-10
// against the Random123 known-answer vector and an independent reference, reproducibility from
// the seed, and a stream that does not depend on how many threads fill a tensor. The
// distributions themselves are checked by the conformance cases of conformance_creation.cc.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/random.h"

using namespace kiln;

namespace {

/// Philox-4x32-10 as Random123 defines it (philox4x32round / philox4x32bumpkey), with counter
/// words (c0, c1, c2, c3) and key words (k0, k1); written independently of the implementation.
std::array<uint32_t, 4> ReferencePhilox(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  auto mulhilo = [](uint32_t a, uint32_t b, uint32_t* hi) {
    uint64_t p = static_cast<uint64_t>(a) * b;
    *hi = static_cast<uint32_t>(p >> 32);
    return static_cast<uint32_t>(p);
  };
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k = {k[0] + 0x9E3779B9u, k[1] + 0xBB67AE85u};
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c[0], &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c[2], &hi1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

std::vector<double> Draw(const char* op, int64_t n, ir::Attrs attrs) {
  attrs.items().emplace_back("shape", std::vector<int64_t>{n});
  return Invoke1(op, {}, attrs).ToVector<double>();
}

/// The kernels' map from a Philox word to [0, 1): its upper 24 bits.
double ToUnit(uint32_t x) { return (x >> 8) * (1.0 / 16777216.0); }

}  // namespace

TEST_CASE("random: Philox-4x32-10 known-answer vector") {
  // Random123 kat_vectors: philox4x32 10, counter 0 0 0 0, key 0 0.
  const std::array<uint32_t, 4> expected = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  CHECK(ReferencePhilox({0, 0, 0, 0}, {0, 0}) == expected);
  CHECK(host::Philox(0, 0) == expected);
  // The 64-bit key and counter are split low word first; the two upper counter words are 0.
  uint64_t s = 0x243f6a8885a308d3ull;
  for (int i = 0; i < 50; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t key = s ^ (s >> 29), counter = (s * 0x9E3779B97F4A7C15ull) >> (i % 40);
    CAPTURE(key);
    CAPTURE(counter);
    CHECK(host::Philox(key, counter) ==
          ReferencePhilox({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
                          {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)}));
  }
}

TEST_CASE("random: the same seed gives the same draws, different seeds different ones") {
  const ir::Attrs uniform = {{"dtype", DType::kFloat64}};
  ManualSeed(42);
  std::vector<double> a = Draw("random_uniform", 1000, uniform);
  std::vector<double> a2 = Draw("random_uniform", 1000, uniform);
  ManualSeed(42);
  std::vector<double> b = Draw("random_uniform", 1000, uniform);
  std::vector<double> b2 = Draw("random_uniform", 1000, uniform);
  CHECK(a == b);
  CHECK(a2 == b2);
  ManualSeed(43);
  std::vector<double> c = Draw("random_uniform", 1000, uniform);
  int same = 0, same_next = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i], same_next += a[i] == a2[i];
  CHECK_MESSAGE(same < 10, same << " of 1000 draws equal under seeds 42 and 43");
  CHECK_MESSAGE(same_next < 10, same_next << " of 1000 draws equal in two successive calls");

  // Every random op follows the seed.
  for (const char* op : {"random_normal", "random_bernoulli"}) {
    CAPTURE(op);
    ManualSeed(7);
    std::vector<double> x = Draw(op, 500, {});
    ManualSeed(7);
    CHECK(Draw(op, 500, {}) == x);
  }
}

TEST_CASE("random: draws follow the counter, independent of the thread count") {
  const uint64_t seed = 20240607;
  const int64_t n = 200000;  // 50000 Philox blocks: filled by several threads
  CAPTURE(host::NumThreads());

  SUBCASE("host kernel at a counter offset") {
    const uint64_t offset = 4 * 12345;
    std::vector<double> y(static_cast<size_t>(n));
    TensorView v{y.data(), DType::kFloat64, Shape{n}, Shape{1}};
    host::RandomUniform(v, 0.0, 1.0, seed, offset);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i) {
      double want = ToUnit(host::Philox(seed, offset / 4 + static_cast<uint64_t>(i / 4))[i % 4]);
      if (y[static_cast<size_t>(i)] != want && bad++ == 0) first = i;
    }
    CHECK_MESSAGE(bad == 0, bad << " elements differ from the Philox stream, first at " << first);

    // Filling the two halves separately, at their own counter offsets, gives the same values.
    std::vector<double> halves(static_cast<size_t>(n));
    TensorView lo{halves.data(), DType::kFloat64, Shape{n / 2}, Shape{1}};
    TensorView hi{halves.data() + n / 2, DType::kFloat64, Shape{n / 2}, Shape{1}};
    host::RandomUniform(lo, 0.0, 1.0, seed, offset);
    host::RandomUniform(hi, 0.0, 1.0, seed, offset + n / 2);
    CHECK(halves == y);
  }

  SUBCASE("through dispatch: the counter advances by whole blocks") {
    ManualSeed(seed);
    std::vector<double> first = Draw("random_uniform", 10, {{"dtype", DType::kFloat64}});  // counter 0..11
    std::vector<double> y =
        Draw("random_uniform", n, {{"dtype", DType::kFloat64}, {"low", -2.0}, {"high", 2.0}});
    for (int64_t i = 0; i < 10; ++i)
      CHECK(first[static_cast<size_t>(i)] == ToUnit(host::Philox(seed, static_cast<uint64_t>(i / 4))[i % 4]));
    const uint64_t offset = 12;
    int64_t bad = 0, at = -1;
    for (int64_t i = 0; i < n; ++i) {
      double want = -2.0 + 4.0 * ToUnit(host::Philox(seed, offset / 4 + static_cast<uint64_t>(i / 4))[i % 4]);
      if (y[static_cast<size_t>(i)] != want && bad++ == 0) at = i;
    }
    CHECK_MESSAGE(bad == 0, bad << " elements differ from the Philox stream, first at " << at);
  }

  SUBCASE("bernoulli compares the same uniform stream") {
    std::vector<double> y(static_cast<size_t>(n));
    TensorView v{y.data(), DType::kFloat64, Shape{n}, Shape{1}};
    host::RandomBernoulli(v, 0.25, seed, 0);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      double want = ToUnit(host::Philox(seed, static_cast<uint64_t>(i / 4))[i % 4]) < 0.25 ? 1.0 : 0.0;
      bad += y[static_cast<size_t>(i)] != want;
    }
    CHECK(bad == 0);
  }
}
