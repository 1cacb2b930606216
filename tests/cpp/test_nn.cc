// Tests of the neural-network ops beyond the conformance table: sizes where oneDNN takes its fast
// paths (checked against naive double loops), the oneDNN path and the hand-written kernels
// against the plain-loop kernels for every NN kernel, the primitive cache, 16-bit dtypes, and
// the exact user errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <typeinfo>

#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/cpu/direct_nn.h"
#include "kiln/runtime/cpu/onednn.h"
#include "test_util.h"

using namespace kiln;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;
using kiln::testing::Contains;

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

/// Largest |a - b| / (atol + rtol * |b|); at most 1 means within tolerance.
double MaxError(const std::vector<float>& a, const std::vector<double>& b, double rtol, double atol) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (atol + rtol * std::abs(b[i])));
  return worst;
}


} // namespace

TEST_CASE("nn: matmul 256x512 @ 512x128 float32 matches a double loop") {
  const int64_t M = 256, K = 512, N = 128;
  std::vector<float> a = Random(M * K, 1), b = Random(K * N, 2);
  Tensor c = Invoke1("matmul", {Tensor::FromVector(a, {M, K}), Tensor::FromVector(b, {K, N})});
  CHECK(c.shape() == Shape{M, N});
  std::vector<double> ref(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) ref[i * N + j] += double(a[i * K + k]) * b[k * N + j];
  CHECK(MaxError(c.ToVector<float>(), ref, 1e-4, 1e-4) <= 1.0);
}

TEST_CASE("nn: conv2d LeNet shape (8,1,28,28) * (20,1,3,3) matches naive loops") {
  const int64_t N = 8, O = 20, H = 28, W = 28, OH = 26, OW = 26;
  std::vector<float> x = Random(N * H * W, 3), w = Random(O * 9, 4);
  Tensor y = Invoke1("conv2d", {Tensor::FromVector(x, {N, 1, H, W}), Tensor::FromVector(w, {O, 1, 3, 3})});
  CHECK(y.shape() == Shape{N, O, OH, OW});
  std::vector<double> ref(N * O * OH * OW, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j)
          for (int64_t kh = 0; kh < 3; ++kh)
            for (int64_t kw = 0; kw < 3; ++kw)
              ref[((n * O + o) * OH + i) * OW + j] +=
                  double(x[(n * H + i + kh) * W + j + kw]) * w[o * 9 + kh * 3 + kw];
  CHECK(MaxError(y.ToVector<float>(), ref, 1e-4, 1e-5) <= 1.0);
}

// oneDNN 2.6's weight gradient of a strided 1x1 convolution wrote past its scratchpad with more
// than 8 threads (heap corruption on a 16-core machine); kiln computes it over the subsampled
// input instead, and guards every scratchpad. CTest runs this case again with
// KILN_NUM_THREADS=16 ("threads16: "), where it failed before either fix.
TEST_CASE("nn: strided 1x1 convolution gradients on many threads match the plain loops") {
  auto view = [](std::vector<float>& v, Shape s) {
    return TensorView{v.data(), DType::kFloat32, s, s.ContiguousStrides()};
  };
  struct Case {
    Shape x;
    int64_t o, stride_h, stride_w, groups;
  };
  for (const Case& c : {Case{{8, 4, 28, 28}, 8, 2, 2, 1}, Case{{10, 3, 28, 28}, 30, 2, 2, 1},
                        Case{{20, 11, 24, 24}, 21, 2, 2, 1}, Case{{2, 4, 9, 7}, 6, 3, 2, 2},
                        Case{{32, 4, 28, 28}, 8, 2, 2, 1}, Case{{1, 16, 8, 8}, 16, 2, 1, 1}}) {
    host::Conv2dParams p;
    p.stride[0] = c.stride_h, p.stride[1] = c.stride_w, p.groups = c.groups;
    const Shape ws{c.o, c.x[1] / c.groups, 1, 1};
    const Shape ys{c.x[0], c.o, (c.x[2] - 1) / c.stride_h + 1, (c.x[3] - 1) / c.stride_w + 1};
    std::vector<float> x = Random(c.x.numel(), 11), dy = Random(ys.numel(), 12), w = Random(ws.numel(), 13);
    INFO("x " << c.x.str() << " -> " << c.o << " channels, stride " << c.stride_h << "x" << c.stride_w);
    for (int pass = 0; pass < 3; ++pass) {  // the primitive again, from the cache
      std::vector<float> fast(ws.numel(), 7.f), slow(ws.numel(), -7.f);
      host::Conv2dGradWeight(view(dy, ys), view(x, c.x), view(fast, ws), p);
      host::reference::Conv2dGradWeight(view(dy, ys), view(x, c.x), view(slow, ws), p);
      CHECK(MaxError(fast, std::vector<double>(slow.begin(), slow.end()), 1e-4, 1e-5) <= 1.0);
      std::vector<float> dx_fast(c.x.numel(), 7.f), dx_slow(c.x.numel(), -7.f);
      host::Conv2dGradData(view(dy, ys), view(w, ws), view(dx_fast, c.x), p);
      host::reference::Conv2dGradData(view(dy, ys), view(w, ws), view(dx_slow, c.x), p);
      CHECK(MaxError(dx_fast, std::vector<double>(dx_slow.begin(), dx_slow.end()), 1e-4, 1e-5) <= 1.0);
    }
  }
}

// The oneDNN path (float32) against the plain loops (the same kernels' reference) on geometries
// with strides, padding, dilation, groups, broadcast batch dims and transposes.
TEST_CASE("nn: every oneDNN kernel agrees with the plain-loop kernel") {
  auto view = [](std::vector<float>& v, Shape s) {
    return TensorView{v.data(), DType::kFloat32, s, s.ContiguousStrides()};
  };
  auto compare = [&](const char* what, Shape out, const std::function<void(const TensorView&, bool)>& run) {
    std::vector<float> fast(out.numel(), 7.f), slow(out.numel(), -7.f);
    run(view(fast, out), true);
    run(view(slow, out), false);
    std::vector<double> ref(slow.begin(), slow.end());
    INFO(what);
    CHECK(MaxError(fast, ref, 1e-4, 1e-5) <= 1.0);
  };

  struct MM {
    Shape a, b, c;
    bool ta, tb;
  };
  for (const MM& m :
       {MM{{37, 19}, {19, 23}, {37, 23}, false, false}, MM{{19, 37}, {23, 19}, {37, 23}, true, true},
        MM{{3, 1, 8, 5}, {4, 8, 6}, {3, 4, 5, 6}, true, false},
        MM{{2, 5, 8}, {6, 8}, {2, 5, 6}, false, true}}) {
    std::vector<float> a = Random(m.a.numel(), 5), b = Random(m.b.numel(), 6);
    compare("matmul", m.c, [&](const TensorView& out, bool fast) {
      host::MatmulParams p{m.ta, m.tb};
      (fast ? host::Matmul : host::reference::Matmul)(view(a, m.a), view(b, m.b), out, p);
    });
  }

  host::Conv2dParams cp;
  cp.stride[0] = 2;
  cp.padding[0] = 1;
  cp.padding[1] = 2;
  cp.dilation[1] = 2;
  cp.groups = 2;
  Shape xs{3, 4, 11, 9}, ws{6, 2, 3, 3}, ys{3, 6, 6, 9};
  std::vector<float> x = Random(xs.numel(), 7), w = Random(ws.numel(), 8), dy = Random(ys.numel(), 9);
  compare("conv2d", ys, [&](const TensorView& out, bool fast) {
    (fast ? host::Conv2d : host::reference::Conv2d)(view(x, xs), view(w, ws), out, cp);
  });
  compare("conv2d_grad_data", xs, [&](const TensorView& out, bool fast) {
    (fast ? host::Conv2dGradData : host::reference::Conv2dGradData)(view(dy, ys), view(w, ws), out, cp);
  });
  compare("conv2d_grad_weight", ws, [&](const TensorView& out, bool fast) {
    (fast ? host::Conv2dGradWeight : host::reference::Conv2dGradWeight)(view(dy, ys), view(x, xs), out, cp);
  });

  host::Pool2dParams pp;
  pp.kernel[0] = pp.kernel[1] = 3;
  pp.stride[0] = pp.stride[1] = 2;
  pp.padding[0] = pp.padding[1] = 1;
  Shape ps{3, 4, 11, 9}, po{3, 4, 6, 5};
  std::vector<float> pdy = Random(po.numel(), 10);
  for (bool include_pad : {true, false}) {
    pp.count_include_pad = include_pad;
    compare("avg_pool2d", po, [&](const TensorView& out, bool fast) {
      (fast ? host::AvgPool2d : host::reference::AvgPool2d)(view(x, ps), out, pp);
    });
    compare("avg_pool2d_grad", ps, [&](const TensorView& out, bool fast) {
      (fast ? host::AvgPool2dGrad : host::reference::AvgPool2dGrad)(view(pdy, po), out, pp);
    });
  }
  compare("max_pool2d", po, [&](const TensorView& out, bool fast) {
    (fast ? host::MaxPool2d : host::reference::MaxPool2d)(view(x, ps), out, pp);
  });
  compare("max_pool2d_grad", ps, [&](const TensorView& out, bool fast) {
    (fast ? host::MaxPool2dGrad : host::reference::MaxPool2dGrad)(view(pdy, po), view(x, ps), out, pp);
  });
}

// The fast paths of nn_dispatch.cc beyond oneDNN on plain layouts, against the plain loops: the
// hand-written kernels of direct_nn.h (one-input-channel convolutions, tiling average pooling)
// and the channels-last oneDNN convolutions (four or more input channels per group), on shapes
// with partial vectors, padding, overlapping last vectors and rows narrower than a vector.
TEST_CASE("nn: hand-written and channels-last kernels agree with the plain-loop kernel") {
  auto view = [](std::vector<float>& v, const Shape& s) {
    return TensorView{v.data(), DType::kFloat32, s, s.ContiguousStrides()};
  };
  // Runs `fast` and `slow` into outputs of shape `out` (prefilled with garbage) and compares.
  auto compare = [&](const std::string& what, const Shape& out,
                     const std::function<void(const TensorView&)>& fast,
                     const std::function<void(const TensorView&)>& slow) {
    std::vector<float> f(out.numel(), 7.f), s(out.numel(), -7.f);
    fast(view(f, out));
    slow(view(s, out));
    INFO(what);
    // Both sides sum up to ~1250 float products in different orders (and with or without FMA,
    // as -march=native decides): 5e-5 absolute covers that on outputs of magnitude ~10.
    CHECK(MaxError(f, std::vector<double>(s.begin(), s.end()), 1e-4, 5e-5) <= 1.0);
  };
  struct Conv {
    Shape x, w;
    int64_t stride, pad_h, pad_w, dilation, groups;
    bool direct; // the hand-written kernels take it
  };
  for (const Conv& c :
       {Conv{{3, 1, 28, 28}, {20, 1, 3, 3}, 1, 0, 0, 1, 1, true},    // LeNet's first layer
        Conv{{2, 1, 10, 7}, {5, 1, 5, 5}, 1, 2, 2, 1, 1, true},      // rows narrower than a vector
        Conv{{2, 1, 40, 37}, {11, 1, 3, 4}, 1, 1, 0, 1, 1, true},    // 3 vectors a row, the last overlapping
        Conv{{1, 1, 5, 5}, {3, 1, 5, 5}, 1, 0, 0, 1, 1, true},       // one output per plane
        Conv{{2, 1, 9, 9}, {4, 1, 3, 3}, 2, 1, 1, 1, 1, false},      // strided: oneDNN
        Conv{{4, 20, 13, 13}, {50, 20, 5, 5}, 1, 0, 0, 1, 1, false}, // LeNet's second layer
        Conv{{2, 12, 9, 8}, {6, 4, 3, 3}, 2, 1, 1, 1, 3, false},     // grouped channels-last
        Conv{{2, 8, 9, 9}, {5, 8, 3, 3}, 1, 2, 1, 2, 1, false}}) {   // dilated channels-last
    host::Conv2dParams p;
    p.stride[0] = p.stride[1] = c.stride;
    p.padding[0] = c.pad_h;
    p.padding[1] = c.pad_w;
    p.dilation[0] = p.dilation[1] = c.dilation;
    p.groups = c.groups;
    Shape y{c.x[0], c.w[0], 0, 0};
    for (int i = 0; i < 2; ++i)
      y[2 + i] = (c.x[2 + i] + 2 * p.padding[i] - c.dilation * (c.w[2 + i] - 1) - 1) / c.stride + 1;
    std::vector<float> x = Random(c.x.numel(), 21), w = Random(c.w.numel(), 22), dy = Random(y.numel(), 23);
    std::string label = c.x.str() + " * " + c.w.str();
    std::vector<float> probe(y.numel());
    CHECK(host::direct::Conv2d(view(x, c.x), view(w, c.w), view(probe, y), p) == c.direct);
    compare(
        "conv2d " + label, y, [&](const TensorView& o) { host::Conv2d(view(x, c.x), view(w, c.w), o, p); },
        [&](const TensorView& o) { host::reference::Conv2d(view(x, c.x), view(w, c.w), o, p); });
    compare(
        "conv2d_grad_data " + label, c.x,
        [&](const TensorView& o) { host::Conv2dGradData(view(dy, y), view(w, c.w), o, p); },
        [&](const TensorView& o) { host::reference::Conv2dGradData(view(dy, y), view(w, c.w), o, p); });
    compare(
        "conv2d_grad_weight " + label, c.w,
        [&](const TensorView& o) { host::Conv2dGradWeight(view(dy, y), view(x, c.x), o, p); },
        [&](const TensorView& o) { host::reference::Conv2dGradWeight(view(dy, y), view(x, c.x), o, p); });
  }

  struct Pool {
    Shape x;
    int64_t kh, kw, sh, sw, pad;
    bool direct;
  };
  for (const Pool& c : {Pool{{2, 3, 26, 26}, 2, 2, 2, 2, 0, true}, // LeNet's pooling
                        Pool{{2, 3, 9, 9}, 2, 2, 2, 2, 0, true},   // floor mode: the last row and column drop
                        Pool{{1, 2, 7, 10}, 3, 2, 3, 2, 0, true},  // non-square windows
                        Pool{{1, 2, 8, 8}, 2, 2, 1, 1, 0, false},  // overlapping: oneDNN
                        Pool{{1, 2, 8, 8}, 2, 2, 2, 2, 1, false}}) { // padded: oneDNN
    host::Pool2dParams p;
    p.kernel[0] = c.kh, p.kernel[1] = c.kw, p.stride[0] = c.sh, p.stride[1] = c.sw;
    p.padding[0] = p.padding[1] = c.pad;
    Shape y{c.x[0], c.x[1], (c.x[2] + 2 * c.pad - c.kh) / c.sh + 1, (c.x[3] + 2 * c.pad - c.kw) / c.sw + 1};
    std::vector<float> x = Random(c.x.numel(), 24), dy = Random(y.numel(), 25), probe(y.numel());
    std::string label = c.x.str() + " kernel " + std::to_string(c.kh) + "x" + std::to_string(c.kw);
    CHECK(host::direct::AvgPool2d(view(x, c.x), view(probe, y), p) == c.direct);
    compare(
        "avg_pool2d " + label, y, [&](const TensorView& o) { host::AvgPool2d(view(x, c.x), o, p); },
        [&](const TensorView& o) { host::reference::AvgPool2d(view(x, c.x), o, p); });
    compare(
        "avg_pool2d_grad " + label, c.x, [&](const TensorView& o) { host::AvgPool2dGrad(view(dy, y), o, p); },
        [&](const TensorView& o) { host::reference::AvgPool2dGrad(view(dy, y), o, p); });
  }
}

TEST_CASE("nn: repeated calls reuse the cached oneDNN primitive") {
  Tensor a = Tensor::FromVector(Random(6 * 7, 11), {6, 7}), b = Tensor::FromVector(Random(7 * 9, 12), {7, 9});
  Invoke1("matmul", {a, b}).WaitToRead();
  host::OneDnnCacheStats before = host::GetOneDnnCacheStats();
  for (int i = 0; i < 3; ++i) Invoke1("matmul", {a, b}).WaitToRead();
  host::OneDnnCacheStats after = host::GetOneDnnCacheStats();
  CHECK(after.misses == before.misses);
  CHECK(after.hits >= before.hits + 3);
}

TEST_CASE("nn: float64, float16 and bfloat16 matmul and conv2d agree with float32") {
  Tensor a = Tensor::FromVector(Random(2 * 5 * 8, 13), {2, 5, 8});
  Tensor b = Tensor::FromVector(Random(8 * 3, 14), {8, 3});
  Tensor x = Tensor::FromVector(Random(2 * 3 * 6 * 6, 15), {2, 3, 6, 6});
  Tensor w = Tensor::FromVector(Random(4 * 3 * 3 * 3, 16), {4, 3, 3, 3});
  std::vector<float> mm = Invoke1("matmul", {a, b}).ToVector<float>();
  std::vector<float> cv =
      Invoke1("conv2d", {x, w}, {{"padding", std::vector<int64_t>{1, 1}}}).ToVector<float>();
  for (DType t : {DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    INFO(DTypeName(t));
    double tol = t == DType::kFloat64 ? 1e-5 : 3e-2;
    Tensor m = Invoke1("matmul", {a.AsType(t), b.AsType(t)});
    CHECK(m.dtype() == t);
    CHECK(MaxError(m.ToVector<float>(), std::vector<double>(mm.begin(), mm.end()), tol, tol) <= 1.0);
    Tensor c = Invoke1("conv2d", {x.AsType(t), w.AsType(t)}, {{"padding", std::vector<int64_t>{1, 1}}});
    CHECK(MaxError(c.ToVector<float>(), std::vector<double>(cv.begin(), cv.end()), tol, tol) <= 1.0);
  }
}

TEST_CASE("nn: errors are typed and name what to fix") {
  Tensor a = Tensor::FromVector(Random(2 * 3, 1), {2, 3});
  Tensor b = Tensor::FromVector(Random(4 * 5, 2), {4, 5});
  std::string m = ErrorOf<ShapeError>([&] { Invoke1("matmul", {a, b}); });
  CHECK(m.find("(2, 3)") != std::string::npos);
  CHECK(m.find("(4, 5)") != std::string::npos);
  CHECK(m.find("matmul") != std::string::npos);

  Tensor i = Tensor::FromVector<int32_t>({1, 2, 3, 4}, {2, 2});
  std::string d = ErrorOf<DTypeError>([&] { Invoke1("matmul", {i, i}); });
  CHECK(d.find("int32") != std::string::npos);
  CHECK(d.find("cast") != std::string::npos);
  CHECK_THROWS_AS(Invoke1("matmul", {a, a.AsType(DType::kFloat64)}), DTypeError);
  CHECK_THROWS_AS(Invoke1("matmul", {Tensor::FromVector<float>({1, 2}, {2}), a}), ShapeError);
  CHECK_THROWS_AS(Invoke1("matmul", {Tensor::FromVector(Random(2 * 2 * 3, 3), {2, 2, 3}),
                                     Tensor::FromVector(Random(3 * 3 * 1, 4), {3, 3, 1})}),
                  ShapeError);

  Tensor x = Tensor::FromVector(Random(1 * 4 * 5 * 5, 5), {1, 4, 5, 5});
  Tensor w = Tensor::FromVector(Random(6 * 3 * 3 * 3, 6), {6, 3, 3, 3});
  std::string c = ErrorOf<ShapeError>([&] { Invoke1("conv2d", {x, w}); });
  CHECK(c.find("(1, 4, 5, 5)") != std::string::npos);
  CHECK(c.find("(6, 3, 3, 3)") != std::string::npos);
  CHECK_THROWS_AS(Invoke1("conv2d", {x, Tensor::FromVector(Random(6 * 2 * 3 * 3, 7), {6, 2, 3, 3})},
                          {{"groups", int64_t{3}}}),
                  ShapeError);
  CHECK_THROWS_AS(Invoke1("conv2d", {x, Tensor::FromVector(Random(2 * 4 * 7 * 7, 8), {2, 4, 7, 7})}),
                  ShapeError);
  CHECK_THROWS_AS(Invoke1("conv2d", {x, w}, {{"stride", std::vector<int64_t>{0, 1}}}), ValueError);
  CHECK_THROWS_AS(Invoke1("max_pool2d", {x},
                          {{"kernel", std::vector<int64_t>{2, 2}}, {"padding", std::vector<int64_t>{2, 2}}}),
                  ValueError);
  CHECK_THROWS_AS(Invoke1("avg_pool2d", {Tensor::FromVector(Random(5 * 5, 9), {5, 5})},
                          {{"kernel", std::vector<int64_t>{2, 2}}}),
                  ShapeError);
}

TEST_CASE("nn: pooling and conv shapes follow floor mode") {
  Tensor x = Tensor::FromVector(Random(1 * 1 * 7 * 6, 1), {1, 1, 7, 6});
  CHECK(Invoke1("max_pool2d", {x}, {{"kernel", std::vector<int64_t>{2, 2}}}).shape() == Shape{1, 1, 3, 3});
  CHECK(Invoke1("avg_pool2d", {x},
                {{"kernel", std::vector<int64_t>{3, 3}},
                 {"stride", std::vector<int64_t>{2, 2}},
                 {"padding", std::vector<int64_t>{1, 1}}})
            .shape() == Shape{1, 1, 4, 3});
  Tensor w = Tensor::FromVector(Random(2 * 1 * 3 * 3, 2), {2, 1, 3, 3});
  CHECK(Invoke1("conv2d", {x, w},
                {{"stride", std::vector<int64_t>{2, 2}}, {"dilation", std::vector<int64_t>{2, 1}}})
            .shape() == Shape{1, 2, 2, 2});
}

TEST_CASE("nn: empty operands give empty or zero outputs") {
  Tensor e =
      Invoke1("matmul", {Tensor::Empty({0, 3}, DType::kFloat32), Tensor::FromVector(Random(12, 1), {3, 4})});
  CHECK(e.shape() == Shape{0, 4});
  e.WaitToRead();
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    Tensor z = Invoke1("matmul", {Tensor::Empty({2, 0}, t), Tensor::Empty({0, 3}, t)});
    CHECK(z.ToVector<float>() == std::vector<float>(6, 0.f));
  }
  Tensor c = Invoke1("conv2d", {Tensor::Empty({0, 2, 5, 5}, DType::kFloat32),
                                Tensor::FromVector(Random(36, 2), {2, 2, 3, 3})});
  CHECK(c.shape() == Shape{0, 2, 3, 3});
  c.WaitToRead();
}
