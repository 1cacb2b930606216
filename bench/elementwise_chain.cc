// y = relu(a*b + c) * 0.5 + a on float32 arrays, as one kernel JIT-compiled by codegen/ (LLVM ORC),
// against this machine's copy bandwidth measured in the same run (memcpy split across the same
// kiln threads). Bandwidth counts the bytes a kernel must move once: 3 inputs read + 1 output
// written for the chain, 1 read + 1 written for the copy. The target is a fraction >= 0.85: a
// memory-bound fused kernel should move bytes almost as fast as a copy does.
//
//   bench_elementwise_chain [--quick]     (16M floats; --quick: 1M)
// Without codegen (LLVM not found) it prints one "skipped" line.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_util.h"

#ifdef KILN_WITH_CODEGEN
#include "kiln/codegen/elementwise.h"
#include "kiln/runtime/cpu/loops.h"

namespace {

using kiln::bench::Emit;
using kiln::bench::Median;
using kiln::bench::TimeEachMs;

constexpr const char* kBench = "elementwise_chain";

std::vector<float> Filled(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<float>((i * 7919) % 1000 - 500) / 500.f;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = kiln::bench::HasFlag(argc, argv, "--quick");
  const int64_t n = quick ? (int64_t{1} << 20) : (int64_t{1} << 24);
  const int repeats = quick ? 10 : 20;

  kiln::codegen::Expr e;
  int a = e.Input(0), b = e.Input(1), c = e.Input(2);
  e.Add(e.Mul(e.Relu(e.Add(e.Mul(a, b), c)), e.Const(0.5)), a);
  auto kernel = kiln::codegen::CompileElementwise(e);
  Emit(kBench, "kiln", "compile_ms", kernel->compile_ms(), "ms");

  std::vector<float> x = Filled(n, 1.f), y = Filled(n, 2.f), z = Filled(n, 0.5f), out(static_cast<size_t>(n));
  const float* ins[] = {x.data(), y.data(), z.data()};
  double kiln_ms = Median(TimeEachMs(2, repeats, [&] { kernel->Run(ins, out.data(), n); }));

  // Spot check against the plain formula.
  for (int64_t i = 0; i < n; i += n / 97 + 1) {
    float r = x[i] * y[i] + z[i];
    float want = (r > 0 ? r : 0) * 0.5f + x[i];
    if (std::fabs(out[i] - want) > 1e-5f * (1 + std::fabs(want))) {
      std::fprintf(stderr, "elementwise_chain: wrong result at %lld: %g vs %g\n", static_cast<long long>(i), out[i], want);
      return 1;
    }
  }

  std::vector<float> dst(static_cast<size_t>(n));
  double copy_ms = Median(TimeEachMs(2, repeats, [&] {
    kiln::host::ParallelFor(n, int64_t{1} << 15, [&](int64_t lo, int64_t hi) {
      std::memcpy(dst.data() + lo, x.data() + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    });
  }));

  const double bytes = static_cast<double>(n) * sizeof(float);
  double kiln_gbs = 4 * bytes / (kiln_ms * 1e6);
  double copy_gbs = 2 * bytes / (copy_ms * 1e6);
  Emit(kBench, "kiln", "GB_per_s", kiln_gbs, "GB/s");
  Emit(kBench, "copy", "GB_per_s", copy_gbs, "GB/s");
  Emit(kBench, "kiln/copy", "fraction", kiln_gbs / copy_gbs, "ratio");
  return 0;
}

#else  // no codegen in this build

int main() {
  std::printf("{\"bench\": \"elementwise_chain\", \"case\": \"skipped\", \"metric\": \"none\", "
              "\"value\": 0, \"unit\": \"codegen not linked: LLVM 19.1 not found, or bench/CMakeLists.txt does not link kiln_codegen\"}\n");
  return 0;
}

#endif
