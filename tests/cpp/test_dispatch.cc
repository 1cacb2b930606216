// Eager dispatch: errors raised at the call (op named, shapes/dtypes/devices shown), errors in
// tasks surfacing at sync points, promotion, printing and host access.
#include <doctest/doctest.h>

#include "test_util.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/engine.h"

using namespace kiln;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;
using kiln::testing::Contains;
}  // namespace

TEST_CASE("dispatch: shape mismatch is a ShapeError at the call naming op and shapes") {
  Tensor a = nd::ones({2, 3}), b = nd::ones({4});
  std::string m = ErrorOf<ShapeError>([&] { nd::add(a, b); });
  CHECK(Has(m, "add"));
  CHECK(Has(m, "(2, 3)"));
  CHECK(Has(m, "(4,)"));
}

TEST_CASE("dispatch: dtype errors name the op and suggest a cast") {
  Tensor i = nd::ones({2}, DType::kInt32);
  std::string m = ErrorOf<DTypeError>([&] { nd::exp(i); });
  CHECK(Has(m, "exp"));
  CHECK(Has(m, "int32"));
  CHECK(Has(m, "cast"));
}

TEST_CASE("dispatch: tensors on different CPU devices are a DeviceError") {
  Tensor a = nd::ones({2}, DType::kFloat32, cpu(0)), b = nd::ones({2}, DType::kFloat32, cpu(1));
  std::string m = ErrorOf<DeviceError>([&] { nd::add(a, b); });
  CHECK(Has(m, "cpu(0)"));
  CHECK(Has(m, "cpu(1)"));
  CHECK(nd::add(a, b.To(cpu(0))).ToVector<float>() == std::vector<float>{2, 2});
}

TEST_CASE("dispatch: binary ops promote dtypes like NumPy, and scalars take the tensor's dtype") {
  Tensor i = Tensor::FromVector<int32_t>({1, 2}, {2});
  Tensor f = Tensor::FromVector<float>({0.5, 0.5}, {2});
  CHECK((i + f).dtype() == DType::kFloat32);
  CHECK((i + 1.0).dtype() == DType::kInt32);
  CHECK((i + 1.5).dtype() == DType::kFloat32);
  CHECK((f * 2.0).dtype() == DType::kFloat32);
  Tensor d = Tensor::FromVector<double>({1}, {1});
  CHECK((f + d).dtype() == DType::kFloat64);
  CHECK(nd::less(i, 2.0).dtype() == DType::kBool);
}

TEST_CASE("dispatch: an error inside a task surfaces at the sync point with the op name") {
  Tensor a = Tensor::FromVector<int64_t>({1, 2}, {2});
  Tensor z = Tensor::FromVector<int64_t>({0, 1}, {2});
  Tensor q = nd::divide(a, z);  // queued; fails on the worker
  Tensor r = q + 1.0;           // depends on the failed result
  std::string m = ErrorOf<ValueError>([&] { r.ToVector<int64_t>(); });
  CHECK(Has(m, "div"));
  CHECK(Has(m, "division by zero"));
  CHECK_THROWS_AS(engine::Engine::Get().WaitForAll(), ValueError);
  // The engine keeps working.
  CHECK((a + a).ToVector<int64_t>() == std::vector<int64_t>{2, 4});
  engine::Engine::Get().WaitForAll();
}

TEST_CASE("dispatch: unknown attribute and unknown op are ValueErrors") {
  Tensor a = nd::ones({2});
  CHECK(Has(ErrorOf<ValueError>([&] { Invoke1("sum", {a}, {{"axis", int64_t{0}}}); }), "axes"));
  CHECK(Has(ErrorOf<ValueError>([&] { Invoke1("no_such_op", {a}); }), "no_such_op"));
}

TEST_CASE("dispatch: printing and item") {
  Tensor t = Tensor::FromVector<float>({1, 2.5, 3, 4}, {2, 2});
  std::string s = t.str();
  CHECK(Has(s, "[[1., 2.5],"));
  CHECK(Has(s, "float32"));
  CHECK(Has(ErrorOf<ShapeError>([&] { t.Item(); }), "exactly one"));
  CHECK(Tensor::Scalar(7, DType::kInt64).Item() == 7);
}

TEST_CASE("dispatch: negative sizes are rejected") {
  CHECK_THROWS_AS(nd::zeros(Shape{2, -1}), ShapeError);
}

TEST_CASE("dispatch: an error thrown inside a multithreaded kernel surfaces at the sync point") {
  std::vector<int32_t> a(200000, 7), z(200000, 1);
  z[123456] = 0;
  Tensor q = nd::divide(Tensor::FromVector(a, {200000}), Tensor::FromVector(z, {200000}));
  CHECK(Has(ErrorOf<ValueError>([&] { q.WaitToRead(); }), "division by zero"));
  CHECK_THROWS_AS(engine::Engine::Get().WaitForAll(), ValueError);
  CHECK(nd::sum(Tensor::FromVector(a, {200000})).Item() == 1400000);
}

TEST_CASE("dispatch: writing into a broadcast view is refused") {
  Tensor base = nd::ones({1, 3});
  Tensor view = nd::broadcast_to(base, {4, 3});
  Tensor outs[1] = {view};
  Tensor ins[2] = {nd::ones({4, 3}), nd::ones({4, 3})};
  CHECK(Has(ErrorOf<ValueError>([&] { InvokeInto(ir::FindOp("add"), ins, {}, outs); }), "broadcast view"));
}
