// Benchmark: a 1024x1024x1024 float32 matmul through kiln (eager Invoke1, then WaitToRead)
// against oneDNN called directly in the same process (primitive created once, then executed).
// Kiln's extra cost is dispatch, the engine hop, output allocation and the primitive-cache
// lookup. Prints JSON lines: ms and GFLOP/s of each, and the ratio onednn_ms / kiln_ms (above 1:
// kiln is ahead). --quick: fewer repeats, for CI smoke runs.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench_util.h"
#include "kiln/frontend/dispatch.h"

namespace {

using kiln::bench::Median;

void Emit(const char* c, const char* metric, double value, const char* unit) {
  kiln::bench::Emit("matmul", c, metric, value, unit);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = kiln::bench::HasFlag(argc, argv, "--quick");
  // Many short alternating blocks: 15 timed runs of each (4 with --quick).
  const int rounds = quick ? 2 : 5, per_round = quick ? 2 : 3, warmup = 1;
  const int64_t M = 1024, K = 1024, N = 1024;

  std::mt19937 gen(0);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(M * K), b(K * N), c(M * N);
  for (float& x : a) x = u(gen);
  for (float& x : b) x = u(gen);

  // kiln
  kiln::Tensor ta = kiln::Tensor::FromVector(a, {M, K}), tb = kiln::Tensor::FromVector(b, {K, N});
  auto run_kiln = [&] { kiln::Invoke1("matmul", {ta, tb}).WaitToRead(); };

  // oneDNN directly: plain row-major operands, as kiln passes them.
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  memory::desc amd({M, K}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc bmd({K, N}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc cmd({M, N}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), eng);
  dnnl::matmul prim(pd);
  memory am(amd, eng, a.data()), bm(bmd, eng, b.data()), cm(cmd, eng, c.data());
  auto run_onednn = [&] {
    prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  };

  auto [k, o] = kiln::bench::AlternatingMedianMs(rounds, warmup, per_round, run_kiln, run_onednn);
  double gflop = 2.0 * M * N * K * 1e-9;
  Emit("kiln", "ms", k, "ms");
  Emit("onednn", "ms", o, "ms");
  Emit("kiln", "gflops", gflop / (k * 1e-3), "GFLOP/s");
  Emit("onednn", "gflops", gflop / (o * 1e-3), "GFLOP/s");
  Emit("kiln/onednn", "speedup", o / k, "x");
  return 0;
}
