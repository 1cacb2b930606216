// GPU kernels that codegen generates, bound for eager ops (issue 15, first part). A real GPU
// loads their PTX, a simulated one runs the NVPTX IR beside it (gpusim), so the same bindings are
// tested in CI.
//
// - Elementwise ops of float32 (not the comparisons): a unary op, or a binary op whose contiguous
//   operands broadcast as one adjacent block of the output's dims (equal shapes, scalars, biases,
//   columns), as a kernel generated from the op's scalar function through the CPU's fused-kernel
//   lowering (ptx.h; libdevice for the transcendental functions), computing in float32. Every
//   other dtype, bool outputs, strided operands and any other broadcast: the hand-written kernels
//   of gpu_kernels_dtypes.cc, which also run cast.
// - Reductions (sum, mean, max, min) over any axes of a strided float32 tensor: GenerateReducePtx;
//   of other dtypes: gpu_kernels_dtypes.cc.
// - copy of a strided view, and the view ops (reshape, transpose, slice, broadcast_to,
//   expand_dims, squeeze) when no view is possible: GenerateStridedCopyPtx, any dtype.
// - full, any dtype: GenerateFillPtx.
//
// frontend/dispatch.cc adds BindGpuElementwiseKernels to runtime's kernel table (runtime/ knows
// nothing of codegen).
#include <algorithm>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/gpu_kernels.h"
#include "kiln/codegen/ptx.h"
#include "kiln/passes/fusion.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/codegen/cu_modules.h"
#include "gpu_launch.h"
#include "kernel_cache.h"
#include "lower.h"

namespace kiln::codegen {

std::string ArchOf(const Device& d) {
  static std::mutex mu;
  static std::unordered_map<int, std::string> arch;  // per device: the query is not free on a GPU
  std::lock_guard<std::mutex> lock(mu);
  auto it = arch.find(d.index);
  if (it == arch.end())
    it = arch.emplace(d.index, "sm_" + std::to_string(std::min(cuda::ComputeCapability(d), 90))).first;
  return it->second;
}

std::string PtxArchOf(const Device& d) { return ArchOf(d); }

void* LoadedOnce(const std::string& key, const Device& d, const std::function<PtxKernel()>& make) {
  static std::mutex mu;
  static std::unordered_map<std::string, void*> loaded;
  const std::string k = key + "@" + std::to_string(d.index);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = loaded.find(k); it != loaded.end()) return it->second;
  }
  PtxKernel kernel = make();
  void* fn = cuda::LoadKernel(d, kernel.ir, kernel.ptx, kernel.name);
  std::lock_guard<std::mutex> lock(mu);
  loaded.emplace(k, fn);
  return fn;
}

void* CuKernel(const Device& d, const char* module, const std::string& kernel) {
  return LoadedOnce("cu " + kernel, d, [&] {
    const CuModule* m = FindCuModule(module);
    KILN_CHECK(m) << "the GPU kernel " << kernel << " is bound but codegen/cu/" << module << ".cu is not built in";
    PtxKernel k;
    k.name = kernel;
    k.arch = "sm_80";
    k.ptx = m->ptx;
    k.ir = m->ir;
    return k;
  });
}

void IndexArgs(const OpInfo& op, const TensorView& v, const std::vector<int>& dims, int64_t* out) {
  if (static_cast<int>(dims.size()) > kGpuIndexDims)
    KILN_THROW(DeviceError) << op.name << ": GPU kernels index at most " << kGpuIndexDims << " dims of a strided "
                            << "tensor; this one has shape " << v.shape.str() << ". Reshape it to fewer dims, or run "
                            << "the op on kiln.cpu()";
  const size_t pad = static_cast<size_t>(kGpuIndexDims) - dims.size();
  for (size_t k = 0; k < static_cast<size_t>(kGpuIndexDims); ++k) {
    out[k] = k < pad ? 1 : v.shape[dims[k - pad]];
    out[kGpuIndexDims + k] = k < pad ? 0 : v.strides[dims[k - pad]];
  }
}

void LaunchGridStride(void* fn, int64_t n, void** args) {
  constexpr int64_t kBlock = 256;
  const int64_t blocks = std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, 4096);
  cuda::LaunchKernel(fn, static_cast<unsigned>(blocks), kBlock, 0, args);
}

namespace {

/// How contiguous operand `in` of an output of shape `out` is read by a generated kernel: (inner,
/// outer) of Expr::InputBroadcast, or (1, 0) for one element per output element; nullopt when
/// it cannot be (the strided kernels read it).
std::optional<std::pair<int64_t, int64_t>> ReadOf(const TensorView& in, const Shape& out) {
  if (!in.is_contiguous()) return std::nullopt;
  if (in.shape == out) return std::pair<int64_t, int64_t>{1, 0};
  return passes::BroadcastIndex(in.shape, out);
}

/// True when the generated float32 kernels compute op `a` (float32 in and out).
bool Generated(const KernelArgs& a) {
  return a.in[0].dtype == DType::kFloat32 && a.out[0].dtype == DType::kFloat32;
}

/// Runs the generated kernel of `e` over the output (operands a.in, float32: UnaryGpu and
/// BinaryGpu send other dtypes to gpu_kernels_dtypes.cc).
void Launch(const KernelArgs& a, const Expr& e) {
  const TensorView& out = a.out[0];
  const int64_t n = out.shape.numel();
  if (n == 0) return;
  for (const TensorView& v : a.in) KILN_CHECK(v.dtype == DType::kFloat32) << a.op.name << ": dtypes unchecked";
  KILN_CHECK(out.dtype == DType::kFloat32) << a.op.name << ": dtypes unchecked";
  // The exact form: ToString rounds constants.
  void* fn = LoadedOnce("ew " + detail::ExactForm(e), a.device, [&] { return GeneratePtx(e, ArchOf(a.device)); });
  void* ptrs[4] = {out.data, nullptr, nullptr, nullptr};
  void* args[5] = {&ptrs[0]};
  for (size_t i = 0; i < a.in.size(); ++i) {
    ptrs[i + 1] = a.in[i].data;
    args[i + 1] = &ptrs[i + 1];
  }
  int64_t count = n;
  args[a.in.size() + 1] = &count;
  LaunchGridStride(fn, n, args);
}

void UnaryGpu(const KernelArgs& a) {
  if (!Generated(a) || !a.in[0].is_contiguous()) return ElementwiseAnyGpu(a);
  Expr e;
  e.Unary(*a.op.unary_fn, e.Input(0));
  Launch(a, e);
}

void BinaryGpu(const KernelArgs& a) {
  const Shape& out = a.out[0].shape;
  auto read0 = ReadOf(a.in[0], out), read1 = ReadOf(a.in[1], out);
  if (!Generated(a) || !read0 || !read1) return ElementwiseAnyGpu(a);
  Expr e;
  int operand[2];
  for (int i = 0; i < 2; ++i) {
    auto [inner, outer] = *(i == 0 ? read0 : read1);
    operand[i] = outer == 0 ? e.Input(i) : e.InputBroadcast(i, inner, outer);
  }
  e.Binary(*a.op.binary_fn, operand[0], operand[1]);
  Launch(a, e);
}

/// out = `src` (out's shape, any strides, 0 for a broadcast dim), any dtype: a device-to-device
/// copy on the stream when contiguous, else the strided copy kernel.
void CopyStrided(const KernelArgs& a, const TensorView& src) {
  const int64_t n = a.out[0].shape.numel();
  if (n == 0) return;
  const size_t bytes = DTypeSize(src.dtype);
  if (src.is_contiguous()) {
    cuda::CopyAsync(a.out[0].data, src.data, static_cast<size_t>(n) * bytes, cuda::CopyKind::kDeviceToDevice);
    return;
  }
  std::vector<int> dims(static_cast<size_t>(src.rank()));
  for (int i = 0; i < src.rank(); ++i) dims[static_cast<size_t>(i)] = i;
  int64_t index[2 * kGpuIndexDims];
  IndexArgs(a.op, src, dims, index);
  const int eb = static_cast<int>(bytes);
  void* fn = LoadedOnce("copy" + std::to_string(eb), a.device,
                        [&] { return GenerateStridedCopyPtx(eb, ArchOf(a.device)); });
  void* out = a.out[0].data;
  void* in = src.data;
  int64_t count = n;
  void* args[3 + 2 * kGpuIndexDims] = {&out, &in, &count};
  for (int k = 0; k < 2 * kGpuIndexDims; ++k) args[3 + k] = &index[k];
  LaunchGridStride(fn, n, args);
}

/// copy and stop_gradient on a GPU, any dtype (a strided view becomes contiguous).
void CopyGpu(const KernelArgs& a) {
  KILN_CHECK(a.in[0].dtype == a.out[0].dtype) << a.op.name << " changes no dtype";
  CopyStrided(a, a.in[0]);
}

/// The layout functions of the view ops (the CPU's, device-neutral), by op id: filled when the
/// kernels are bound, read only afterwards.
std::unordered_map<OpId, ViewFn>& ViewFns() {
  static std::unordered_map<OpId, ViewFn> fns;
  return fns;
}

/// A view op (reshape, transpose, slice, broadcast_to, expand_dims, squeeze) that dispatch could
/// not make a view of the input, any dtype: the view's elements copied by the strided copy (a
/// transpose or slice of a strided input, a broadcast), or, when even the layout function finds
/// no view (a reshape of a strided input), the input copied in its row-major order.
void ViewCopyGpu(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  Layout v;
  const ViewFn view = ViewFns().at(a.op.id);
  if (view(Layout{0, x.shape, x.strides}, a.attrs, a.out[0].shape, &v)) {
    TensorView src = x;
    src.data = static_cast<char*>(x.data) + v.offset * static_cast<int64_t>(DTypeSize(x.dtype));
    src.shape = v.shape;
    src.strides = v.strides;
    CopyStrided(a, src);
  } else {
    CopyStrided(a, x);  // the output is contiguous: x's elements in row-major order
  }
}

/// full on a GPU, any dtype: the value converted on the host (as the CPU kernel converts it),
/// its bits written by the fill kernel.
void FullGpu(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  const int64_t n = out.shape.numel();
  if (n == 0) return;
  int64_t bits = 0;
  TensorView one{&bits, out.dtype, Shape({1}), Strides(std::vector<int64_t>{1})};
  host::Fill(one, a.attrs.Float("value"));
  const int eb = static_cast<int>(DTypeSize(out.dtype));
  void* fn = LoadedOnce("fill" + std::to_string(eb), a.device, [&] { return GenerateFillPtx(eb, ArchOf(a.device)); });
  void* dst = out.data;
  int64_t count = n;
  void* args[] = {&dst, &count, &bits};
  LaunchGridStride(fn, n, args);
}

/// sum, mean, max and min over any axes (all by default) of a strided tensor: float32 by the
/// generated kernels, other dtypes by gpu_kernels_dtypes.cc.
template <GpuReduce kKind, bool kMean> void ReduceGpu(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  if (x.dtype != DType::kFloat32)
    return ReduceAnyGpu(a, kMean ? 1 : kKind == GpuReduce::kSum ? 0 : kKind == GpuReduce::kMax ? 2 : 3);
  GpuReduction r;
  SetUpReduction(a, &r);
  if (r.rows == 0) return;
  void* fn = LoadedOnce("reduce" + std::to_string(static_cast<int>(kKind)), a.device,
                        [&] { return GenerateReducePtx(kKind, ArchOf(a.device)); });
  float scale = kMean ? static_cast<float>(1.0 / static_cast<double>(r.len)) : 1.0f;
  if (kMean && r.len == 0) scale = std::numeric_limits<float>::quiet_NaN();  // NumPy: the mean of nothing
  r.args[4] = &scale;
  LaunchReduction(fn, r);
}

}  // namespace

void BindGpuElementwiseKernels(KernelTable& t) {
  BindGpuCreationKernels(t);
  BindGpuIndexKernels(t);
  // Every dtype the ops take, strided inputs read in place: codegen/cu/elementwise.cu. Built
  // without it (no clang-19), float32 and contiguous inputs only, as the generated kernels read.
  const bool any = FindCuModule("elementwise") != nullptr;
  const uint32_t dtypes = any ? 0 : DTypeBit(DType::kFloat32);
  for (OpId id = op::kFirstUnary; id < op::kFirstOther; ++id)  // KILN_UNARY_OPS, KILN_BINARY_OPS
    t.Bind(id, DeviceType::kGPU, {BinaryFnOf(id) ? BinaryGpu : UnaryGpu, /*contiguous_inputs=*/!any, nullptr, dtypes});
  if (any) t.Bind(op::kCast, DeviceType::kGPU, {CastGpu});
  // Copies take strided inputs themselves (dispatch makes inputs contiguous through `copy`).
  t.Bind(op::kCopy, DeviceType::kGPU, {CopyGpu});
  t.Bind(op::kStopGradient, DeviceType::kGPU, {CopyGpu});
  t.Bind(op::kFull, DeviceType::kGPU, {FullGpu});
  t.Bind(op::kSum, DeviceType::kGPU, {ReduceGpu<GpuReduce::kSum, false>, false, nullptr, dtypes});
  t.Bind(op::kMean, DeviceType::kGPU, {ReduceGpu<GpuReduce::kSum, true>, false, nullptr, dtypes});
  t.Bind(op::kMax, DeviceType::kGPU, {ReduceGpu<GpuReduce::kMax, false>, false, nullptr, dtypes});
  t.Bind(op::kMin, DeviceType::kGPU, {ReduceGpu<GpuReduce::kMin, false>, false, nullptr, dtypes});
  // View ops: dispatch makes a view when the layout allows, else this copies through it.
  for (OpId id : {op::kReshape, op::kTranspose, op::kSlice, op::kBroadcastTo, op::kExpandDims, op::kSqueeze})
    if (const KernelBinding* cpu = t.Find(id, DeviceType::kCPU); cpu && cpu->view) {
      ViewFns()[id] = cpu->view;
      t.Bind(id, DeviceType::kGPU, {ViewCopyGpu, false, cpu->view});
    }
}

}  // namespace kiln::codegen
