// Benchmark: conv2d of batch 256, 1->20 channels, 28x28, 3x3 kernel, stride 1, no padding
// (LeNet's first layer), float32, through kiln (eager Invoke1, then WaitToRead) against oneDNN
// called directly in the same process (primitive created once, then executed), both on plain
// NCHW / OIHW tensors. Prints JSON lines: ms and GFLOP/s of each, and the ratio
// onednn_ms / kiln_ms (above 1: kiln is ahead). --quick: fewer repeats, for CI smoke runs.
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
  kiln::bench::Emit("conv2d", c, metric, value, unit);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = kiln::bench::HasFlag(argc, argv, "--quick");
  // Many short alternating blocks: 20 timed runs of each (4 with --quick).
  const int rounds = quick ? 2 : 5, per_round = quick ? 2 : 4, warmup = 2;
  const int64_t N = 256, C = 1, H = 28, W = 28, O = 20, KH = 3, KW = 3, OH = H - KH + 1, OW = W - KW + 1;

  std::mt19937 gen(0);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(N * C * H * W), w(O * C * KH * KW), y(N * O * OH * OW);
  for (float& v : x) v = u(gen);
  for (float& v : w) v = u(gen);

  // kiln
  kiln::Tensor tx = kiln::Tensor::FromVector(x, {N, C, H, W}),
               tw = kiln::Tensor::FromVector(w, {O, C, KH, KW});
  auto run_kiln = [&] { kiln::Invoke1("conv2d", {tx, tw}).WaitToRead(); };

  // oneDNN directly, on the same plain layouts kiln passes.
  using dnnl::memory;
  using tag = memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  memory::desc xmd({N, C, H, W}, memory::data_type::f32, tag::nchw);
  memory::desc wmd({O, C, KH, KW}, memory::data_type::f32, tag::oihw);
  memory::desc ymd({N, O, OH, OW}, memory::data_type::f32, tag::nchw);
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                    xmd, wmd, ymd, {1, 1}, {0, 0}, {0, 0});
  dnnl::convolution_forward::primitive_desc pd(d, eng);
  dnnl::convolution_forward prim(pd);
  memory xm(xmd, eng, x.data()), wm(wmd, eng, w.data()), ym(ymd, eng, y.data());
  auto run_onednn = [&] {
    prim.execute(stream, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
    stream.wait();
  };

  auto [k, o] = kiln::bench::AlternatingMedianMs(rounds, warmup, per_round, run_kiln, run_onednn);
  double gflop = 2.0 * N * O * OH * OW * C * KH * KW * 1e-9;
  Emit("kiln", "ms", k, "ms");
  Emit("onednn", "ms", o, "ms");
  Emit("kiln", "gflops", gflop / (k * 1e-3), "GFLOP/s");
  Emit("onednn", "gflops", gflop / (o * 1e-3), "GFLOP/s");
  Emit("kiln/onednn", "speedup", o / k, "x");
  return 0;
}
