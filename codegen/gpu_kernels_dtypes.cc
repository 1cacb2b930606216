// GPU kernels of the elementwise ops, cast and the reductions for every dtype (issue 15):
// hand-written in codegen/cu/elementwise.cu, one kernel per dtype (per pair for cast) with the
// scalar function an argument. gpu_kernels.cc sends here what its generated float32 kernels do
// not take: other dtypes, comparisons and logical_not (bool outputs), strided operands and
// broadcasts the generated kernels cannot read. Operands are indexed by their strides over the
// output's dims (0 for a broadcast dim), dims merged where every operand allows, at most
// kGpuIndexDims after merging (a DeviceError beyond). Integer division by zero raises the CPU's
// ValueError (the kernel sets a flag that the launching worker reads back).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/codegen/cu_modules.h"
#include "kiln/codegen/ptx.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/scalar_fn.h"
#include "gpu_launch.h"

namespace kiln::codegen {
namespace {

/// The kernels' name for dtype `t` (codegen/cu/elementwise.cu).
const char* Tag(DType t) {
  switch (t) {
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
    case DType::kUInt8: return "U8";
    case DType::kBool: return "B8";
  }
  return "";
}

/// Sizes of the output's dims and each operand's strides over them, as kernel arguments.
struct OverOutput {
  int64_t size[kGpuIndexDims];
  int64_t stride[2][kGpuIndexDims];
  int flat = 1;  ///< every operand is read at the output's flat index
};

/// How operands `ins` (broadcasting to `out` as NumPy does) are read over the output's dims:
/// size-1 dims dropped, neighbours merged where every operand's strides allow it.
OverOutput IndexOver(const OpInfo& op, const Shape& out, const std::vector<const TensorView*>& ins) {
  const int r = out.rank();
  const size_t k_n = ins.size();
  std::vector<int64_t> size;
  std::vector<std::vector<int64_t>> stride(k_n);
  for (int d = 0; d < r; ++d) {
    if (out[d] == 1) continue;
    std::vector<int64_t> s(k_n);
    for (size_t k = 0; k < k_n; ++k) {
      const TensorView& v = *ins[k];
      const int vd = d - (r - v.rank());
      s[k] = vd < 0 || v.shape[vd] == 1 ? 0 : v.strides[vd];
    }
    bool merge = !size.empty();
    for (size_t k = 0; k < k_n && merge; ++k) merge = stride[k].back() == s[k] * out[d];
    if (merge) {
      size.back() *= out[d];
      for (size_t k = 0; k < k_n; ++k) stride[k].back() = s[k];
    } else {
      size.push_back(out[d]);
      for (size_t k = 0; k < k_n; ++k) stride[k].push_back(s[k]);
    }
  }
  if (size.size() > static_cast<size_t>(kGpuIndexDims))
    KILN_THROW(DeviceError) << op.name << ": GPU kernels index at most " << kGpuIndexDims
                            << " dims of strided or broadcast operands; an output of shape " << out.str()
                            << " needs " << size.size() << " here. Make the operands contiguous and of equal "
                            << "shapes, reshape to fewer dims, or run the op on kiln.cpu()";
  OverOutput o;
  const size_t pad = static_cast<size_t>(kGpuIndexDims) - size.size();
  for (size_t d = 0; d < static_cast<size_t>(kGpuIndexDims); ++d) {
    o.size[d] = d < pad ? 1 : size[d - pad];
    for (size_t k = 0; k < 2; ++k) o.stride[k][d] = d < pad || k >= k_n ? 0 : stride[k][d - pad];
  }
  for (size_t k = 0; k < k_n; ++k)
    if (!(size.empty() || (size.size() == 1 && stride[k][0] == 1))) o.flat = 0;
  return o;
}

/// The kernel `name` of codegen/cu/elementwise.cu on `d`; a DeviceError naming `op` in a build
/// without it (no clang-19: the GPU kernels then take float32 only, gpu_kernels.cc).
void* Kernel(const OpInfo& op, const Device& d, const std::string& name) {
  if (!FindCuModule("elementwise"))
    KILN_THROW(DeviceError) << op.name << ": this build has no GPU kernels for dtypes other than float32, strided "
                            << "operands or general broadcasts (codegen/cu was not built: clang-19 missing); make the "
                            << "operands contiguous float32 of equal shapes, or run the op on kiln.cpu()";
  return CuKernel(d, "elementwise", name);
}

/// The device flag an integer division sets on a division by zero: one per worker thread (so
/// per stream) and device, kept for the thread's life as the workers are.
int* DivisionFlag(const Device& d) {
  thread_local std::unordered_map<int, int*> flags;
  int*& f = flags[d.index];
  if (!f) f = static_cast<int*>(cuda::DeviceMalloc(d, sizeof(int)));
  return f;
}

}  // namespace

void MergedIndexArgs(const OpInfo& op, const TensorView& v, const std::vector<int>& dims, int64_t* out) {
  TensorView merged = v;
  merged.shape = Shape();
  merged.strides = Strides();
  std::vector<int> order;
  for (int d : dims) {
    const int64_t n = v.shape[d], s = v.strides[d];
    if (n == 1) continue;
    const int r = merged.shape.rank();
    if (r > 0 && merged.strides[r - 1] == s * n) {  // the previous dim is this one's outer neighbour
      merged.shape[r - 1] *= n;
      merged.strides[r - 1] = s;
    } else {
      merged.shape.push_back(n);
      merged.strides.push_back(s);
      order.push_back(r);
    }
  }
  if (static_cast<int>(order.size()) > kGpuIndexDims) return IndexArgs(op, v, dims, out);  // its error
  IndexArgs(op, merged, order, out);
}

void ElementwiseAnyGpu(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  int64_t n = out.shape.numel();
  if (n == 0) return;
  KILN_CHECK(out.is_contiguous()) << a.op.name << ": the output must be contiguous";
  const DType t = a.in[0].dtype;
  const bool binary = a.in.size() == 2;
  int fn = binary ? static_cast<int>(*a.op.binary_fn) : static_cast<int>(*a.op.unary_fn);
  if (binary && t == DType::kBool) {  // as the CPU: add and maximum are or, mul and minimum and
    const BinaryFn f = *a.op.binary_fn;
    if (f == BinaryFn::kAdd || f == BinaryFn::kMaximum) fn = static_cast<int>(BinaryFn::kMaximum);
    if (f == BinaryFn::kMul || f == BinaryFn::kMinimum) fn = static_cast<int>(BinaryFn::kMinimum);
  }
  std::vector<const TensorView*> ins;
  for (const TensorView& v : a.in) ins.push_back(&v);
  OverOutput o = IndexOver(a.op, out.shape, ins);
  void* y = out.data;
  void* x0 = a.in[0].data;
  void* x1 = binary ? a.in[1].data : nullptr;
  const bool int_div = binary && *a.op.binary_fn == BinaryFn::kDiv && !IsFloat(t);
  int* flag = int_div ? DivisionFlag(a.device) : nullptr;
  std::vector<void*> args = {&y, &x0};
  if (binary) args.push_back(&x1);
  args.insert(args.end(), {&n, &fn, &o.flat});
  if (binary) args.push_back(&flag);
  for (int64_t& s : o.size) args.push_back(&s);
  for (size_t k = 0; k < a.in.size(); ++k)
    for (int64_t& s : o.stride[k]) args.push_back(&s);
  void* kernel = Kernel(a.op, a.device, std::string(binary ? "kiln_binary_" : "kiln_unary_") + Tag(t));
  if (flag) cuda::Memset(flag, 0, sizeof(int));
  LaunchGridStride(kernel, n, args.data());
  if (flag) {
    int host = 0;
    cuda::CopyAsync(&host, flag, sizeof(int), cuda::CopyKind::kDeviceToHost);
    cuda::SynchronizeWorkerStream();
    if (host) throw ValueError("div: integer division by zero");
  }
}

void CastGpu(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  int64_t n = out.shape.numel();
  if (n == 0) return;
  KILN_CHECK(out.is_contiguous()) << a.op.name << ": the output must be contiguous";
  OverOutput o = IndexOver(a.op, out.shape, {&x});
  void* y = out.data;
  void* px = x.data;
  std::vector<void*> args = {&y, &px, &n, &o.flat};
  for (int64_t& s : o.size) args.push_back(&s);
  for (int64_t& s : o.stride[0]) args.push_back(&s);
  void* kernel = Kernel(a.op, a.device, std::string("kiln_cast_") + Tag(x.dtype) + "_" + Tag(out.dtype));
  LaunchGridStride(kernel, n, args.data());
}

void SetUpReduction(const KernelArgs& a, GpuReduction* r) {
  const TensorView& x = a.in[0];
  std::vector<bool> reduced(static_cast<size_t>(x.rank()), false);
  bool any = false;
  for (int64_t ax : a.attrs.Ints("axes"))
    reduced[static_cast<size_t>(NormalizeAxis(ax, x.rank(), a.op.name.c_str()))] = any = true;
  if (!any) reduced.assign(reduced.size(), true);
  std::vector<int> kept_dims, reduced_dims;
  for (int i = 0; i < x.rank(); ++i) {
    (reduced[static_cast<size_t>(i)] ? reduced_dims : kept_dims).push_back(i);
    (reduced[static_cast<size_t>(i)] ? r->len : r->rows) *= x.shape[i];
  }
  MergedIndexArgs(a.op, x, kept_dims, r->index);
  MergedIndexArgs(a.op, x, reduced_dims, r->index + 2 * kGpuIndexDims);
  r->out = a.out[0].data;
  r->in = x.data;
  r->args[0] = &r->out, r->args[1] = &r->in, r->args[2] = &r->rows, r->args[3] = &r->len;
  for (int k = 0; k < 4 * kGpuIndexDims; ++k) r->args[5 + k] = &r->index[k];
}

void LaunchReduction(void* fn, GpuReduction& r) {
  const int64_t blocks = std::clamp<int64_t>(r.rows, 1, 4096);  // enough to fill a GPU; more rows loop
  cuda::LaunchKernel(fn, static_cast<unsigned>(blocks), kReduceThreads, 0, r.args);
}

void ReduceAnyGpu(const KernelArgs& a, int kind) {
  GpuReduction r;
  SetUpReduction(a, &r);
  if (r.rows == 0) return;
  void* fn = Kernel(a.op, a.device, std::string("kiln_reduce_") + Tag(a.in[0].dtype));
  r.args[4] = &kind;
  LaunchReduction(fn, r);
}

}  // namespace kiln::codegen
