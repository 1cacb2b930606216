// Shapes whose element or byte count does not fit 64 bits (issue 17): Shape::numel and NumBytes
// refuse them, so does every op's inference (creation, broadcast, reshape, convolution and pooling
// windows), and the allocators refuse absurd sizes with a MemoryError that names the device and
// the size. Before, such shapes got a wrapped-around tiny buffer that the kernels wrote past.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "gpu_skip.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/ir/op.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/shape.h"
#include "test_util.h"

using kiln::DType;
using kiln::MemoryError;
using kiln::Shape;
using kiln::ShapeError;
using kiln::Tensor;
using kiln::ValueError;
using kiln::testing::Contains;
using kiln::testing::ErrorOf;
namespace nd = kiln::nd;

namespace {
constexpr int64_t P(int e) { return int64_t{1} << e; }
}  // namespace

TEST_CASE("shape overflow: numel refuses an element count past 64 bits") {
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{0, 5}.numel() == 0);
  CHECK(Shape{P(31), P(31)}.numel() == P(62));
  std::string msg = ErrorOf<ShapeError>([] { (void)Shape{P(33), P(31)}.numel(); });
  INFO(msg);
  CHECK(Contains(msg, "(8589934592, 2147483648)"));  // found
  CHECK(Contains(msg, "more elements than fit in 64 bits"));
  CHECK(Contains(msg, "expected a shape whose sizes multiply"));
  // As NumPy: a zero dimension does not make an overflowing product of the others valid.
  CHECK_THROWS_AS((void)Shape({P(62), 4, 0}).numel(), ShapeError);
  CHECK_THROWS_AS((void)Shape({0, P(62), 4}).numel(), ShapeError);
}

TEST_CASE("shape overflow: NumBytes refuses a byte count past 64 bits") {
  CHECK(Shape{P(60)}.NumBytes(4) == P(62));
  CHECK(Shape{3, 0}.NumBytes(8) == 0);
  std::string msg = ErrorOf<ShapeError>([] { (void)Shape{P(61)}.NumBytes(8); });
  INFO(msg);
  CHECK(Contains(msg, "(2305843009213693952,)"));
  CHECK(Contains(msg, "8-byte elements"));
  CHECK(Contains(msg, "more bytes than fit in 64 bits"));
}

TEST_CASE("shape overflow: strides of a huge shape do not overflow") {
  Shape s = Shape{P(40), P(30)}.ContiguousStrides();
  CHECK(s == Shape{P(30), 1});
}

TEST_CASE("shape overflow: creation ops refuse wrapped sizes") {
  std::string msg = ErrorOf<ShapeError>([] { nd::zeros(Shape{P(61)}, DType::kFloat64); });
  INFO(msg);
  CHECK(Contains(msg, "full: the output shape (2305843009213693952,)"));
  CHECK(Contains(msg, "more bytes than fit in 64 bits"));
  msg = ErrorOf<ShapeError>([] { nd::full(Shape{P(33), P(31)}, 7.0); });
  CHECK(Contains(msg, "full: the output shape (8589934592, 2147483648) has more elements"));
  msg = ErrorOf<ShapeError>([] { nd::ones(Shape{P(62), 4}); });
  CHECK(Contains(msg, "(4611686018427387904, 4)"));
  msg = ErrorOf<ShapeError>([] { nd::random::normal(0, 1, Shape{P(32), P(32)}); });
  CHECK(Contains(msg, "normal: the output shape (4294967296, 4294967296)"));
  msg = ErrorOf<ShapeError>([] { nd::arange(0, 1e300); });
  CHECK(Contains(msg, "arange: start=0 stop=1e+300"));
  CHECK(Contains(msg, "expected fewer than 2^62"));
  CHECK_THROWS_AS(nd::zeros(Shape{-1, 4}), ShapeError);  // negative sizes stay refused
}

TEST_CASE("shape overflow: broadcast and reshape refuse wrapped sizes") {
  Tensor a = nd::zeros(Shape{1, 1});
  std::string msg = ErrorOf<ShapeError>([&] { nd::broadcast_to(a, {P(32), P(32)}); });
  CHECK(Contains(msg, "broadcast_to: the output shape (4294967296, 4294967296)"));
  // Zero-stride views of 2^32 elements each are fine; their broadcast sum is not.
  Tensor col = nd::broadcast_to(a, {P(32), 1}), row = nd::broadcast_to(a, {1, P(32)});
  msg = ErrorOf<ShapeError>([&] { nd::add(col, row); });
  CHECK(Contains(msg, "add: the output shape (4294967296, 4294967296) has more elements"));
  msg = ErrorOf<ShapeError>([&] { nd::reshape(nd::zeros(Shape{4}), {P(62), 4, -1}); });
  INFO(msg);
  CHECK(Contains(msg, "reshape: the sizes of (4611686018427387904, 4, -1) multiply to more elements"));
  CHECK(Contains(msg, "expected a shape with 4 elements like (4,)"));
  msg = ErrorOf<ShapeError>([&] { nd::reshape(nd::zeros(Shape{4}), {P(32), P(32), 4}); });
  CHECK(Contains(msg, "more elements than fit in 64 bits"));
}

TEST_CASE("shape overflow: convolution windows with huge stride, dilation or padding") {
  Tensor x = nd::ones(Shape{1, 1, 5, 5}), w = nd::ones(Shape{1, 1, 3, 3});
  nd::Conv2dOptions o;
  o.dilation = {P(62), 1};  // oneDNN and cuDNN take 32-bit window sizes
  std::string msg = ErrorOf<ValueError>([&] { nd::conv2d(x, w, Tensor(), o); });
  INFO(msg);
  CHECK(Contains(msg, "conv2d: attribute 'dilation' must be in [1, 2147483647], found [4611686018427387904, 1]"));
  o.dilation = {1, 1};
  o.padding = {1, P(62)};
  msg = ErrorOf<ValueError>([&] { nd::conv2d(x, w, Tensor(), o); });
  CHECK(Contains(msg, "conv2d: attribute 'padding' must be in [0, 2147483647]"));
  o.padding = {0, 0};
  o.stride = {P(40), 1};
  msg = ErrorOf<ValueError>([&] { nd::conv2d(x, w, Tensor(), o); });
  CHECK(Contains(msg, "conv2d: attribute 'stride' must be in [1, 2147483647], found [1099511627776, 1]"));
  o.stride = {1, 1};
  o.dilation = {P(31) - 1, 1};  // a representable window larger than the input
  msg = ErrorOf<ShapeError>([&] { nd::conv2d(x, w, Tensor(), o); });
  CHECK(Contains(msg, "conv2d: the height window (4294967295 with dilation) is larger than the padded input"));
  o.dilation = {1, 1};
  o.stride = {P(31) - 1, P(31) - 1};  // the largest stride is valid: one window per axis
  Tensor y = nd::conv2d(x, w, Tensor(), o);
  CHECK(y.shape() == Shape{1, 1, 1, 1});
  CHECK(y.ToVector<float>() == std::vector<float>{9.0f});
}

TEST_CASE("shape overflow: the window arithmetic itself refuses to wrap") {
  // A weight tensor of 2^62 rows in its kernel is out of reach, so call the op's inference.
  const kiln::ir::OpDef& conv = kiln::ir::GetOp(kiln::ir::FindOp("conv2d"));
  kiln::ir::TensorType xt{Shape{1, 1, 5, 5}, DType::kFloat32}, wt{Shape{1, 1, P(62), 3}, DType::kFloat32};
  kiln::ir::Attrs a = conv.Resolve({{"dilation", std::vector<int64_t>{4, 1}}});
  kiln::ir::TensorType in[] = {xt, wt};
  std::string msg = ErrorOf<ShapeError>([&] { conv.Infer(in, a); });
  INFO(msg);
  CHECK(Contains(msg, "conv2d: the height window (kernel 4611686018427387904, dilation 4)"));
  CHECK(Contains(msg, "expected a dilated window and a padded input below 2^63"));
  const int64_t huge = std::numeric_limits<int64_t>::max() - 10;
  kiln::ir::TensorType big{Shape{1, 1, huge, 5}, DType::kFloat32}, w3{Shape{1, 1, 3, 3}, DType::kFloat32};
  kiln::ir::TensorType in2[] = {big, w3};
  a = conv.Resolve({{"padding", std::vector<int64_t>{P(31) - 1, 0}}});
  msg = ErrorOf<ShapeError>([&] { conv.Infer(in2, a); });
  CHECK(Contains(msg, "over the input of size 9223372036854775797 with padding 2147483647 is out of range"));
}

TEST_CASE("shape overflow: pooling windows with huge kernel, stride or padding") {
  Tensor x = nd::ones(Shape{1, 1, 4, 4});
  std::string msg = ErrorOf<ValueError>([&] { nd::max_pool2d(x, {P(62), 2}); });
  CHECK(Contains(msg, "max_pool2d: attribute 'kernel' must be in [1, 2147483647]"));
  msg = ErrorOf<ShapeError>([&] { nd::max_pool2d(x, {P(31) - 1, 2}); });
  CHECK(Contains(msg, "max_pool2d: the height window (2147483647 with dilation) is larger"));
  msg = ErrorOf<ValueError>([&] { nd::max_pool2d(x, {2, 2}, {}, {P(30), 0}); });
  CHECK(Contains(msg, "must be at most half the kernel"));
  Tensor y = nd::avg_pool2d(x, {2, 2}, {P(31) - 1, P(31) - 1});
  CHECK(y.shape() == Shape{1, 1, 1, 1});
  CHECK(y.ToVector<float>() == std::vector<float>{1.0f});
}

TEST_CASE("shape overflow: the CPU allocator refuses absurd sizes naming the device") {
  kiln::Allocator& a = kiln::GetAllocator(kiln::cpu(9));
  std::string msg = ErrorOf<MemoryError>([&] { a.Allocate(size_t{1} << 61); });
  INFO(msg);
  CHECK(Contains(msg, "cannot allocate 2305843009213693952 bytes on cpu(9)"));
  CHECK(Contains(msg, "expected at most 1152921504606846976 bytes"));
  // 1 PiB: a valid size that no machine can give, more than x86-64's 128 TiB of user address
  // space (1 TiB was not enough: a 128 GiB machine that overcommits memory gave it)
  msg = ErrorOf<MemoryError>([&] { a.Allocate(size_t{1} << 50); });
  CHECK(Contains(msg, "out of memory on cpu(9) allocating 1125899906842624 bytes"));
  msg = ErrorOf<MemoryError>([] { nd::zeros(Shape{P(61)}, DType::kUInt8); });
  CHECK(Contains(msg, "cannot allocate 2305843009213693952 bytes on cpu(0)"));
}

TEST_CASE("gpu allocator: an absurd size raises MemoryError naming the device") {
  KILN_REQUIRE_GPU();
  kiln::Allocator& a = kiln::GetAllocator(kiln::gpu(0));
  std::string msg = ErrorOf<MemoryError>([&] { a.Allocate(size_t{1} << 61); });
  INFO(msg);
  CHECK(Contains(msg, "cannot allocate 2305843009213693952 bytes on gpu(0)"));
  msg = ErrorOf<MemoryError>([&] { a.Allocate(size_t{1} << 50); });  // 1 PiB: no GPU has it
  CHECK(Contains(msg, "out of memory on gpu(0) allocating 1125899906842624 bytes"));
  msg = ErrorOf<ShapeError>([] { nd::zeros(Shape{P(33), P(31)}, DType::kFloat32, kiln::gpu(0)); });
  CHECK(Contains(msg, "(8589934592, 2147483648) has more elements"));
}
