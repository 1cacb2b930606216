// GPU kernels of the indexing and joining ops (issue 15), hand-written in codegen/cu/index.cu and
// matching the CPU kernels (runtime/cpu/movement.cc, reduce.cc, elementwise.cc) exactly:
// - concat, stack, split, slice_grad: strided copies by element size, any dtype, strided inputs;
// - where: any condition dtype, any value dtype, broadcasting and strided operands;
// - argmax, argmin: any dtype, strided input; the first NaN, else the first extremum;
// - take, one_hot: any data dtype, int32 or int64 indices (contiguous, as on the CPU);
// - take_grad: any floating gradient, deterministic (sorted indices, no float atomics), the
//   CPU's sums bit for bit (16-bit floats rounded at each step, as there).
// take and take_grad raise the CPU's ValueError for an index out of range (one_hot with
// labels=true for a class label outside [0, depth)): a kernel records the
// first bad position, the kernel function copies it back and waits for its stream (one host
// sync per call); meanwhile the gather clips, so nothing reads out of bounds. Iteration spaces
// are coalesced to at most kGpuIndexDims dims (else a DeviceError that says what to do).
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/codegen/cu_modules.h"
#include "kiln/codegen/ptx.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/movement.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"
#include "gpu_launch.h"

namespace kiln::codegen {
namespace {

constexpr int kD = kGpuIndexDims;
constexpr int kArgThreads = 256;  // ArgBlocks' block size (codegen/cu/index.cu)

// ---- helpers -----------------------------------------------------------------------------------

/// An iteration space of the strided kernels: a shape with its size-1 dims dropped and neighbours
/// merged where every operand's strides allow it, padded in front to kD dims (size 1, stride 0).
struct Space {
  int64_t n[kD];
  int64_t s[4][kD];
  int operands = 0;

  /// Appends the addresses of n, then of each operand's strides, to kernel arguments.
  void Args(std::vector<void*>& args) {
    for (int i = 0; i < kD; ++i) args.push_back(&n[i]);
    for (int k = 0; k < operands; ++k)
      for (int i = 0; i < kD; ++i) args.push_back(&s[k][i]);
  }
};

Space MakeSpace(const OpInfo& op, const Shape& shape, std::initializer_list<const Strides*> strides) {
  std::vector<int64_t> n;
  std::vector<std::vector<int64_t>> s(strides.size());
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == 1) continue;
    bool merge = !n.empty();
    size_t k = 0;
    for (const Strides* st : strides) merge = merge && s[k++].back() == (*st)[i] * shape[i];
    if (merge) n.back() *= shape[i];
    else n.push_back(shape[i]);
    k = 0;
    for (const Strides* st : strides) {
      if (merge) s[k].back() = (*st)[i];
      else s[k].push_back((*st)[i]);
      ++k;
    }
  }
  if (static_cast<int>(n.size()) > kD)
    KILN_THROW(DeviceError) << op.name << ": GPU kernels index at most " << kD << " dims of a strided tensor; "
                            << "this one has shape " << shape.str() << " (" << n.size()
                            << " dims that cannot be merged). Make the input contiguous (copy), reshape it to "
                               "fewer dims, or run the op on kiln.cpu()";
  Space sp;
  sp.operands = static_cast<int>(strides.size());
  const size_t pad = static_cast<size_t>(kD) - n.size();
  for (size_t i = 0; i < static_cast<size_t>(kD); ++i) {
    sp.n[i] = i < pad ? 1 : n[i - pad];
    for (size_t k = 0; k < s.size(); ++k) sp.s[k][i] = i < pad ? 0 : s[k][i - pad];
  }
  return sp;
}

std::string Bytes(const TensorView& v) { return std::to_string(DTypeSize(v.dtype)); }

int64_t Prod(const Shape& s, int b, int e) {
  int64_t n = 1;
  for (int i = b; i < e; ++i) n *= s[i];
  return n;
}

/// `v` moved by `elems` elements.
TensorView Shifted(const TensorView& v, int64_t elems) {
  TensorView r = v;
  r.data = static_cast<char*>(v.data) + elems * static_cast<int64_t>(DTypeSize(v.dtype));
  return r;
}

/// Device memory for one kernel function's intermediate results (KernelScratch: the running
/// plan's region, else the device's cache), returned when the function ends.
class Scratch : public KernelScratch {
 public:
  using KernelScratch::KernelScratch;
  int64_t* i64(size_t at = 0) const { return static_cast<int64_t*>(data()) + at; }
};

/// dst = 0 (contiguous, any dtype: zero bits are 0, 0.0 and false).
void Zero(const Device& d, void* dst, int64_t n, const std::string& bytes) {
  if (n == 0) return;
  void* fn = CuKernel(d, "index", "kiln_index_zero_e" + bytes);
  void* args[] = {&dst, &n};
  LaunchGridStride(fn, n, args);
}

/// dst = src, same shape and dtype, any strides on both sides.
void CopyView(const KernelArgs& a, const TensorView& src, const TensorView& dst) {
  KILN_CHECK(src.shape == dst.shape && src.dtype == dst.dtype) << a.op.name << ": copy " << src.shape.str() << " -> "
                                                               << dst.shape.str();
  int64_t n = src.numel();
  if (n == 0) return;
  if (src.is_contiguous() && dst.is_contiguous()) {
    cuda::CopyAsync(dst.data, src.data, static_cast<size_t>(n) * DTypeSize(src.dtype), cuda::CopyKind::kDeviceToDevice);
    return;
  }
  Space sp = MakeSpace(a.op, src.shape, {&src.strides, &dst.strides});
  void* fn = CuKernel(a.device, "index", "kiln_index_copy_e" + Bytes(src));
  void* d = dst.data;
  void* s = src.data;
  std::vector<void*> args = {&d, &s, &n};
  sp.Args(args);
  LaunchGridStride(fn, n, args.data());
}

/// "i32" or "i64" for an index tensor; the CPU's DTypeError otherwise.
std::string IndexSuffix(const TensorView& ix, const char* op) {
  if (ix.dtype == DType::kInt32) return "i32";
  if (ix.dtype == DType::kInt64) return "i64";
  KILN_THROW(DTypeError) << op << ": indices must be int32 or int64, found " << DTypeName(ix.dtype);
}

/// Launches the index check of `ix` against an axis of size `dim` into flag (zeroed first).
void LaunchCheck(const Device& d, const TensorView& ix, int64_t dim, int64_t* flag, const char* op) {
  int64_t n = ix.numel();
  Zero(d, flag, 1, "8");
  void* fn = CuKernel(d, "index", "kiln_check_indices_" + IndexSuffix(ix, op));
  void* p = ix.data;
  void* f = flag;
  void* args[] = {&p, &n, &dim, &f};
  LaunchGridStride(fn, n, args);
}

/// Records the first index `flag` holds (a check against `limit`: LaunchCheck, or one_hot's of
/// labels) in the device's error record, without waiting: the host raises the CPU's ValueError
/// for it at its next sync point (cuda::RaiseDeferredDeviceErrors; host::RaiseBadIndex,
/// RaiseBadLabel). No host sync: a plan that gathers (an embedding) or has a loss in it is
/// captured into a CUDA graph like any other. A bad index reads a clipped row meanwhile, never
/// memory outside the operand.
void RecordFirstBad(const Device& d, const TensorView& ix, int64_t limit, int axis, const int64_t* flag,
                    cuda::DeferredCheck kind, const char* op) {
  int64_t n = ix.numel(), k = static_cast<int64_t>(kind), ax = axis;
  void* p = ix.data;
  void* f = const_cast<int64_t*>(flag);
  void* record = cuda::DeviceErrorRecord(d);
  void* args[] = {&p, &n, &limit, &f, &record, &k, &ax};
  LaunchGridStride(CuKernel(d, "index", "kiln_record_first_bad_" + IndexSuffix(ix, op)), 1, args);
  cuda::PublishDeviceErrors(d);
}

/// Checks the class labels against [0, depth) without waiting (RecordFirstBad).
void CheckLabelsDeferred(const Device& d, const TensorView& ix, int64_t depth) {
  int64_t n = ix.numel();
  Scratch flag(d, sizeof(int64_t));
  Zero(d, flag.i64(), 1, "8");
  void* p = ix.data;
  void* f = flag.i64();
  void* args[] = {&p, &n, &depth, &f};
  LaunchGridStride(CuKernel(d, "index", "kiln_check_labels_" + IndexSuffix(ix, "one_hot")), n, args);
  RecordFirstBad(d, ix, depth, -1, flag.i64(), cuda::DeferredCheck::kBadLabel, "one_hot");
}

// ---- concat / stack / split / slice_grad -------------------------------------------------------

/// Copies each part into its window of `out` along `axis`.
void Join(const KernelArgs& a, std::span<const TensorView> parts, int axis) {
  const TensorView& out = a.out[0];
  int64_t pos = 0;
  for (const TensorView& v : parts) {
    TensorView dst = Shifted(out, pos * out.strides[axis]);
    dst.shape = v.shape;
    CopyView(a, v, dst);
    pos += v.shape[axis];
  }
}

void ConcatGpu(const KernelArgs& a) { Join(a, a.in, NormalizeAxis(a.attrs.Int("axis"), a.out[0].rank(), "concat")); }

void StackGpu(const KernelArgs& a) {
  const int axis = NormalizeAxis(a.attrs.Int("axis"), a.out[0].rank(), "stack");
  std::vector<TensorView> parts(a.in.begin(), a.in.end());
  for (TensorView& p : parts) {  // each part with the new axis, of size 1
    const int64_t stride = axis < p.rank() ? p.strides[axis] * p.shape[axis] : 1;
    p.shape.insert(axis, 1);
    p.strides.insert(axis, stride);
  }
  Join(a, parts, axis);
}

void SplitGpu(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const int axis = NormalizeAxis(a.attrs.Int("axis"), in.rank(), "split");
  int64_t pos = 0;
  for (const TensorView& v : a.out) {
    TensorView src = Shifted(in, pos * in.strides[axis]);
    src.shape = v.shape;
    CopyView(a, src, v);
    pos += v.shape[axis];
  }
}

/// y = zeros with dy written into the slice of y that slice's attributes select.
void SliceGradGpu(const KernelArgs& a) {
  const TensorView& y = a.out[0];
  KILN_CHECK(y.is_contiguous()) << "slice_grad: the output is contiguous";
  Zero(a.device, y.data, y.numel(), Bytes(y));
  auto axes = NormalizeSlice(y.shape, a.attrs.Ints("begin"), a.attrs.Ints("end"), a.attrs.Ints("step"), "slice_grad");
  int64_t offset = 0;
  TensorView dst = y;
  for (int i = 0; i < y.rank(); ++i) {
    offset += axes[static_cast<size_t>(i)].begin * y.strides[i];
    dst.strides[i] *= axes[static_cast<size_t>(i)].step;
  }
  dst = Shifted(dst, offset);
  dst.shape = a.in[0].shape;
  CopyView(a, a.in[0], dst);
}

// ---- where ---------------------------------------------------------------------------------------

std::string CondSuffix(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat64: return "f64";
    case DType::kInt32: return "i32";
    case DType::kInt64: return "i64";
    case DType::kFloat16:
    case DType::kBFloat16: return "h16";
    case DType::kUInt8:
    case DType::kBool: return "b8";
  }
  return "";
}

void WhereGpu(const KernelArgs& a) {
  const TensorView &c = a.in[0], &x = a.in[1], &y = a.in[2], &out = a.out[0];
  KILN_CHECK(out.is_contiguous() && x.dtype == out.dtype && y.dtype == out.dtype) << "where: output";
  int64_t n = out.numel();
  if (n == 0) return;
  const Strides sc = host::BroadcastStrides(c.shape, c.strides, out.shape);
  const Strides sx = host::BroadcastStrides(x.shape, x.strides, out.shape);
  const Strides sy = host::BroadcastStrides(y.shape, y.strides, out.shape);
  Space sp = MakeSpace(a.op, out.shape, {&sc, &sx, &sy});
  void* fn = CuKernel(a.device, "index", "kiln_where_" + CondSuffix(c.dtype) + "_e" + Bytes(out));
  void *o = out.data, *pc = c.data, *px = x.data, *py = y.data;
  std::vector<void*> args = {&o, &pc, &px, &py, &n};
  sp.Args(args);
  LaunchGridStride(fn, n, args.data());
}

// ---- argmax / argmin -------------------------------------------------------------------------------

std::string ValueSuffix(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat64: return "f64";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt32: return "i32";
    case DType::kInt64: return "i64";
    case DType::kUInt8:
    case DType::kBool: return "u8";
  }
  return "";
}

/// Rows of the kept dims, each `len` long along the axis: a thread per row, or a block per row
/// when rows are long (or too few to fill a GPU with threads).
template <bool kMax>
void ArgReduceGpu(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_CHECK(out.is_contiguous() && out.dtype == DType::kInt64) << a.op.name << ": output must be contiguous int64";
  int64_t rows = out.numel();
  if (rows == 0) return;
  const int axis = NormalizeAxis(a.attrs.Int("axis"), x.rank(), a.op.name.c_str());
  int64_t len = 1, sa = 0;
  Shape kept;
  Strides kept_strides;
  for (int i = 0; i < x.rank(); ++i) {
    if (i == axis) {
      len = x.shape[i];
      sa = x.strides[i];
    } else {
      kept.push_back(x.shape[i]);
      kept_strides.push_back(x.strides[i]);
    }
  }
  KILN_CHECK(len > 0) << a.op.name << " over a zero-size axis";
  Space sp = MakeSpace(a.op, kept, {&kept_strides});
  const bool blocks = len >= 512 || (len >= 64 && rows < 2048);
  void* fn = CuKernel(a.device, "index",
                      std::string("kiln_") + (kMax ? "argmax" : "argmin") + (blocks ? "_blocks_" : "_rows_") +
                          ValueSuffix(x.dtype));
  void *o = out.data, *p = x.data;
  std::vector<void*> args = {&o, &p, &rows, &len, &sa};
  sp.Args(args);
  if (blocks)
    cuda::LaunchKernel(fn, static_cast<unsigned>(std::min<int64_t>(rows, 4096)), kArgThreads, 0, args.data());
  else
    LaunchGridStride(fn, rows, args.data());
}

// ---- take / take_grad / one_hot ------------------------------------------------------------------

void TakeGpu(const KernelArgs& a) {
  const TensorView &x = a.in[0], &ix = a.in[1], &out = a.out[0];
  KILN_CHECK(x.is_contiguous() && ix.is_contiguous() && out.is_contiguous());
  const int axis = NormalizeAxis(a.attrs.Int("axis"), x.rank(), "take");
  int64_t outer = Prod(x.shape, 0, axis), dim = x.shape[axis], inner = Prod(x.shape, axis + 1, x.rank());
  int64_t n = ix.numel();
  const std::string suffix = IndexSuffix(ix, "take");
  if (n == 0) return;
  Scratch flag(a.device, sizeof(int64_t));
  LaunchCheck(a.device, ix, dim, flag.i64(), "take");
  if (dim > 0 && outer * n * inner > 0) {
    void* fn = CuKernel(a.device, "index", "kiln_take_e" + Bytes(x) + "_" + suffix);
    void *o = out.data, *p = x.data, *q = ix.data;
    void* args[] = {&o, &p, &q, &outer, &n, &dim, &inner};
    LaunchGridStride(fn, outer * n * inner, args);
  }
  RecordFirstBad(a.device, ix, dim, axis, flag.i64(), cuda::DeferredCheck::kBadTakeIndex, "take");
}

/// dx = zeros with dy's rows added at the indices along axis: the (row, position) keys sorted,
/// then each output element sums its row's run in position order (the CPU's order).
void TakeGradGpu(const KernelArgs& a) {
  const TensorView &dy = a.in[0], &ix = a.in[1], &dx = a.out[0];
  KILN_CHECK(dy.is_contiguous() && ix.is_contiguous() && dx.is_contiguous());
  const int axis = NormalizeAxis(a.attrs.Int("axis"), dx.rank(), "take_grad");
  int64_t outer = Prod(dx.shape, 0, axis), dim = dx.shape[axis], inner = Prod(dx.shape, axis + 1, dx.rank());
  int64_t n = ix.numel();
  const std::string suffix = IndexSuffix(ix, "take_grad");
  const std::string value = ValueSuffix(dy.dtype);
  KILN_CHECK(IsFloat(dy.dtype)) << "take_grad: dtypes unchecked";
  const int64_t total = outer * dim * inner;
  if (n == 0 || outer * inner == 0) {
    Zero(a.device, dx.data, total, Bytes(dx));
    if (n > 0) {  // nothing to add, but bad indices are still an error, as on the CPU
      Scratch flag(a.device, sizeof(int64_t));
      LaunchCheck(a.device, ix, dim, flag.i64(), "take_grad");
      RecordFirstBad(a.device, ix, dim, axis, flag.i64(), cuda::DeferredCheck::kBadTakeGradIndex, "take_grad");
    }
    return;
  }
  KILN_CHECK(dim <= std::numeric_limits<int64_t>::max() / n) << "take_grad: keys row * n + j overflow";
  int64_t padded = 1;
  while (padded < n) padded *= 2;
  // flag, keys[padded], start[dim + 1]
  Scratch scratch(a.device, static_cast<size_t>(1 + padded + dim + 1) * sizeof(int64_t));
  int64_t* flag = scratch.i64();
  LaunchCheck(a.device, ix, dim, flag, "take_grad");
  if (dim > 0) {
    void *keys = scratch.i64(1), *start = scratch.i64(1 + static_cast<size_t>(padded)), *q = ix.data;
    void* fn = CuKernel(a.device, "index", "kiln_take_keys_" + suffix);
    void* kargs[] = {&keys, &q, &n, &dim, &padded};
    LaunchGridStride(fn, padded, kargs);
    fn = CuKernel(a.device, "index", "kiln_bitonic_step");
    for (int64_t size = 2; size <= padded; size *= 2)
      for (int64_t stride = size / 2; stride > 0; stride /= 2) {
        void* sargs[] = {&keys, &padded, &size, &stride};
        LaunchGridStride(fn, padded, sargs);
      }
    fn = CuKernel(a.device, "index", "kiln_run_starts");
    int64_t runs = dim + 1;
    void* rargs[] = {&start, &keys, &n, &dim};
    LaunchGridStride(fn, runs, rargs);
    fn = CuKernel(a.device, "index", "kiln_take_grad_sum_" + value);
    void *o = dx.data, *g = dy.data;
    void* args[] = {&o, &g, &keys, &start, &outer, &n, &dim, &inner};
    LaunchGridStride(fn, total, args);
  }
  RecordFirstBad(a.device, ix, dim, axis, flag, cuda::DeferredCheck::kBadTakeGradIndex, "take_grad");
}

void OneHotGpu(const KernelArgs& a) {
  const TensorView &ix = a.in[0], &out = a.out[0];
  KILN_CHECK(ix.is_contiguous() && out.is_contiguous());
  int64_t depth = out.shape.back(), n = ix.numel();
  const std::string suffix = IndexSuffix(ix, "one_hot");
  const bool labels = a.attrs.Bool("labels");
  if (n * depth == 0) {
    if (labels && n > 0) CheckLabelsDeferred(a.device, ix, depth);  // no classes: every label is bad, as on the CPU
    return;
  }
  uint64_t on = 0, off = 0;  // the values' bits, converted as the CPU converts them
  const double von = a.attrs.Float("on_value"), voff = a.attrs.Float("off_value");
  KILN_DISPATCH_ALL(out.dtype, {
    using C = compute_t<scalar_t>;
    const scalar_t x = static_cast<scalar_t>(static_cast<C>(von)), y = static_cast<scalar_t>(static_cast<C>(voff));
    std::memcpy(&on, &x, sizeof x);
    std::memcpy(&off, &y, sizeof y);
  });
  void* fn = CuKernel(a.device, "index", "kiln_one_hot_e" + Bytes(out) + "_" + suffix);
  void *o = out.data, *q = ix.data;
  void* args[] = {&o, &q, &n, &depth, &on, &off};
  LaunchGridStride(fn, n * depth, args);
  if (labels) CheckLabelsDeferred(a.device, ix, depth);
}

}  // namespace

void BindGpuIndexKernels(KernelTable& t) {
  if (!FindCuModule("index")) return;  // built without clang-19: no GPU kernels for these ops
  constexpr DeviceType kGPU = DeviceType::kGPU;
  // Every dtype the ops take: they move bytes or compare any dtype, and take_grad sums the
  // floating dtypes its inference admits.
  t.Bind(op::kConcat, kGPU, {ConcatGpu});
  t.Bind(op::kStack, kGPU, {StackGpu});
  t.Bind(op::kSplit, kGPU, {SplitGpu});
  t.Bind(op::kSliceGrad, kGPU, {SliceGradGpu});
  t.Bind(op::kWhere, kGPU, {WhereGpu});
  t.Bind(op::kArgmax, kGPU, {ArgReduceGpu<true>});
  t.Bind(op::kArgmin, kGPU, {ArgReduceGpu<false>});
  t.Bind(op::kTake, kGPU, {TakeGpu, /*contiguous_inputs=*/true});
  t.Bind(op::kTakeGrad, kGPU, {TakeGradGpu, /*contiguous_inputs=*/true});
  t.Bind(op::kOneHot, kGPU, {OneHotGpu, /*contiguous_inputs=*/true});
}

}  // namespace kiln::codegen
