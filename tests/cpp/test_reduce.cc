// Reduction ops beyond the conformance table: accuracy of long float32 sums, the kernels' fast
// paths at sizes the table cannot afford, strided views, error messages, argmax ties and NaN,
// and gradients through autograd (ties of max share the gradient).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "test_util.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"

using namespace kiln;
using V = std::vector<int64_t>;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;
using kiln::testing::Contains;

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

/// A view of `base`'s storage with the given shape, strides and offset.
Tensor View(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset = 0) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

struct Ref {
  std::vector<double> value;
  std::vector<double> scale; ///< what rounding errors are relative to: sum |x| for sums
};

/// Plain double reference: sum (or max) of the (rows, cols) matrix `x` along `axis`.
Ref Ref2D(const std::vector<float>& x, int64_t rows, int64_t cols, int axis, bool max) {
  size_t n = static_cast<size_t>(axis == 0 ? cols : rows);
  Ref r{std::vector<double>(n, max ? -INFINITY : 0.0), std::vector<double>(n, 0.0)};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      size_t o = static_cast<size_t>(axis == 0 ? j : i);
      double v = x[static_cast<size_t>(i * cols + j)];
      r.value[o] = max ? std::max(r.value[o], v) : r.value[o] + v;
      r.scale[o] = max ? std::fabs(r.value[o]) : r.scale[o] + std::fabs(v);
    }
  return r;
}

Ref Exact(std::vector<double> v) {
  std::vector<double> s(v.size());
  for (size_t i = 0; i < v.size(); ++i) s[i] = std::fabs(v[i]);
  return {std::move(v), std::move(s)};
}

/// |got - want| <= rtol * max(1, scale) elementwise.
void CheckClose(const std::vector<float>& got, const Ref& want, double rtol) {
  REQUIRE(got.size() == want.value.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want.value[i]) > rtol * std::max(1.0, want.scale[i]) && bad++ < 3)
      CHECK_MESSAGE(false, "at " << i << ": got " << got[i] << ", want " << want.value[i]);
  CHECK(bad == 0);
}


} // namespace

TEST_CASE("reduce: 1e7 float32 values sum accurately") {
  const int64_t n = 10'000'000;
  Tensor ones = Invoke1("full", {}, {{"shape", V{n}}, {"value", 1.0}});
  CHECK(Invoke1("sum", {ones}).Item() == doctest::Approx(1e7).epsilon(1e-7));
  CHECK(Invoke1("mean", {ones}).Item() == doctest::Approx(1.0).epsilon(1e-7));
  // Rows of the same data: two rows (fewer outputs than threads) and a column reduction.
  Tensor two =
      Invoke1("sum", {Invoke1("full", {}, {{"shape", V{2, n / 2}}, {"value", 1.0}})}, {{"axes", V{1}}});
  CHECK(two.ToVector<double>() == std::vector<double>{5e6, 5e6});
  Tensor col =
      Invoke1("sum", {Invoke1("full", {}, {{"shape", V{n / 4, 4}}, {"value", 1.0}})}, {{"axes", V{0}}});
  CHECK(col.ToVector<double>() == std::vector<double>{2.5e6, 2.5e6, 2.5e6, 2.5e6});

  std::vector<float> v = Random(n, 1, 0, 1);
  double want = std::accumulate(v.begin(), v.end(), 0.0);
  double got = Invoke1("sum", {Tensor::FromVector(v, {n})}).Item();
  CHECK(std::fabs(got - want) / want < 1e-6);
}

TEST_CASE("reduce: fast paths agree with a plain reference") {
  struct Shape2 {
    int64_t rows, cols;
  };
  for (Shape2 s : {Shape2{64, 5000}, Shape2{5000, 64}, Shape2{300000, 3}, Shape2{3, 300000}, Shape2{1, 70},
                   Shape2{2049, 1}, Shape2{7, 1100}}) {
    std::vector<float> v = Random(s.rows * s.cols, static_cast<uint32_t>(s.rows));
    Tensor x = Tensor::FromVector(v, {s.rows, s.cols});
    for (int axis : {0, 1})
      for (bool max : {false, true}) {
        INFO("shape (" << s.rows << ", " << s.cols << ") axis " << axis << (max ? " max" : " sum"));
        Tensor y = Invoke1(max ? "max" : "sum", {x}, {{"axes", V{axis}}});
        CheckClose(y.ToVector<float>(), Ref2D(v, s.rows, s.cols, axis, max), 1e-6);
      }
  }
  // A middle axis, and two non-adjacent axes of a 4-d tensor.
  std::vector<float> v = Random(20 * 30 * 40, 9);
  Tensor x = Tensor::FromVector(v, {20, 30, 40});
  Ref mid{std::vector<double>(20 * 40, 0.0), std::vector<double>(20 * 40, 0.0)};
  for (int i = 0; i < 20; ++i)
    for (int j = 0; j < 30; ++j)
      for (int k = 0; k < 40; ++k) {
        mid.value[i * 40 + k] += v[(i * 30 + j) * 40 + k];
        mid.scale[i * 40 + k] += std::fabs(v[(i * 30 + j) * 40 + k]);
      }
  CheckClose(Invoke1("sum", {x}, {{"axes", V{1}}}).ToVector<float>(), mid, 1e-6);
  Tensor x4 = Tensor::FromVector(v, {20, 3, 10, 40});
  Ref two{std::vector<double>(3 * 10, 0.0), std::vector<double>(3 * 10, 0.0)};
  for (int64_t i = 0; i < 24000; ++i) {
    two.value[(i / 400 % 3) * 10 + i / 40 % 10] += v[i];
    two.scale[(i / 400 % 3) * 10 + i / 40 % 10] += std::fabs(v[i]);
  }
  CheckClose(Invoke1("sum", {x4}, {{"axes", V{0, -1}}}).ToVector<float>(), two, 1e-6);
}

TEST_CASE("reduce: integer, bool and 16-bit float sums") {
  std::vector<int32_t> iv(100000);
  std::iota(iv.begin(), iv.end(), -50000);
  Tensor s = Invoke1("sum", {Tensor::FromVector(iv, {100000})});
  CHECK(s.dtype() == DType::kInt32);
  CHECK(s.Item() == -50000);
  std::vector<bool> bv(1001, true);
  Tensor b = Invoke1("sum", {Tensor::FromVector(bv, {7, 143})}, {{"axes", V{1}}});
  CHECK(b.dtype() == DType::kInt64);
  CHECK(b.ToVector<int64_t>() == std::vector<int64_t>(7, 143));
  CHECK(Invoke1("max", {Tensor::FromVector(bv, {1001})}).dtype() == DType::kBool);
  Tensor h = Invoke1("full", {}, {{"shape", V{3, 4096}}, {"value", 0.5}, {"dtype", DType::kFloat16}});
  Tensor hs = Invoke1("sum", {h}, {{"axes", V{1}}});
  CHECK(hs.dtype() == DType::kFloat16);
  CHECK(hs.ToVector<double>() == std::vector<double>(3, 2048.0)); // exact: accumulated in float
}

TEST_CASE("reduce: strided inputs (a transposed view and a stepped slice)") {
  const int64_t m = 300, n = 500;
  std::vector<float> v = Random(m * n, 5);
  Tensor base = Tensor::FromVector(v, {m, n});
  Tensor t = View(base, {n, m}, {1, n}); // t[j][i] = v[i][j]
  CheckClose(Invoke1("sum", {t}, {{"axes", V{1}}}).ToVector<float>(), Ref2D(v, m, n, 0, false), 1e-6);
  CheckClose(Invoke1("sum", {t}, {{"axes", V{0}}}).ToVector<float>(), Ref2D(v, m, n, 1, false), 1e-6);
  CheckClose(Invoke1("max", {t}, {{"axes", V{0}}, {"keepdims", true}}).ToVector<float>(),
             Ref2D(v, m, n, 1, true), 0);
  CheckClose(Invoke1("sum", {t}).ToVector<float>(), Ref2D(v, 1, m * n, 1, false), 1e-6);
  std::vector<int64_t> am = Invoke1("argmax", {t}, {{"axis", 1}}).ToVector<int64_t>();
  for (int64_t j = 0; j < n; ++j) {
    int64_t best = 0;
    for (int64_t i = 1; i < m; ++i)
      if (v[i * n + j] > v[best * n + j]) best = i;
    REQUIRE(am[j] == best);
  }
  // Every other column, starting at column 1: shape (m, n/2), strides (n, 2).
  Tensor s = View(base, {m, n / 2}, {n, 2}, 1);
  std::vector<float> sv;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n / 2; ++j) sv.push_back(v[i * n + 2 * j + 1]);
  for (int axis : {0, 1})
    CheckClose(Invoke1("sum", {s}, {{"axes", V{axis}}}).ToVector<float>(), Ref2D(sv, m, n / 2, axis, false),
               1e-6);
  CheckClose(Invoke1("min", {s}).ToVector<float>(), Exact({*std::min_element(sv.begin(), sv.end())}), 0);
}

TEST_CASE("reduce: errors name the op and say what was expected") {
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  std::string e = ErrorOf<ShapeError>([&] { Invoke1("sum", {x}, {{"axes", V{2}}}); });
  CHECK(e.find("sum") != std::string::npos);
  CHECK(e.find("out of range") != std::string::npos);
  e = ErrorOf<ShapeError>([&] { Invoke1("max", {x}, {{"axes", V{1, -1}}}); });
  CHECK(e.find("max: an axis is repeated") != std::string::npos);
  e = ErrorOf<DTypeError>([&] { Invoke1("mean", {Tensor::FromVector<int64_t>({1, 2}, {2})}); });
  CHECK(e.find("mean") != std::string::npos);
  Tensor empty = Tensor::Empty({2, 0}, DType::kFloat32);
  e = ErrorOf<ShapeError>([&] { Invoke1("max", {empty}, {{"axes", V{1}}}); });
  CHECK(e.find("max: cannot reduce over a zero-size axis") != std::string::npos);
  e = ErrorOf<ShapeError>([&] { Invoke1("min", {empty}); });
  CHECK(e.find("min: cannot reduce over a zero-size axis") != std::string::npos);
  e = ErrorOf<ShapeError>([&] { Invoke1("argmax", {empty}, {{"axis", 1}}); });
  CHECK(e.find("argmax: cannot reduce over a zero-size axis") != std::string::npos);
  CHECK(Invoke1("max", {empty}, {{"axes", V{0}}}).shape() == Shape{0});
  e = ErrorOf<ValueError>([&] { Invoke1("argmin", {x}); });
  CHECK(e.find("argmin: attribute 'axis'") != std::string::npos);
  e = ErrorOf<ShapeError>([&] { Invoke1("argmin", {x}, {{"axis", -3}}); });
  CHECK(e.find("argmin") != std::string::npos);
}

TEST_CASE("reduce: empty sums are zero and empty means NaN") {
  Tensor empty = Tensor::Empty({3, 0}, DType::kFloat32);
  CHECK(Invoke1("sum", {empty}, {{"axes", V{1}}}).ToVector<float>() == std::vector<float>{0, 0, 0});
  CHECK(std::isnan(Invoke1("mean", {empty}).Item()));
}

TEST_CASE("reduce: argmax/argmin take the first of ties and the first NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor t = Tensor::FromVector<float>({1, 5, 5, 0, 0, 2}, {6});
  CHECK(Invoke1("argmax", {t}, {{"axis", 0}}).Item() == 1);
  CHECK(Invoke1("argmin", {t}, {{"axis", 0}}).Item() == 3);
  Tensor n = Tensor::FromVector<float>({1, nan, 9, nan, -1}, {5});
  CHECK(Invoke1("argmax", {n}, {{"axis", 0}}).Item() == 1);
  CHECK(Invoke1("argmin", {n}, {{"axis", 0}}).Item() == 1);
  Tensor k = Invoke1("argmax", {Tensor::FromVector<float>({3, 1, 2, 7}, {2, 2})},
                     {{"axis", -1}, {"keepdims", true}});
  CHECK(k.dtype() == DType::kInt64);
  CHECK(k.shape() == Shape{2, 1});
  CHECK(k.ToVector<int64_t>() == std::vector<int64_t>{0, 1});
  // Column scans (axis 0 of a wide matrix) with ties and a NaN in one column.
  std::vector<float> v(4 * 600, 1.0f);
  v[2 * 600 + 5] = nan;
  v[3 * 600 + 5] = 4.0f;
  v[1 * 600 + 7] = 2.0f;
  v[3 * 600 + 7] = 2.0f;
  std::vector<int64_t> am =
      Invoke1("argmax", {Tensor::FromVector(v, {4, 600})}, {{"axis", 0}}).ToVector<int64_t>();
  CHECK(am[0] == 0);
  CHECK(am[5] == 2);
  CHECK(am[7] == 1);
  std::vector<int64_t> an =
      Invoke1("argmin", {Tensor::FromVector(v, {4, 600})}, {{"axis", 0}}).ToVector<int64_t>();
  CHECK(an[5] == 2);
  CHECK(an[7] == 0);
}

TEST_CASE("reduce: gradients of sum, mean and max (ties share the gradient)") {
  Tensor x = Tensor::FromVector<float>({1, 3, 3, 2, 0, 0}, {2, 3});
  x.AttachGrad();
  std::vector<Tensor> y(3);
  {
    autograd::RecordScope record;
    y[0] = Invoke1("sum", {x}, {{"axes", V{1}}});
    y[1] = Invoke1("mean", {x}, {{"axes", V{0}}, {"keepdims", true}});
    y[2] = Invoke1("max", {x}, {{"axes", V{1}}});
  }
  Tensor gs = autograd::Grad({y[0]}, {x}, {Tensor::FromVector<float>({1, 2}, {2})}, true)[0];
  CHECK(gs.ToVector<float>() == std::vector<float>{1, 1, 1, 2, 2, 2});
  Tensor gm = autograd::Grad({y[1]}, {x}, {}, true)[0];
  CHECK(gm.ToVector<float>() == std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f});
  Tensor gx = autograd::Grad({y[2]}, {x}, {Tensor::FromVector<float>({1, 4}, {2})})[0];
  CHECK(gx.ToVector<float>() == std::vector<float>{0, 0.5f, 0.5f, 4, 0, 0});
}
