// GPU matmul through cuBLASLt beyond float32 (runtime/gpu_kernels_blas.cc, Platform::Gemm, the
// simulator's runtime/gpusim/sim_blas.cc):
// float16 and bfloat16 accumulate in float32 and round once, as the CPU kernel does (within one
// storage ulp: the two sum in different orders); float64 in float64; TF32 only with
// KILN_MATMUL_TF32=1 (relative error ~1e-3 instead of ~1e-6); cuBLASLt's bias + relu / GELU epilogue
// (gpurt::MatmulOnGpu) against the separate ops; broadcast batch dimensions; and compiled plans on
// a GPU binding matmul + bias + relu to one GEMM with its epilogue (the compile report's group).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_sim_util.h"
#include "gpu_skip.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/frontend/tracer.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "test_util.h"

namespace {

using namespace kiln;
using kiln::testing::ScopedEnv;

Tensor RandomTensor(const Shape& s, uint32_t seed, float lo = -1, float hi = 1) {
  return Tensor::FromVector(testing::Random(static_cast<size_t>(s.numel()), lo, hi, seed), s);
}

// Relative spacing of the storage type's values: one ulp is at most eps * |v|.
double Eps(DType t) {
  switch (t) {
  case DType::kFloat16: return std::ldexp(1.0, -10);
  case DType::kBFloat16: return std::ldexp(1.0, -7);
  case DType::kFloat64: return 1e-14;
  default: return 1e-6;
  }
}

// GPU and CPU results of one dtype agree within `ulps` of that dtype (relative to the larger
// magnitude, or to `floor` for values nearer zero: sums that cancel keep the error of their terms).
void CheckUlps(const Tensor& gpu_out, const Tensor& cpu_out, double ulps, const std::string& what, double floor = 1e-2) {
  INFO(what);
  REQUIRE(gpu_out.shape() == cpu_out.shape());
  REQUIRE(gpu_out.dtype() == cpu_out.dtype());
  const std::vector<double> g = gpu_out.To(cpu()).ToVector<double>(), c = cpu_out.ToVector<double>();
  const double eps = Eps(cpu_out.dtype());
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i)
    worst = std::max(worst, std::abs(g[i] - c[i]) / (eps * std::max({std::abs(g[i]), std::abs(c[i]), floor})));
  CHECK(worst <= ulps);
}

// cuBLASLt's GELU: the tanh approximation.
double GeluTanh(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// gpurt::MatmulOnGpu as an engine task on gpu(0): x (M x K), w (N x K: transpose_b), bias (N).
Tensor MatmulEpilogue(const Tensor& x, const Tensor& w, const Tensor& bias, gpurt::GemmActivation act) {
  const Shape s({x.shape()[0], w.shape()[0]});
  Tensor y = Tensor::Empty(s, x.dtype(), gpu(0));
  std::vector<engine::Var*> reads = {x.storage()->var(), w.storage()->var()};
  if (bias.defined()) reads.push_back(bias.storage()->var());
  engine::Var* writes[] = {y.storage()->var()};
  engine::TaskOptions o;
  o.device = gpu(0);
  o.name = "matmul_epilogue";
  engine::Engine::Get().Push(
      [x, w, bias, y, act] {
        const TensorView b = bias.defined() ? bias.View() : TensorView{};
        gpurt::MatmulOnGpu(x.View(), w.View(), y.View(), false, true, bias.defined() ? &b : nullptr, act);
      },
      reads, writes, o);
  return y;
}

}  // namespace

TEST_CASE("gpu: gemm float16 and bfloat16 matmul (float32 accumulation) match the CPU kernel") {
  KILN_REQUIRE_GPU();
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{7, 33}, {33, 5}, false, false}, {{33, 7}, {33, 5}, true, false}, {{7, 33}, {5, 33}, false, true},
      {{33, 7}, {5, 33}, true, true},   {{2, 3, 4, 8}, {3, 8, 6}, false, false}, {{1, 64}, {64, 1}, false, false},
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      Tensor a = nd::cast(RandomTensor(c.a, static_cast<uint32_t>(10 + i)), dt);
      Tensor b = nd::cast(RandomTensor(c.b, static_cast<uint32_t>(20 + i)), dt);
      Tensor on_cpu = nd::matmul(a, b, c.ta, c.tb);
      Tensor on_gpu = nd::matmul(a.To(gpu(0)), b.To(gpu(0)), c.ta, c.tb);
      CHECK(on_gpu.dtype() == dt);
      // One rounding of a float32 (float64) sum each; the sums' orders differ, so a result may
      // round to the neighbouring value: one ulp apart at most.
      CheckUlps(on_gpu, on_cpu, dt == DType::kFloat64 ? 100 : 1.01,
                std::string(DTypeName(dt)) + " case " + std::to_string(i));
    }
  }
  // Not a product of float32 values rounded afterwards only by chance: the float16 result differs
  // from the float32 product of the same (float16) inputs by the storage rounding, and no more.
  Tensor a = nd::cast(RandomTensor({16, 40}, 1), DType::kFloat16), b = nd::cast(RandomTensor({40, 16}, 2), DType::kFloat16);
  const std::vector<double> h = nd::matmul(a.To(gpu(0)), b.To(gpu(0))).To(cpu()).ToVector<double>();
  const std::vector<double> f = nd::matmul(nd::cast(a, DType::kFloat32), nd::cast(b, DType::kFloat32)).ToVector<double>();
  double worst = 0;
  int rounded = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    worst = std::max(worst, std::abs(h[i] - f[i]) / std::max(std::abs(f[i]), 1e-3));
    rounded += h[i] != f[i];
  }
  CHECK(worst <= std::ldexp(1.0, -11) * 1.01);  // half an ulp of float16
  CHECK(rounded > static_cast<int>(h.size()) / 2);
}

TEST_CASE("gpu: gemm integer operands are a DTypeError (matmul takes floats on every device)") {
  KILN_REQUIRE_GPU();
  Tensor a = nd::cast(RandomTensor({3, 4}, 3, 0, 5), DType::kInt32).To(gpu(0));
  Tensor b = nd::cast(RandomTensor({4, 2}, 4, 0, 5), DType::kInt32).To(gpu(0));
  CHECK_THROWS_AS(nd::matmul(a, b), DTypeError);
}

TEST_CASE("gpu: gemm float32 runs on TF32 only with KILN_MATMUL_TF32=1 (relative error ~1e-3 instead of ~1e-6)") {
  KILN_REQUIRE_GPU();
  const int64_t M = 24, K = 512, N = 20;
  Tensor a = RandomTensor({M, K}, 5), b = RandomTensor({K, N}, 6);
  const std::vector<double> av = a.ToVector<double>(), bv = b.ToVector<double>();
  // The worst error relative to sum |a_ik b_kj| (no cancellation in the scale).
  auto worst_error = [&](const Tensor& out) {
    const std::vector<double> c = out.To(cpu()).ToVector<double>();
    double worst = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double exact = 0, scale = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += av[static_cast<size_t>(i * K + k)] * bv[static_cast<size_t>(k * N + j)];
          scale += std::abs(av[static_cast<size_t>(i * K + k)] * bv[static_cast<size_t>(k * N + j)]);
        }
        worst = std::max(worst, std::abs(c[static_cast<size_t>(i * N + j)] - exact) / scale);
      }
    return worst;
  };
  Tensor ga = a.To(gpu(0)), gb = b.To(gpu(0));
  const double full = worst_error(nd::matmul(ga, gb));
  double tf32 = 0;
  {
    ScopedEnv on("KILN_MATMUL_TF32", "1");
    tf32 = worst_error(nd::matmul(ga, gb));
  }
  const double after = worst_error(nd::matmul(ga, gb));
  // One product (k = 1): float32 rounds it once (2^-24), TF32 rounds both inputs to 11
  // significant bits first (up to 2^-11 each): up to ~9.8e-4 relative. TF32 allows tensor cores,
  // it does not demand them: for k = 1 cuBLASLt may take a plain float32 kernel (it did on an
  // H200: 5.9e-8), so only the bound is checked there; k = 512 above shows TF32 at work.
  Tensor ca = RandomTensor({64, 1}, 11).To(gpu(0)), cb = RandomTensor({1, 64}, 12).To(gpu(0));
  auto outer_error = [&](const Tensor& out) {
    const std::vector<double> c = out.To(cpu()).ToVector<double>();
    const std::vector<double> x = ca.To(cpu()).ToVector<double>(), y = cb.To(cpu()).ToVector<double>();
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t j = 0; j < y.size(); ++j)
        worst = std::max(worst, std::abs(c[i * y.size() + j] - x[i] * y[j]) / std::abs(x[i] * y[j]));
    return worst;
  };
  const double outer_full = outer_error(nd::matmul(ca, cb));
  double outer_tf32 = 0;
  {
    ScopedEnv on("KILN_MATMUL_TF32", "1");
    outer_tf32 = outer_error(nd::matmul(ca, cb));
  }
  MESSAGE("worst relative error over k = 512 (of sum |a b|): float32 " << full << ", TF32 " << tf32
                                                                        << "; of single products: float32 " << outer_full
                                                                        << ", TF32 " << outer_tf32);
  CHECK(full < 2e-6);
  CHECK(after == full);  // back to full float32 once the switch is gone
  CHECK(tf32 > 10 * full);
  CHECK(tf32 < 1e-3);
  CHECK(outer_full < 1.2e-7);
  CHECK(outer_tf32 < 1e-3);
  {
    ScopedEnv bad("KILN_MATMUL_TF32", "2");
    CHECK_THROWS_WITH_AS(nd::matmul(ga, gb).To(cpu()).ToVector<float>(), doctest::Contains("expected 0"), ValueError);
  }
  // Only float32 is affected: a float16 product is the same either way.
  Tensor ha = nd::cast(a, DType::kFloat16).To(gpu(0)), hb = nd::cast(b, DType::kFloat16).To(gpu(0));
  const std::vector<float> h0 = nd::matmul(ha, hb).To(cpu()).ToVector<float>();
  ScopedEnv on("KILN_MATMUL_TF32", "1");
  CHECK(nd::matmul(ha, hb).To(cpu()).ToVector<float>() == h0);
}

TEST_CASE("gpu: gemm epilogue (bias, relu, GELU) matches the separate ops") {
  KILN_REQUIRE_GPU();
  const int64_t M = 9, K = 31, N = 13;
  Tensor x = RandomTensor({M, K}, 7), w = RandomTensor({N, K}, 8), bias = RandomTensor({N}, 9);
  Tensor gx = x.To(gpu(0)), gw = w.To(gpu(0)), gb = bias.To(gpu(0));
  using A = gpurt::GemmActivation;
  const Tensor pre = nd::linear(x, w, bias);  // the CPU's matmul + bias
  const std::vector<double> pv = pre.ToVector<double>();

  CheckUlps(MatmulEpilogue(gx, gw, gb, A::kNone), pre, 10, "bias", 1);
  CheckUlps(MatmulEpilogue(gx, gw, gb, A::kRelu), nd::relu(pre), 10, "bias + relu", 1);
  CheckUlps(MatmulEpilogue(gx, gw, Tensor(), A::kRelu), nd::relu(nd::matmul(x, w, false, true)), 10, "relu, no bias", 1);
  // GELU is cuBLASLt's tanh approximation; kiln's nd::gelu is the exact x * Phi(x): they differ by
  // less than 5e-4 (here measured).
  const std::vector<double> gelu = MatmulEpilogue(gx, gw, gb, A::kGelu).To(cpu()).ToVector<double>();
  const std::vector<double> exact = nd::gelu(pre).ToVector<double>();
  double worst_tanh = 0, worst_exact = 0;
  for (size_t i = 0; i < pv.size(); ++i) {
    worst_tanh = std::max(worst_tanh, std::abs(gelu[i] - GeluTanh(pv[i])));
    worst_exact = std::max(worst_exact, std::abs(gelu[i] - exact[i]));
  }
  MESSAGE("GELU epilogue vs tanh form " << worst_tanh << ", vs kiln's exact gelu " << worst_exact);
  CHECK(worst_tanh < 1e-5);
  CHECK(worst_exact < 5e-4);
  CHECK(worst_exact > worst_tanh);  // the forms do differ

  // float16: one rounding at the end, the separate ops round the product first (half an ulp of
  // the product, whose magnitude is about 1 here) and the sum again.
  Tensor hx = nd::cast(x, DType::kFloat16), hw = nd::cast(w, DType::kFloat16), hb = nd::cast(bias, DType::kFloat16);
  CheckUlps(MatmulEpilogue(hx.To(gpu(0)), hw.To(gpu(0)), hb.To(gpu(0)), A::kRelu), nd::relu(nd::linear(hx, hw, hb)),
            2.01, "float16 bias + relu", 1);

  // Refusals: a bias of the wrong length, an epilogue without a product (k == 0).
  CHECK_THROWS_WITH_AS(MatmulEpilogue(gx, gw, RandomTensor({N + 1}, 1).To(gpu(0)), A::kRelu).To(cpu()).ToVector<float>(),
                       doctest::Contains("the bias must hold 13"), ShapeError);
  Tensor ex = Tensor::Empty(Shape({M, 0}), DType::kFloat32, gpu(0)), ew = Tensor::Empty(Shape({N, 0}), DType::kFloat32, gpu(0));
  CHECK_THROWS_WITH(MatmulEpilogue(ex, ew, gb, A::kRelu).To(cpu()).ToVector<float>(),
                    doctest::Contains("CUBLAS_STATUS_NOT_SUPPORTED (15): an epilogue (bias, activation relu) needs a product"));
}

TEST_CASE("gpu: gemm batched matmul with broadcast batch dimensions matches the CPU") {
  KILN_REQUIRE_GPU();
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{3, 4, 5}, {3, 5, 6}, false, false},        // equal batches: one strided-batched GEMM
      {{2, 1, 4, 5}, {3, 5, 6}, false, false},     // broadcast on both sides: one GEMM per entry
      {{4, 5}, {2, 3, 5, 6}, false, false},        // a repeated (stride 0)
      {{2, 3, 5, 4}, {1, 6, 5}, true, true},       // b repeated, both transposed
      {{1, 3, 4, 5}, {2, 1, 6, 5}, false, true},   // both sides again
  };
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      Tensor a = nd::cast(RandomTensor(c.a, static_cast<uint32_t>(30 + i)), dt);
      Tensor b = nd::cast(RandomTensor(c.b, static_cast<uint32_t>(40 + i)), dt);
      CheckUlps(nd::matmul(a.To(gpu(0)), b.To(gpu(0)), c.ta, c.tb), nd::matmul(a, b, c.ta, c.tb),
                dt == DType::kFloat32 ? 10 : 1.01, std::string(DTypeName(dt)) + " case " + std::to_string(i));
    }
  }
}

namespace {

std::shared_ptr<CachedGraph> TraceOnGpu(const std::function<Tensor(const Tensor&)>& f, const Tensor& example) {
  trace::TraceScope scope;
  Tensor in = scope.Input("data", example.shape(), example.dtype(), gpu(0));
  return scope.Finish({f(in)});
}

// The report's groups of the forward plan whose expression starts with `prefix`.
std::vector<CompileReport::Group> GroupsOf(const CachedGraph& g, const std::string& prefix) {
  std::vector<CompileReport::Group> out;
  for (const CompileReport::PlanReport& plan : g.compile_report().plans)
    for (const CompileReport::Group& group : plan.groups)
      if (group.expr.rfind(prefix, 0) == 0) out.push_back(group);
  return out;
}

}  // namespace

TEST_CASE("gpu: gemm a hybridized Dense(relu) runs as one cuBLASLt GEMM with its bias + relu epilogue") {
  KILN_REQUIRE_GPU();
  Tensor w = RandomTensor({16, 8}, 50).To(gpu(0)), b = RandomTensor({16}, 51).To(gpu(0));
  Tensor x = RandomTensor({5, 8}, 52).To(gpu(0));
  auto dense = [&](const Tensor& in) { return nd::relu(nd::linear(in, w, b)); };
  auto g = TraceOnGpu(dense, x);
  for (int call = 0; call < 3; ++call) {  // plain launches, then a captured CUDA graph, then its replay
    Tensor xi = RandomTensor({5, 8}, static_cast<uint32_t>(60 + call)).To(gpu(0));
    Tensor eager = dense(xi), compiled = g->Call({xi})[0];
    CheckUlps(compiled, eager, 10, "call " + std::to_string(call), 1);
    // and the CPU's separate ops
    CheckUlps(compiled, nd::relu(nd::linear(xi.To(cpu()), w.To(cpu()), b.To(cpu()))), 10, "vs CPU", 1);
  }
  const std::vector<CompileReport::Group> gemm = GroupsOf(*g, "cuBLASLt");
  REQUIRE(gemm.size() == 1);
  CHECK(gemm[0].expr == "cuBLASLt matmul(in0, in1) epilogue: bias(in2), relu");
  CHECK(gemm[0].ops == std::vector<std::string>{"matmul", "add", "relu"});
  CHECK(gemm[0].num_inputs == 3);
  const CompileReport report = g->compile_report();
  CHECK(report.plans[0].fusion == "1 group of 3 ops (GPU: elementwise groups; 1 on cuBLASLt epilogues)");
  CHECK(report.plans[0].kernels_after == 1);
  CHECK(report.str().find("cuBLASLt matmul(in0, in1) epilogue: bias(in2), relu") != std::string::npos);

  // Switched off (KILN_DISABLE_PASS=epilogue): the same numbers from a GEMM and an elementwise kernel.
  {
    ScopedEnv off("KILN_DISABLE_PASS", "epilogue");
    auto unfused = TraceOnGpu(dense, x);
    CheckUlps(unfused->Call({x})[0], g->Call({x})[0], 10, "epilogue pass off", 1);
    CHECK(GroupsOf(*unfused, "cuBLASLt").empty());
  }
}

TEST_CASE("gpu: gemm plans fuse only what cuBLASLt's epilogue expresses, and the rest stays correct") {
  KILN_REQUIRE_GPU();
  Tensor w = RandomTensor({12, 6}, 70).To(gpu(0)), b = RandomTensor({12}, 71).To(gpu(0));
  Tensor x = RandomTensor({4, 6}, 72).To(gpu(0)), r = RandomTensor({4, 12}, 73).To(gpu(0));
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    const char* expr;  // the cuBLASLt group, or "" for none
  };
  const std::vector<Case> cases = {
      {"linear without activation", [&](const Tensor& in) { return nd::linear(in, w, b); },
       "cuBLASLt matmul(in0, in1) epilogue: bias(in2)"},
      {"matmul + relu, no bias", [&](const Tensor& in) { return nd::relu(nd::matmul(in, w, false, true)); },
       "cuBLASLt matmul(in0, in1) epilogue: relu"},
      // a residual add after the relu: the GEMM takes bias + relu, the add runs on its own
      {"bias + relu + residual", [&](const Tensor& in) { return nd::add(nd::relu(nd::linear(in, w, b)), r); },
       "cuBLASLt matmul(in0, in1) epilogue: bias(in2), relu"},
      // a same-shape add is no bias: nothing for cuBLASLt
      {"same-shape add", [&](const Tensor& in) { return nd::relu(nd::add(nd::matmul(in, w, false, true), r)); }, ""},
      // kiln's gelu is exact (x * Phi(x), a tree reading x twice): the GEMM takes the bias, the
      // gelu stays an elementwise group (cuBLASLt's tanh GELU would change the numbers)
      {"gelu", [&](const Tensor& in) { return nd::gelu(nd::linear(in, w, b)); },
       "cuBLASLt matmul(in0, in1) epilogue: bias(in2)"},
      // float16: the compiled-plan epilogue is float32 only
      {"float16", [&](const Tensor& in) {
         return nd::relu(nd::linear(nd::cast(in, DType::kFloat16), nd::cast(w, DType::kFloat16), nd::cast(b, DType::kFloat16)));
       }, ""},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    auto g = TraceOnGpu(c.f, x);
    Tensor eager = c.f(x), compiled = g->Call({x})[0];
    CheckUlps(compiled, eager, compiled.dtype() == DType::kFloat16 ? 2.01 : 10, c.name, 1);
    const std::vector<CompileReport::Group> gemm = GroupsOf(*g, "cuBLASLt");
    if (std::string(c.expr).empty()) {
      CHECK(gemm.empty());
    } else {
      REQUIRE(gemm.size() == 1);
      CHECK(gemm[0].expr == c.expr);
    }
  }
}

namespace {

// Device memory of the current simulated device holding `bytes` of `host`.
struct Buffer {
  Buffer(const void* host, size_t bytes, gpurt::Stream s) : n(bytes) {
    p = testing::Sim().Malloc(bytes);
    testing::Sim().MemcpyAsync(p, host, bytes, gpurt::CopyKind::kHostToDevice, s);
  }
  ~Buffer() { testing::Sim().Free(p); }
  template <class T>
  std::vector<T> Read(gpurt::Stream s) const {
    std::vector<T> h(n / sizeof(T));
    testing::Sim().MemcpyAsync(h.data(), p, n, gpurt::CopyKind::kDeviceToHost, s);
    return h;
  }
  void* p;
  size_t n;
};

}  // namespace

TEST_CASE("gpu: gemm Platform::Gemm in float64 with beta, bias and GELU, 16-bit extents, epilogue checks") {
  gpurt::Platform& p = testing::Sim();
  gpurt::DeviceGuard dg(0, p);
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kBlasLt, s);
  // float64, column-major: C (m x n) = gelu(alpha A^T B + beta C + bias), A stored k x m.
  const int64_t m = 5, n = 4, k = 7;
  std::vector<double> a(static_cast<size_t>(k * m)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n)),
      bias(static_cast<size_t>(m));
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.7 * static_cast<double>(i)) + 1e-9;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.3 * static_cast<double>(i));
  for (size_t i = 0; i < c.size(); ++i) c[i] = 0.1 * static_cast<double>(i) - 1;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25 * static_cast<double>(i) - 0.5;
  Buffer da(a.data(), a.size() * 8, s), db(b.data(), b.size() * 8, s), dc(c.data(), c.size() * 8, s),
      dbias(bias.data(), bias.size() * 8, s);
  gpurt::GemmArgs g;
  g.dtype = DType::kFloat64;
  g.transa = gpurt::BlasOp::kT, g.m = m, g.n = n, g.k = k;
  g.a = da.p, g.lda = k, g.b = db.p, g.ldb = k, g.c = dc.p, g.ldc = m;
  g.alpha = 1.5f, g.beta = 0.5f, g.bias = dbias.p, g.act = gpurt::GemmActivation::kGelu;
  p.Gemm(h, s, g);
  const std::vector<double> got = dc.Read<double>(s);
  double worst = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += a[static_cast<size_t>(l + i * k)] * b[static_cast<size_t>(l + j * k)];
      const double want = GeluTanh(1.5 * acc + 0.5 * c[static_cast<size_t>(i + j * m)] + bias[static_cast<size_t>(i)]);
      worst = std::max(worst, std::abs(got[static_cast<size_t>(i + j * m)] - want));
    }
  CHECK(worst < 1e-13);  // double throughout: the float product would be ~1e-7 off

  // float16 operands are 2-byte elements: C with ldc = 83 spans 3 * 83 + 5 = 254 halves (508
  // bytes) of a 512-byte block, inside; with ldc = 86, 263 halves (526 bytes), past it.
  std::vector<Half> ha(static_cast<size_t>(m * k), Half(0.5f)), hb(static_cast<size_t>(k * n), Half(2.0f));
  std::vector<Half> hbias(static_cast<size_t>(m), Half(-3.0f)), hc(256, Half(-1.0f));
  Buffer dha(ha.data(), ha.size() * 2, s), dhb(hb.data(), hb.size() * 2, s), dhc(hc.data(), hc.size() * 2, s);
  Buffer dhbias(hbias.data(), hbias.size() * 2, s);
  gpurt::GemmArgs hg;
  hg.dtype = DType::kFloat16;
  hg.m = m, hg.n = n, hg.k = k, hg.a = dha.p, hg.lda = m, hg.b = dhb.p, hg.ldb = k, hg.c = dhc.p, hg.ldc = 83;
  hg.bias = dhbias.p, hg.act = gpurt::GemmActivation::kRelu;
  p.Gemm(h, s, hg);
  const std::vector<Half> hout = dhc.Read<Half>(s);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < 83 && j * 83 + i < 256; ++i)  // relu(7 * 0.5 * 2 - 3) = 4 inside C, -1 between columns
      CHECK(static_cast<float>(hout[static_cast<size_t>(j * 83 + i)]) == (i < m ? 4.0f : -1.0f));
  gpurt::GemmArgs over = hg;
  over.ldc = 86;
  CHECK(testing::CodeOf([&] { p.Gemm(h, s, over); }) == gpurt::kIllegalAddress);
  gpurt::GemmArgs host_bias = hg;
  host_bias.bias = hbias.data();
  try {
    p.Gemm(h, s, host_bias);
    FAIL("no error for a host bias");
  } catch (const gpurt::GpuError& e) {
    CHECK(e.code() == gpurt::kIllegalAddress);
    CHECK(std::string(e.what()).find("the bias is host memory") != std::string::npos);
  }
  // What cuBLASLt is not asked for here: integer data, an unknown activation.
  gpurt::GemmArgs ints = hg;
  ints.dtype = DType::kInt32;
  CHECK(testing::CodeOf([&] { p.Gemm(h, s, ints); }) == gpurt::kBlasNotSupported);
  gpurt::GemmArgs odd = hg;
  odd.act = static_cast<gpurt::GemmActivation>(9);
  CHECK(testing::CodeOf([&] { p.Gemm(h, s, odd); }) == gpurt::kBlasNotSupported);
  p.StreamSynchronize(s);
  p.StreamDestroy(s);
}
