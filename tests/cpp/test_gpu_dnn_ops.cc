// The convolution and pooling ops on GPUs (runtime/gpu_kernels_dnn.cc, over the platform's cuDNN
// calls), through the public eager API with tensors on gpu(0), against the same ops on the CPU:
// conv2d and its two gradients at the geometries cuDNN takes differently (stride, padding,
// dilation, groups, 1x1, asymmetric), max and average pooling and their gradients (ties, padding
// that must never win a max, count_include_pad both ways), batches run in chunks, empty operands,
// dtypes other than float32 refused, and autograd through conv and pooling. Run by CTest's sim2:
// list on two simulated GPUs; on a machine with a real GPU on cuDNN itself.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/error.h"
#include "test_util.h"

using namespace kiln;

namespace kiln {
// runtime/gpu_kernels_dnn.cc: the elements one cuDNN call's batched tensors may hold; returns the
// previous limit.
int64_t SetGpuDnnChunkElementsForTesting(int64_t elements);
} // namespace kiln

namespace {

using V = std::vector<int64_t>;
using kiln::testing::ErrorOf;
using kiln::testing::Has;

Tensor Rand(const Shape& s, uint32_t seed, float lo = -1, float hi = 1) {
  return Tensor::FromVector(kiln::testing::Random(static_cast<size_t>(s.numel()), lo, hi, seed), s);
}

/// Values from {lo, lo + 0.5, ..., hi}: many equal values, so max pooling meets ties.
Tensor Ties(const Shape& s, uint32_t seed, float lo, float hi) {
  std::vector<float> v = kiln::testing::Random(static_cast<size_t>(s.numel()), lo, hi, seed);
  for (float& x : v) x = std::round(x * 2) / 2;
  return Tensor::FromVector(v, s);
}

/// The GPU result against the CPU's, element by element (rtol 1e-5, atol 1e-5).
void CheckSame(const Tensor& on_gpu, const Tensor& on_cpu, const std::string& what) {
  INFO(what);
  REQUIRE(on_gpu.device() == gpu(0));
  REQUIRE(on_gpu.shape() == on_cpu.shape());
  const std::vector<float> g = on_gpu.ToVector<float>(), c = on_cpu.ToVector<float>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same = std::abs(g[i] - c[i]) <= 1e-5 + 1e-5 * std::abs(c[i]);
    if (!same && bad++ == 0) first = static_cast<int64_t>(i);
  }
  CHECK_MESSAGE(bad == 0, bad << " of " << g.size() << " elements differ; first at " << first << ": gpu "
                              << g[static_cast<size_t>(first < 0 ? 0 : first)] << ", cpu "
                              << c[static_cast<size_t>(first < 0 ? 0 : first)]);
}

/// Runs `op` on the CPU inputs and on copies of them on gpu(0); checks the results agree.
Tensor RunBoth(const std::string& op, std::initializer_list<Tensor> in, const ir::Attrs& attrs,
               const std::string& what) {
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : in) on_gpu.push_back(t.To(gpu(0)));
  Tensor c = Invoke(op, std::span<const Tensor>(in.begin(), in.size()), attrs)[0];
  Tensor g = Invoke(op, on_gpu, attrs)[0];
  CheckSame(g, c, what + " (" + op + ")");
  return c;
}

struct ConvCase {
  const char* label;
  Shape x, w;
  V stride, padding, dilation;
  int64_t groups;
};

const ConvCase kConvCases[] = {
    {"stride 2 padding 1", {2, 3, 7, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
    {"dilation 2 padding (2,1)", {1, 2, 8, 7}, {3, 2, 3, 3}, {1, 1}, {2, 1}, {2, 2}, 1},
    {"groups 2 stride (2,1) kernel 3x2", {2, 4, 6, 6}, {6, 2, 3, 2}, {2, 1}, {0, 0}, {1, 1}, 2},
    {"depthwise groups 3 padding 1", {1, 3, 5, 5}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 3},
    {"1x1", {3, 5, 4, 4}, {7, 5, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"stride (1,3) padding (0,2) dilation (1,2)", {2, 2, 5, 9}, {3, 2, 2, 3}, {1, 3}, {0, 2}, {1, 2}, 1},
};

ir::Attrs ConvAttrs(const ConvCase& c) {
  return {{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}, {"groups", c.groups}};
}

/// conv2d and both gradients of case `c` on both devices.
void CheckConv(const ConvCase& c, uint32_t seed) {
  Tensor x = Rand(c.x, seed), w = Rand(c.w, seed + 1);
  const ir::Attrs attrs = ConvAttrs(c);
  Tensor y = RunBoth("conv2d", {x, w}, attrs, c.label);
  Tensor dy = Rand(y.shape(), seed + 2);
  ir::Attrs gd = attrs, gw = attrs;
  gd.items().emplace_back("input_shape", c.x.vec());
  gw.items().emplace_back("weight_shape", c.w.vec());
  RunBoth("conv2d_grad_data", {dy, w}, gd, c.label);
  RunBoth("conv2d_grad_weight", {dy, x}, gw, c.label);
}

struct PoolCase {
  const char* label;
  bool avg;
  Shape x;
  V kernel, stride, padding;
  bool include_pad;
  float lo, hi; // input range; all negative: padding taken as 0 would win a max
};

const PoolCase kPoolCases[] = {
    {"max kernel 2", false, {2, 3, 4, 6}, {2, 2}, {}, {0, 0}, true, -2, 2},
    {"max kernel 3 stride 2 padding 1, negative inputs",
     false,
     {2, 2, 7, 6},
     {3, 3},
     {2, 2},
     {1, 1},
     true,
     -3,
     -1},
    {"max kernel (2,3) stride 1 padding (1,1), overlapping ties",
     false,
     {1, 2, 5, 5},
     {2, 3},
     {1, 1},
     {1, 1},
     true,
     -1,
     1},
    {"avg kernel 2 floor mode", true, {2, 2, 5, 5}, {2, 2}, {}, {0, 0}, true, -1, 1},
    {"avg kernel 3 stride 2 padding 1 count_include_pad",
     true,
     {1, 3, 7, 6},
     {3, 3},
     {2, 2},
     {1, 1},
     true,
     -1,
     1},
    {"avg kernel 3 stride 2 padding 1 exclude pad", true, {1, 3, 7, 6}, {3, 3}, {2, 2}, {1, 1}, false, -1, 1},
    {"avg kernel (3,2) stride (1,2) padding (1,1) exclude pad",
     true,
     {2, 1, 5, 6},
     {3, 2},
     {1, 2},
     {1, 1},
     false,
     -1,
     1},
};

ir::Attrs PoolAttrs(const PoolCase& c) {
  ir::Attrs a = {{"kernel", c.kernel}, {"stride", c.stride}, {"padding", c.padding}};
  if (c.avg) a.items().emplace_back("count_include_pad", c.include_pad);
  return a;
}

/// A pooling op and its gradient of case `c` on both devices.
void CheckPool(const PoolCase& c, uint32_t seed) {
  Tensor x = Ties(c.x, seed, c.lo, c.hi);
  const ir::Attrs attrs = PoolAttrs(c);
  Tensor y = RunBoth(c.avg ? "avg_pool2d" : "max_pool2d", {x}, attrs, c.label);
  Tensor dy = Rand(y.shape(), seed + 1);
  if (c.avg) {
    ir::Attrs g = attrs;
    g.items().emplace_back("input_shape", c.x.vec());
    RunBoth("avg_pool2d_grad", {dy}, g, c.label);
  } else {
    RunBoth("max_pool2d_grad", {dy, x}, attrs, c.label);
  }
}

/// Lowers the chunk limit of the cuDNN calls for one scope.
struct ChunkLimit {
  explicit ChunkLimit(int64_t elements) : old(SetGpuDnnChunkElementsForTesting(elements)) {}
  ~ChunkLimit() { SetGpuDnnChunkElementsForTesting(old); }
  int64_t old;
};

} // namespace

TEST_CASE("gpu: conv2d and its two gradients match the CPU (stride, padding, dilation, groups, 1x1)") {
  KILN_REQUIRE_GPU();
  uint32_t seed = 100;
  for (const ConvCase& c : kConvCases) CheckConv(c, seed += 10);
}

TEST_CASE("gpu: max and avg pooling and their gradients match the CPU (ties, padding, count_include_pad)") {
  KILN_REQUIRE_GPU();
  uint32_t seed = 200;
  for (const PoolCase& c : kPoolCases) CheckPool(c, seed += 10);
}

TEST_CASE("gpu: conv2d with bias, and strided inputs, through nd:: match the CPU") {
  KILN_REQUIRE_GPU();
  Tensor x = Rand({2, 3, 6, 6}, 301), w = Rand({4, 3, 3, 3}, 302), b = Rand({4}, 303);
  nd::Conv2dOptions o;
  o.stride = {2, 1}, o.padding = {1, 1};
  Tensor c = nd::conv2d(x, w, b, o);
  CheckSame(nd::conv2d(x.To(gpu(0)), w.To(gpu(0)), b.To(gpu(0)), o), c, "conv2d with bias");
  // A transposed (non-contiguous) input is made contiguous before cuDNN sees it.
  Tensor xt = Rand({2, 3, 6, 6}, 304);
  Tensor cpu_t = nd::transpose(xt, {0, 1, 3, 2});
  Tensor gpu_t = nd::transpose(xt.To(gpu(0)), {0, 1, 3, 2});
  CheckSame(nd::max_pool2d(gpu_t, {3, 3}, {2, 2}, {1, 1}), nd::max_pool2d(cpu_t, {3, 3}, {2, 2}, {1, 1}),
            "max_pool2d of a transposed input");
  CheckSame(nd::conv2d(gpu_t, w.To(gpu(0))), nd::conv2d(cpu_t, w), "conv2d of a transposed input");
}

TEST_CASE("gpu: batches past cuDNN's element limit run in chunks with the same results") {
  KILN_REQUIRE_GPU();
  // 100 elements per call: x (5, 2, 4, 4) is 32 per sample, y (5, 3, 4, 4) 48, so chunks of 2 samples
  // (3 calls; the filter gradient accumulates over them), pooling of (5, 3, 4, 4) chunks of 2.
  ChunkLimit limit(100);
  CheckConv({"chunked", {5, 2, 4, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1}, 400);
  CheckPool({"max chunked", false, {5, 3, 4, 4}, {2, 2}, {1, 1}, {1, 1}, true, -1, 1}, 410);
  CheckPool({"avg chunked", true, {5, 3, 4, 4}, {3, 3}, {1, 1}, {1, 1}, false, -1, 1}, 420);
  // One sample over the limit is a ShapeError that says what to do.
  Tensor x = Rand({1, 8, 4, 4}, 430).To(gpu(0));
  const std::string e = ErrorOf<ShapeError>([&] { nd::max_pool2d(x, {2, 2}).ToVector<float>(); });
  CHECK_MESSAGE((Has(e, "a sample of the tensor (1, 8, 4, 4) has 128 elements") && Has(e, "kiln.cpu()")), e);
}

TEST_CASE("gpu: empty conv and pooling operands give what the CPU gives") {
  KILN_REQUIRE_GPU();
  // No samples: an empty output.
  Tensor e =
      nd::conv2d(Tensor::Empty({0, 2, 5, 5}, DType::kFloat32, gpu(0)), Rand({3, 2, 3, 3}, 501).To(gpu(0)));
  CHECK(e.shape() == Shape{0, 3, 3, 3});
  e.WaitToRead();
  // No input channels: every sum is empty, so zeros.
  Tensor x0 = Tensor::Empty({2, 0, 5, 5}, DType::kFloat32), w0 = Tensor::Empty({3, 0, 3, 3}, DType::kFloat32);
  RunBoth("conv2d", {x0, w0}, {}, "no input channels");
  // No samples for the filter gradient: zeros.
  RunBoth("conv2d_grad_weight",
          {Tensor::Empty({0, 3, 3, 3}, DType::kFloat32), Tensor::Empty({0, 2, 5, 5}, DType::kFloat32)},
          {{"weight_shape", V{3, 2, 3, 3}}}, "no samples");
  // An empty plane under padding: windows of padding only (zeros, as the CPU kernels write).
  Tensor p0 = Tensor::Empty({1, 2, 0, 0}, DType::kFloat32);
  Tensor m = RunBoth("max_pool2d", {p0}, {{"kernel", V{2, 2}}, {"padding", V{1, 1}}}, "empty plane");
  CHECK(m.shape() == Shape{1, 2, 1, 1});
  RunBoth("avg_pool2d", {p0}, {{"kernel", V{2, 2}}, {"padding", V{1, 1}}}, "empty plane");
}

TEST_CASE("gpu: conv2d and pooling on dtypes other than float32 are a DTypeError naming float32") {
  KILN_REQUIRE_GPU();
  Tensor x = Rand({1, 2, 5, 5}, 601).AsType(DType::kFloat64).To(gpu(0));
  Tensor w = Rand({3, 2, 3, 3}, 602).AsType(DType::kFloat64).To(gpu(0));
  for (const std::string& e : {ErrorOf<DTypeError>([&] { nd::conv2d(x, w); }), ErrorOf<DTypeError>([&] {
                                 nd::max_pool2d(x, {2, 2});
                               }),
                               ErrorOf<DTypeError>([&] {
                                 nd::avg_pool2d(x, {2, 2});
                               })})
    CHECK_MESSAGE((Has(e, "GPU kernel takes float32") && Has(e, "float64") && Has(e, "kiln.cpu()")), e);
}

TEST_CASE("gpu: autograd through conv2d, bias and pooling on the GPU matches the CPU") {
  KILN_REQUIRE_GPU();
  Tensor x = Rand({2, 3, 8, 8}, 701), w = Rand({4, 3, 3, 3}, 702), b = Rand({4}, 703);
  Tensor head = Rand({2, 4, 3, 3}, 704);
  struct Grads {
    Tensor x, w, b;
  };
  auto run = [&](Device d) {
    Tensor xd = x.To(d, true), wd = w.To(d, true), bd = b.To(d, true);
    for (Tensor* t : {&xd, &wd, &bd}) t->AttachGrad();
    {
      autograd::RecordScope rec;
      nd::Conv2dOptions o;
      o.padding = {1, 1};
      Tensor h = nd::max_pool2d(nd::conv2d(xd, wd, bd, o), {2, 2});                      // (2, 4, 4, 4)
      Tensor y = nd::avg_pool2d(h, {3, 3}, {1, 1}, {1, 1}, /*count_include_pad=*/false); // (2, 4, 4, 4)
      y = nd::max_pool2d(y, {2, 2}, {1, 1});                                             // (2, 4, 3, 3)
      y.Backward(head.To(d));
    }
    return Grads{xd.grad(), wd.grad(), bd.grad()};
  };
  Grads c = run(cpu()), g = run(gpu(0));
  CheckSame(g.x, c.x, "dx");
  CheckSame(g.w, c.w, "dw");
  CheckSame(g.b, c.b, "db");
}

TEST_CASE("gpu: max_pool2d_grad's recomputed forward output is a caching-allocator block given back") {
  KILN_REQUIRE_GPU();
  Tensor x = Rand({2, 3, 8, 8}, 801).To(gpu(0)), dy = Rand({2, 3, 4, 4}, 802).To(gpu(0));
  x.WaitToRead(), dy.WaitToRead();
  Allocator& a = GetAllocator(gpu(0));
  const AllocatorStats before = a.Stats();
  Tensor dx = Invoke1("max_pool2d_grad", {dy, x}, {{"kernel", V{2, 2}}});
  dx.WaitToRead();
  const AllocatorStats after = a.Stats();
  CHECK(after.num_allocs - before.num_allocs == 2); // dx, and y for cuDNN's backward call
  CHECK(after.bytes_in_use - before.bytes_in_use ==
        static_cast<int64_t>(RoundAllocationSize(dx.shape().numel() * sizeof(float)))); // y went back
}
