// GPU kernels of the indexing and joining ops (codegen/gpu_kernels_index.cc, hand-written in
// codegen/cu/index.cu): concat, stack, split, slice_grad, where, argmax, argmin, take, take_grad
// and one_hot give the CPU's results bit for bit (raw bytes compared) for every dtype they take,
// on axes first, middle, last and negative, strided inputs, empty tensors, ties and NaN; bad
// indices raise the CPU's ValueError; take_grad is deterministic.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/error.h"
#include "test_util.h"

namespace {

using namespace kiln;

const DType kAll[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                      DType::kInt32,   DType::kInt64,   DType::kUInt8,   DType::kBool};

/// The raw bytes of `t` in row-major order, on the host.
std::vector<char> Bytes(const Tensor& t) {
  Tensor c = t.To(cpu()).Contiguous();
  std::vector<char> b(static_cast<size_t>(c.numel()) * DTypeSize(c.dtype()));
  if (!b.empty()) c.CopyToHost(b.data());
  return b;
}

/// Values -n/2 .. in steps of 0.75 (integers and bools from the cast), of `dtype`, on `dev`.
Tensor Values(const Shape& s, DType dtype, Device dev, double start = -3) {
  Tensor x = nd::arange(start, start + 0.75 * static_cast<double>(s.numel()), 0.75, DType::kFloat64);
  return nd::cast(nd::reshape(x, s.vec()), dtype).To(dev);
}

Tensor Ix(const std::vector<int64_t>& v, const Shape& s, DType dtype, Device dev) {
  return nd::cast(Tensor::FromVector(v, s), dtype).To(dev);
}

/// f run on the CPU and on gpu(0) (its inputs made on that device): same shapes, same bytes.
template <class F>
void SameOnGpu(F&& f) {
  std::vector<Tensor> c = f(cpu()), g = f(gpu(0));
  REQUIRE(c.size() == g.size());
  for (size_t i = 0; i < c.size(); ++i) {
    CAPTURE(i);
    CHECK(g[i].device() == gpu(0));
    CHECK(c[i].shape() == g[i].shape());
    CHECK(c[i].dtype() == g[i].dtype());
    CHECK(Bytes(c[i]) == Bytes(g[i]));
  }
}

}  // namespace

TEST_CASE("gpu: concat, stack and split give the CPU's bytes for every dtype, axis and strided inputs") {
  KILN_REQUIRE_GPU();
  for (DType dt : kAll) {
    CAPTURE(std::string(DTypeName(dt)));
    SameOnGpu([&](Device d) {
      Tensor a = Values(Shape({2, 3, 4}), dt, d), b = Values(Shape({2, 1, 4}), dt, d, 5);
      Tensor at = nd::transpose(Values(Shape({4, 3, 2}), dt, d, 1), {2, 1, 0});  // strided (2, 3, 4)
      Tensor empty = Values(Shape({2, 0, 4}), dt, d);
      std::vector<Tensor> r = {nd::concat({a, b, empty, at}, 1), nd::concat({a, at}, 0), nd::concat({at, a}, -1),
                               nd::concat({empty, empty}, 0),   nd::stack({a, at}, 0),  nd::stack({a, at, a}, 2),
                               nd::stack({at, a}, -1)};
      for (Tensor& p : nd::split(at, {2}, 0)) r.push_back(p);
      for (Tensor& p : nd::split(at, {1, 0, 2}, 1)) r.push_back(p);
      for (Tensor& p : nd::split(a, {2}, -1)) r.push_back(p);
      for (Tensor& p : nd::split(nd::slice(a, {0, 0, 0}, {2, 3, 4}, {1, 2, 3}), {1, 1}, -1)) r.push_back(p);
      return r;
    });
  }
}

TEST_CASE("gpu: concat and stack of tensors with more than 6 dims merge dims, or say what to do") {
  KILN_REQUIRE_GPU();
  SameOnGpu([](Device d) {  // contiguous 8-d parts: the window's dims merge to a few
    Tensor a = Values(Shape({2, 1, 2, 1, 2, 1, 2, 3}), DType::kFloat32, d);
    Tensor b = Values(Shape({2, 1, 2, 1, 2, 3, 2}), DType::kFloat32, d);
    return std::vector<Tensor>{nd::concat({a, a}, 7), nd::stack({b, b}, 3)};
  });
  Tensor x = Values(Shape({2, 2, 2, 2, 2, 2, 2, 2}), DType::kFloat32, gpu(0));
  Tensor xt = nd::transpose(x, {7, 6, 5, 4, 3, 2, 1, 0});  // no two dims merge
  std::string e = testing::ErrorOf<DeviceError>([&] { nd::concat({xt, xt}, 0).WaitToRead(); });
  CHECK(testing::Has(e, "at most 6 dims"));
  CHECK(testing::Has(e, "kiln.cpu()"));
}

TEST_CASE("gpu: slice_grad writes the gradient into zeros as on the CPU, steps and strided gradients included") {
  KILN_REQUIRE_GPU();
  for (DType dt : kAll) {
    CAPTURE(std::string(DTypeName(dt)));
    SameOnGpu([&](Device d) {
      auto sg = [](const Tensor& dy, std::vector<int64_t> shape, std::vector<int64_t> b, std::vector<int64_t> e,
                   std::vector<int64_t> s) {
        return Invoke1("slice_grad", {dy}, {{"shape", shape}, {"begin", b}, {"end", e}, {"step", s}});
      };
      Tensor dy = Values(Shape({2, 3}), dt, d, 1);
      Tensor dyt = nd::transpose(Values(Shape({3, 2}), dt, d, 2));
      return std::vector<Tensor>{sg(dy, {4, 5}, {1, 1}, {3, 4}, {}), sg(dy, {4, 5}, {3, 4}, {0, -6}, {-2, -2}),
                                 sg(dyt, {3, 7}, {1, 0}, {3, 7}, {1, 3}),
                                 sg(Values(Shape({0}), dt, d), {4}, {3}, {1}, {}),
                                 sg(Values(Shape({}), dt, d, 7), {}, {}, {}, {})};
    });
  }
}

TEST_CASE("gpu: where takes any condition dtype as the CPU does (NaN true, -0 and float32-underflow false)") {
  KILN_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType cdt : kAll) {
    for (DType vdt : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kBool}) {
      CAPTURE(std::string(DTypeName(cdt)));
      CAPTURE(std::string(DTypeName(vdt)));
      SameOnGpu([&](Device d) {
        std::vector<double> cv = {0, -0.0, nan, 1e-300, 2, -1};
        Tensor c = nd::cast(Tensor::FromVector(cv, Shape({2, 3, 1})), cdt).To(d);
        Tensor a = Values(Shape({3, 4}), vdt, d, 1), b = Values(Shape({}), vdt, d, -2);
        Tensor ct = nd::transpose(nd::reshape(c, {3, 2}));  // strided (2, 3)
        Tensor bt = nd::transpose(Values(Shape({3, 2}), vdt, d, 4));
        return std::vector<Tensor>{nd::where(c, a, b), nd::where(ct, bt, Values(Shape({3}), vdt, d, 9)),
                                   nd::where(Values(Shape({0, 3}), cdt, d), b, b)};
      });
    }
  }
}

TEST_CASE("gpu: argmax and argmin return the CPU's first extremum, NaN first, for every dtype and axis") {
  KILN_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kAll) {
    CAPTURE(std::string(DTypeName(dt)));
    SameOnGpu([&](Device d) {
      // Ties everywhere: values repeat every 4 along each axis.
      std::vector<double> v(2 * 5 * 6);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 4) - 1;
      Tensor x = nd::cast(Tensor::FromVector(v, Shape({2, 5, 6})), dt).To(d);
      Tensor xt = nd::transpose(x, {2, 0, 1});
      std::vector<Tensor> r;
      for (int64_t axis : {0, 1, 2, -1}) {
        r.push_back(nd::argmax(x, axis));
        r.push_back(nd::argmin(x, axis, true));
        r.push_back(nd::argmax(xt, axis));
        r.push_back(nd::argmin(xt, axis));
      }
      r.push_back(nd::argmax(nd::reshape(x, {60}), 0));
      r.push_back(nd::argmax(Values(Shape({0, 3}), dt, d), 1));
      return r;
    });
  }
  // Long rows (a block per row) and many short rows (a thread per row), with NaN and signed zeros.
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    CAPTURE(std::string(DTypeName(dt)));
    SameOnGpu([&](Device d) {
      std::vector<double> v(3 * 1000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37) % 101) - 50;
      v[1000 + 700] = nan;  // row 1: a NaN late, and one at 900
      v[1000 + 900] = nan;
      v[2000 + 3] = -0.0;   // row 2: all zeros of either sign
      for (size_t i = 2000; i < 3000; ++i) v[i] = i % 3 ? 0.0 : -0.0;
      v[2000 + 999] = nan;  // and a NaN at the very end
      Tensor x = nd::cast(Tensor::FromVector(v, Shape({3, 1000})), dt).To(d);
      Tensor many = Values(Shape({1000, 3}), dt, d);
      return std::vector<Tensor>{nd::argmax(x, 1),    nd::argmin(x, -1),   nd::argmax(nd::transpose(x), 0),
                                 nd::argmin(x, 0),    nd::argmax(many, 1), nd::argmin(nd::transpose(many), 0),
                                 nd::argmax(nd::slice(x, {0, 0}, {3, 1000}, {1, 3}), 1)};
    });
  }
}

TEST_CASE("gpu: take gathers as the CPU does for every dtype, both index dtypes and every axis") {
  KILN_REQUIRE_GPU();
  for (DType dt : kAll) {
    for (DType it : {DType::kInt32, DType::kInt64}) {
      CAPTURE(std::string(DTypeName(dt)));
      CAPTURE(std::string(DTypeName(it)));
      SameOnGpu([&](Device d) {
        Tensor x = Values(Shape({5, 3, 4}), dt, d);
        Tensor ix = Ix({4, 0, -1, 2, 0, -5}, Shape({2, 3}), it, d);
        return std::vector<Tensor>{nd::take(x, ix, 0),
                                   nd::take(x, Ix({2, -3, 1}, Shape({3}), it, d), 1),
                                   nd::take(x, Ix({3}, Shape({}), it, d), -1),
                                   nd::take(nd::transpose(x), ix, 2),  // strided: made contiguous first
                                   nd::take(x, Ix({}, Shape({0}), it, d), 1),
                                   nd::take(Values(Shape({2, 0}), dt, d), Ix({1}, Shape({1}), it, d), 0)};
      });
    }
  }
}

TEST_CASE("gpu: take and take_grad raise the CPU's error for an index out of range, and read nothing outside") {
  KILN_REQUIRE_GPU();
  for (Device d : {cpu(), gpu(0)}) {
    CAPTURE(d.str());
    Tensor x = Values(Shape({5, 3}), DType::kFloat32, d);
    std::string e = testing::ErrorOf<ValueError>(
        [&] { nd::take(x, Ix({1, 7, -9, 5}, Shape({4}), DType::kInt64, d), 0).WaitToRead(); });
    CHECK(testing::Has(e, "take: index 7 (at position 1 of the indices) is out of range for axis 0 of size 5; "
                          "valid indices are -5 to 4"));
    e = testing::ErrorOf<ValueError>([&] { nd::take(x, Ix({-4}, Shape({1}), DType::kInt32, d), 1).WaitToRead(); });
    CHECK(testing::Has(e, "index -4 (at position 0 of the indices) is out of range for axis 1 of size 3"));
    e = testing::ErrorOf<ValueError>([&] {
      nd::take(Values(Shape({2, 0}), DType::kFloat32, d), Ix({0}, Shape({1}), DType::kInt32, d), 1).WaitToRead();
    });
    CHECK(testing::Has(e, "an axis of size 0 has no valid index"));
    e = testing::ErrorOf<ValueError>([&] {
      Invoke1("take_grad", {Values(Shape({2, 3}), DType::kFloat32, d), Ix({0, 2, 3}, Shape({3}), DType::kInt64, d)},
              {{"axis", int64_t{1}}, {"dim", int64_t{3}}})
          .WaitToRead();
    });
    CHECK(testing::Has(e, "take_grad: index 3 (at position 2 of the indices) is out of range for axis 1 of size 3"));
    e = testing::ErrorOf<ValueError>([&] {  // nothing to add (0 rows), the index is still checked
      Invoke1("take_grad", {Values(Shape({0, 2}), DType::kFloat32, d), Ix({0, -3}, Shape({2}), DType::kInt32, d)},
              {{"axis", int64_t{1}}, {"dim", int64_t{2}}})
          .WaitToRead();
    });
    CHECK(testing::Has(e, "index -3 (at position 1 of the indices)"));
  }
  // The GPU keeps working after the error.
  CHECK(nd::take(Values(Shape({4}), DType::kFloat32, gpu(0)), Ix({3}, Shape({1}), DType::kInt64, gpu(0)), 0)
            .ToVector<float>() == std::vector<float>{-0.75f});
}

TEST_CASE("gpu: take_grad sums repeated indices in the CPU's order, bit for bit, every run the same") {
  KILN_REQUIRE_GPU();
  auto take_grad = [](const Tensor& dy, const Tensor& ix, int64_t axis, int64_t dim) {
    return Invoke1("take_grad", {dy, ix}, {{"axis", axis}, {"dim", dim}});
  };
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (DType it : {DType::kInt32, DType::kInt64}) {
      CAPTURE(std::string(DTypeName(dt)));
      CAPTURE(std::string(DTypeName(it)));
      // 3000 indices into 50 rows (a padded sort), values whose float sums depend on the order.
      std::vector<int64_t> idx(3000);
      for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<int64_t>((j * 31 + j / 7) % 100) - 50;
      std::vector<float> g = testing::Random(3000 * 7, -1, 1, 11);
      for (size_t i = 0; i < g.size(); i += 5) g[i] *= 1e3f;  // float16 sums round at each step
      std::vector<std::vector<char>> gpu_runs;
      SameOnGpu([&](Device d) {
        Tensor dy = nd::cast(Tensor::FromVector(g, Shape({3000, 7})), dt).To(d);
        Tensor ix = Ix(idx, Shape({3000}), it, d);
        Tensor dy3 = nd::reshape(dy, {2, 1500, 7});
        Tensor ix2 = Ix(std::vector<int64_t>(idx.begin(), idx.begin() + 1500), Shape({30, 50}), it, d);
        std::vector<Tensor> r = {take_grad(dy, ix, 0, 50),
                                 take_grad(nd::reshape(dy3, {2, 30, 50, 7}), ix2, 1, 50),
                                 take_grad(nd::reshape(dy, {7, 3000}), ix, -1, 60),  // last axis, rows 50..59 empty
                                 take_grad(Values(Shape({4, 0}), dt, d), Ix({}, Shape({0}), it, d), -1, 3),
                                 take_grad(Values(Shape({3}), dt, d), Ix({1, 1, 1}, Shape({3}), it, d), 0, 2)};
        if (d.is_gpu()) gpu_runs.push_back(Bytes(r[0]));
        return r;
      });
      Tensor again = take_grad(nd::cast(Tensor::FromVector(g, Shape({3000, 7})), dt).To(gpu(0)),
                               Ix(idx, Shape({3000}), it, gpu(0)), 0, 50);
      CHECK(Bytes(again) == gpu_runs.at(0));
    }
  }
}

TEST_CASE("gpu: take's gradient through autograd matches the CPU's") {
  KILN_REQUIRE_GPU();
  std::vector<std::vector<char>> grads;
  for (Device d : {cpu(), gpu(0)}) {
    Tensor w = Values(Shape({6, 4}), DType::kFloat32, d);
    w.AttachGrad();
    Tensor y;
    {
      autograd::RecordScope rec;
      y = nd::take(w, Ix({5, 0, 5, 2, 5}, Shape({5}), DType::kInt64, d), 0);
    }
    y.Backward(Values(Shape({5, 4}), DType::kFloat32, d, 0.5));
    grads.push_back(Bytes(w.grad()));
  }
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("gpu: one_hot matches the CPU for every output dtype and both index dtypes") {
  KILN_REQUIRE_GPU();
  for (DType dt : kAll) {
    for (DType it : {DType::kInt32, DType::kInt64}) {
      CAPTURE(std::string(DTypeName(dt)));
      CAPTURE(std::string(DTypeName(it)));
      SameOnGpu([&](Device d) {
        Tensor ix = Ix({0, 3, -1, 4, 2, 7}, Shape({2, 3}), it, d);  // -1, 4 and 7: rows all off
        return std::vector<Tensor>{nd::one_hot(ix, 4, 1, 0, dt), nd::one_hot(ix, 5, -2.5, 0.75, dt),
                                   nd::one_hot(ix, 0, 1, 0, dt), nd::one_hot(Ix({}, Shape({0}), it, d), 3, 1, 0, dt)};
      });
    }
  }
}

#endif  // KILN_WITH_CODEGEN
