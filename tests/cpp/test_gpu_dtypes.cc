// The elementwise ops, cast and the reductions on GPUs for every dtype (codegen/cu/elementwise.cu,
// codegen/gpu_kernels_dtypes.cc): each result equals the CPU kernel's, exactly for integers, bool,
// comparisons and the correctly rounded float functions; within a few units in the last place of
// the dtype for the transcendental ones (libdevice is not glibc). Also broadcasts and strided
// operands the generated float32 kernels cannot read, integer division by zero (the CPU's
// ValueError), cast between every pair of dtypes, and d2l's accuracy expression on a GPU.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/op_id.h"
#include "kiln/runtime/scalar_fn.h"
#include "test_util.h"

namespace {

using namespace kiln;

constexpr DType kAll[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                          DType::kInt32,   DType::kInt64,   DType::kUInt8,   DType::kBool};

/// Values of every kind for `dt` (made on the CPU from float64): signs, zeros, halves (rounding
/// ties), large and tiny magnitudes, and for floats NaN and infinities.
Tensor Values(DType dt, const Shape& shape, uint32_t seed) {
  std::vector<double> v;
  const int64_t n = shape.numel();
  std::vector<float> r = testing::Random(static_cast<size_t>(n), -6, 6, seed);
  const double special[] = {0.0, -0.0, 0.5, -2.5, 1.5, 3.0, -1.0, 1.0, 100.25, -7.0};
  for (int64_t i = 0; i < n; ++i) {
    double x = i % 3 == 0 ? special[(i / 3) % 10] : r[static_cast<size_t>(i)];
    if (IsFloat(dt) && i == 7) x = std::numeric_limits<double>::quiet_NaN();
    if (IsFloat(dt) && i == 11) x = std::numeric_limits<double>::infinity();
    if (IsFloat(dt) && i == 13) x = -std::numeric_limits<double>::infinity();
    if (dt == DType::kUInt8) x = std::fabs(x) * 20;
    if (dt == DType::kInt32 || dt == DType::kInt64) x = std::trunc(x * 1000);
    if (dt == DType::kBool) x = i % 2 ? 0.0 : x;
    v.push_back(x);
  }
  return nd::cast(Tensor::FromVector(v, shape), dt);
}

double Eps(DType dt) {
  switch (dt) {
    case DType::kFloat32: return 0x1p-23;
    case DType::kFloat64: return 0x1p-52;
    case DType::kFloat16: return 0x1p-10;
    case DType::kBFloat16: return 0x1p-7;
    default: return 0;
  }
}

/// Checks that the GPU's `got` equals the CPU's `want` (same dtype and shape): exactly, or within
/// `ulps` units of the dtype's precision relative to the larger of the result and `floor` (1e-3
/// for results near zero; a sum's cancellation leaves errors relative to its terms).
void CheckSame(const Tensor& got, const Tensor& want, double ulps, double floor = 1e-3) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  std::vector<double> g = got.ToVector<double>(), w = want.ToVector<double>();
  const double tol = ulps * Eps(want.dtype());
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) continue;
    if (tol > 0 && std::isfinite(g[i]) && std::fabs(g[i] - w[i]) <= tol * std::max(std::fabs(w[i]), floor)) continue;
    if (bad++ < 3) CHECK_MESSAGE(false, "element " << i << ": GPU " << g[i] << ", CPU " << w[i]);
  }
  CHECK(bad == 0);
}

/// True for the unary functions computed by libdevice's approximations (not correctly rounded).
bool Transcendental(UnaryFn f) {
  switch (f) {
    case UnaryFn::kExp: case UnaryFn::kLog: case UnaryFn::kLog1p: case UnaryFn::kExpm1: case UnaryFn::kSin:
    case UnaryFn::kCos: case UnaryFn::kTanh: case UnaryFn::kErf: case UnaryFn::kSoftplus: case UnaryFn::kMish:
      return true;
    default: return false;
  }
}

bool Takes(UnaryFn f, DType dt) {
  switch (DomainOf(f)) {
    case UnaryDomain::kFloatOnly: return IsFloat(dt);
    case UnaryDomain::kNumeric: return dt != DType::kBool;
    case UnaryDomain::kAny: return true;
  }
  return false;
}

Tensor Run(OpId id, std::initializer_list<Tensor> in) { return Invoke1(OpName(id), in); }

}  // namespace

TEST_CASE("gpu: every unary elementwise op of every dtype gives the CPU's values") {
  KILN_REQUIRE_GPU();
  for (DType dt : kAll) {
    Tensor x = Values(dt, Shape({5, 13}), 1);
    Tensor xg = x.To(gpu(0));
    for (OpId id = op::kFirstUnary; id < op::kFirstBinary; ++id) {
      const UnaryFn f = *UnaryFnOf(id);
      if (!Takes(f, dt)) continue;
      CAPTURE(std::string(OpName(id)) + "(" + DTypeName(dt) + ")");
      const double ulps = !Transcendental(f) ? 0 : dt == DType::kFloat16 || dt == DType::kBFloat16 ? 1 : 4;
      CheckSame(Run(id, {xg}).To(cpu()), Run(id, {x}), ulps);
    }
  }
}

TEST_CASE("gpu: libdevice's functions that call internal ones (pow, huge sine arguments) give the CPU's values") {
  KILN_REQUIRE_GPU();
  // float64 pow calls __internal_accurate_pow and sin/cos of huge arguments the trigonometric
  // slow path: functions of their own in the module, which the emulator must call correctly.
  Tensor x = Tensor::FromVector(std::vector<double>{1e10, -3e15, 1e300, 3.0, 1e22, 12345.678}, Shape({6}));
  Tensor gx = x.To(gpu(0));
  CheckSame(nd::sin(gx).To(cpu()), nd::sin(x), 4);
  CheckSame(nd::cos(gx).To(cpu()), nd::cos(x), 4);
  Tensor a = Tensor::FromVector(std::vector<double>{1.5, 2, 3, 0.5, 10, 0.999}, Shape({6}));
  Tensor b = Tensor::FromVector(std::vector<double>{2, 0.5, -1, 3, 300, 1e6}, Shape({6}));
  CheckSame(nd::power(a.To(gpu(0)), b.To(gpu(0))).To(cpu()), nd::power(a, b), 4);
}

TEST_CASE("gpu: every binary elementwise op of every dtype gives the CPU's values, under any broadcast") {
  KILN_REQUIRE_GPU();
  // (3, 1, 4) with (2, 1): the non-1 dims of neither operand are one adjacent block of the output
  // (3, 2, 4), which the generated float32 kernels cannot read.
  for (DType dt : kAll) {
    Tensor a = Values(dt, Shape({3, 1, 4}), 2), b = Values(dt, Shape({2, 1}), 3);
    Tensor c = Values(dt, Shape({3, 2, 4}), 4);
    if (!IsFloat(dt) && dt != DType::kBool) {  // integer division by zero raises: no zero divisors
      Tensor one = nd::full(Shape({1}), 1, dt);
      a = nd::maximum(a, one), b = nd::maximum(b, one), c = nd::maximum(c, one);
    }
    for (OpId id = op::kFirstBinary; id < op::kFirstOther; ++id) {
      const BinaryFn f = *BinaryFnOf(id);
      if (dt == DType::kBool && !ReturnsBool(f) && f != BinaryFn::kAdd && f != BinaryFn::kMul &&
          f != BinaryFn::kMaximum && f != BinaryFn::kMinimum)
        continue;
      Tensor ea = a, eb = b, ec = c;
      if (f == BinaryFn::kPow && !IsFloat(dt) && dt != DType::kBool) {  // small exponents, some negative
        ea = nd::cast(nd::cast(a, DType::kFloat64) / 500.0, dt);
        eb = nd::cast(nd::cast(b, DType::kFloat64) / 300.0, dt);
        ec = nd::cast(nd::cast(c, DType::kFloat64) / 300.0, dt);
      }
      CAPTURE(std::string(OpName(id)) + "(" + DTypeName(dt) + ")");
      const double ulps = f == BinaryFn::kPow && IsFloat(dt) ? (dt == DType::kFloat16 || dt == DType::kBFloat16 ? 1 : 4) : 0;
      Tensor ga = ea.To(gpu(0)), gb = eb.To(gpu(0)), gc = ec.To(gpu(0));
      CheckSame(Run(id, {ga, gb}).To(cpu()), Run(id, {ea, eb}), ulps);  // broadcast both ways
      CheckSame(Run(id, {gc, ga}).To(cpu()), Run(id, {ec, ea}), ulps);
      CheckSame(Run(id, {gc, gc}).To(cpu()), Run(id, {ec, ec}), ulps);  // equal shapes: flat
      // Strided: a transposed view read in place.
      Tensor t = nd::transpose(ec, {2, 1, 0}), gt = nd::transpose(gc, {2, 1, 0});
      CheckSame(Run(id, {gt, gt}).To(cpu()), Run(id, {t, t}), ulps);
    }
  }
}

TEST_CASE("gpu: float32 broadcasts and strided operands beyond the generated kernels") {
  KILN_REQUIRE_GPU();
  Tensor a = Values(DType::kFloat32, Shape({4, 1, 3, 1}), 5), b = Values(DType::kFloat32, Shape({5, 1, 2}), 6);
  Tensor ga = a.To(gpu(0)), gb = b.To(gpu(0));
  CheckSame((ga * gb).To(cpu()), a * b, 0);  // out (4, 5, 3, 2)
  CheckSame(nd::exp(ga - gb).To(cpu()), nd::exp(a - b), 4);
  Tensor m = Values(DType::kFloat32, Shape({6, 7}), 7), gm = m.To(gpu(0));
  CheckSame(nd::tanh(nd::transpose(gm)).To(cpu()), nd::tanh(nd::transpose(m)), 4);
  // A slice with a step (strided) plus a transposed view, both read in place.
  Tensor sl = nd::slice(m, {0, 0}, {6, 7}, {1, 2}), gsl = nd::slice(gm, {0, 0}, {6, 7}, {1, 2});  // (6, 4)
  Tensor sq = Values(DType::kFloat32, Shape({4, 6}), 8), gsq = sq.To(gpu(0));
  CheckSame((gsl + nd::transpose(gsq)).To(cpu()), sl + nd::transpose(sq), 0);
  CheckSame(nd::greater(gsl, nd::transpose(gsq)).To(cpu()), nd::greater(sl, nd::transpose(sq)), 0);
}

TEST_CASE("gpu: operands that need more than six index dims are a DeviceError that says what to do") {
  KILN_REQUIRE_GPU();
  // Alternating broadcast dims merge with no neighbour: eight dims of the output stay eight.
  Tensor a = nd::ones(Shape({2, 1, 2, 1, 2, 1, 2, 1}), DType::kFloat64, gpu(0));
  Tensor b = nd::ones(Shape({1, 2, 1, 2, 1, 2, 1, 2}), DType::kFloat64, gpu(0));
  std::string e = testing::ErrorOf<DeviceError>([&] { (a + b).WaitToRead(); });
  CHECK(testing::Has(e, "at most 6 dims"));
  CHECK(testing::Has(e, "kiln.cpu()"));
  // Dims that merge are fine: a contiguous rank-8 tensor is one flat dim.
  Tensor c = nd::ones(Shape({2, 2, 2, 2, 2, 2, 2, 2}), DType::kFloat64, gpu(0));
  CHECK(nd::sum(c + c).Item() == 512);
}

TEST_CASE("gpu: integer division by zero raises the CPU's ValueError") {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::kInt32, DType::kInt64, DType::kUInt8}) {
    CAPTURE(std::string(DTypeName(dt)));
    Tensor a = nd::cast(Tensor::FromVector(std::vector<double>{7, 8, 9}, Shape({3})), dt).To(gpu(0));
    Tensor b = nd::cast(Tensor::FromVector(std::vector<double>{2, 0, 3}, Shape({3})), dt).To(gpu(0));
    std::string e = testing::ErrorOf<ValueError>([&] { (a / b).WaitToRead(); });
    CHECK(testing::Has(e, "integer division by zero"));
    Tensor ok = nd::cast(Tensor::FromVector(std::vector<double>{-7, 2, -3}, Shape({3})), DType::kInt32).To(gpu(0));
    Tensor d = nd::cast(Tensor::FromVector(std::vector<double>{2, 2, 2}, Shape({3})), DType::kInt32).To(gpu(0));
    CHECK((ok / d).ToVector<int32_t>() == std::vector<int32_t>{-3, 1, -1});  // truncates toward zero
  }
}

TEST_CASE("gpu: cast between every pair of dtypes gives the CPU's values") {
  KILN_REQUIRE_GPU();
  // Rounding ties of the 16-bit floats, large values, negative zero, NaN and infinities.
  const std::vector<double> v = {0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.75, 127.9, 200.5, 255.0, 65504.0, 65520.0,
                                 1e-8, 3.0000001, 1.00048828125, 1.0009765625, 33.333333333, -120.0,
                                 2049.0, 4097.0, 123456789.0, -98765.4321,
                                 std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity()};
  Tensor base = Tensor::FromVector(v, Shape({static_cast<int64_t>(v.size())}));
  for (DType from : kAll) {
    Tensor x = nd::cast(base, from);
    // Values an integer target represents: the CPU's conversion of out-of-range floats is x86's.
    Tensor gx = x.To(gpu(0));
    for (DType to : kAll) {
      CAPTURE(std::string(DTypeName(from)) + " -> " + DTypeName(to));
      CheckSame(nd::cast(gx, to).To(cpu()), nd::cast(x, to), 0);
    }
    // A strided input.
    Tensor m = nd::reshape(nd::cast(base, from), {5, 5});
    CheckSame(nd::cast(nd::transpose(m.To(gpu(0))), DType::kFloat64).To(cpu()),
              nd::cast(nd::transpose(m), DType::kFloat64), 0);
  }
}

TEST_CASE("gpu: sum, mean, max and min of every dtype give the CPU's values") {
  KILN_REQUIRE_GPU();
  for (DType dt : kAll) {
    Tensor x = Values(dt, Shape({4, 70, 3}), 8);
    if (IsFloat(dt)) {  // no NaN or infinities in sums
      x = nd::where(nd::not_equal(x, x), nd::zeros(Shape({1}), dt), x);
      x = nd::where(nd::equal(nd::abs(x), nd::full(Shape({1}), std::numeric_limits<double>::infinity(), dt)),
                    nd::ones(Shape({1}), dt), x);
    }
    Tensor gx = x.To(gpu(0));
    CAPTURE(std::string(DTypeName(dt)));
    for (const nd::Axes& axes : {nd::Axes{}, nd::Axes{1}, nd::Axes{0, 2}, nd::Axes{2}}) {
      CAPTURE(axes.size());
      // The order of additions differs: errors relative to the terms (up to 100, 280 of them).
      const double sum_ulps = IsFloat(dt) ? 4 : 0;
      CheckSame(nd::sum(gx, axes).To(cpu()), nd::sum(x, axes), sum_ulps, 1000);
      if (IsFloat(dt)) CheckSame(nd::mean(gx, axes, true).To(cpu()), nd::mean(x, axes, true), sum_ulps, 10);
      CheckSame(nd::max(gx, axes).To(cpu()), nd::max(x, axes), 0);
      CheckSame(nd::min(gx, axes).To(cpu()), nd::min(x, axes), 0);
    }
    // A strided input, and NaN propagating through max and min.
    CheckSame(nd::sum(nd::transpose(gx), {0}).To(cpu()), nd::sum(nd::transpose(x), {0}), IsFloat(dt) ? 4 : 0, 1000);
    if (IsFloat(dt)) {
      Tensor y = Values(dt, Shape({2, 16}), 9), gy = y.To(gpu(0));  // element 7 and 11 are NaN, inf
      CheckSame(nd::max(gy, {1}).To(cpu()), nd::max(y, {1}), 0);
      CheckSame(nd::min(gy, {1}).To(cpu()), nd::min(y, {1}), 0);
    }
  }
  // bool sums to int64; the sum of nothing is 0 and the mean of nothing NaN.
  Tensor flags = nd::cast(Values(DType::kFloat32, Shape({9, 5}), 10), DType::kBool);
  Tensor s = nd::sum(flags.To(gpu(0)), {0});
  CHECK(s.dtype() == DType::kInt64);
  CheckSame(s.To(cpu()), nd::sum(flags, {0}), 0);
  Tensor empty = nd::zeros(Shape({3, 0}), DType::kFloat64, gpu(0));
  CHECK(nd::sum(empty, {1}).ToVector<double>() == std::vector<double>{0, 0, 0});
  CHECK(std::isnan(nd::mean(empty, {1}).ToVector<double>()[0]));
}

TEST_CASE("gpu: d2l's accuracy expression runs on a GPU") {
  KILN_REQUIRE_GPU();
  // (y_hat.argmax(axis=1).astype(y.dtype) == y).sum(), labels int32 as a data loader gives them.
  Tensor y_hat = Tensor::FromVector(testing::Random(8 * 10, -1, 1, 11), Shape({8, 10}));
  Tensor predicted = nd::argmax(y_hat, 1);  // int64
  std::vector<int32_t> labels;  // five right, three wrong
  for (int64_t p : predicted.ToVector<int64_t>()) labels.push_back(static_cast<int32_t>(labels.size() < 5 ? p : (p + 1) % 10));
  Tensor y = Tensor::FromVector(labels, Shape({8}));
  // argmax's GPU kernel is not part of this change: where a build has none, argmax runs on the
  // CPU and the rest of the expression (cast, equal, sum) on the GPU.
  const bool argmax_on_gpu = KernelTable::Get().Find(op::kArgmax, DeviceType::kGPU) != nullptr;
  Tensor gpu_predicted = argmax_on_gpu ? nd::argmax(y_hat.To(gpu(0)), 1) : predicted.To(gpu(0));
  CAPTURE(argmax_on_gpu);
  auto accuracy = [](const Tensor& p, const Tensor& labels) {
    return nd::sum(nd::equal(nd::cast(p, labels.dtype()), labels));
  };
  Tensor want = accuracy(predicted, y);
  Tensor got = accuracy(gpu_predicted, y.To(gpu(0)));
  CHECK(got.device() == gpu(0));
  CHECK(got.dtype() == DType::kInt64);  // equal gives bool, which sums to int64
  CHECK(want.Item() == 5);
  CHECK(got.Item() == 5);
  if (NumGPUs() > 1)  // the kernels load on each GPU
    CHECK(accuracy(gpu_predicted.To(gpu(1)), y.To(gpu(1))).Item() == 5);
  // The float32 form: labels as float32; the accuracy as the mean of the matches cast to float32.
  Tensor yf = nd::cast(y, DType::kFloat32);
  Tensor match = nd::cast(nd::equal(nd::cast(gpu_predicted, DType::kFloat32), yf.To(gpu(0))), DType::kFloat32);
  CHECK(nd::mean(match).Item() == doctest::Approx(want.Item() / 8.0));
}

#endif  // KILN_WITH_CODEGEN
