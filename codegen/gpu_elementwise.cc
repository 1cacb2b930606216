// GPU kernels of the elementwise ops, eager (issue 15, first part): a unary op, or a binary op
// whose operands broadcast as a suffix of the output (equal shapes, a scalar, a bias along the
// trailing axes), runs as a kernel that codegen generates from the op's scalar function through
// the same lowering as the CPU's fused kernels (ptx.h: NVPTX, libdevice for the transcendental
// functions). A real GPU loads the PTX, a simulated one runs the NVPTX IR beside it (gpusim), so
// the same binding is tested in CI. float32 only: the generated kernels compute in float32.
// frontend/dispatch.cc adds BindGpuElementwiseKernels to runtime's kernel table (runtime/ knows
// nothing of codegen).
#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/gpu_kernels.h"
#include "kiln/codegen/ptx.h"
#include "kiln/passes/fusion.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"

namespace kiln::codegen {
namespace {

/// The PTX target for device `d`: its compute capability, at most sm_90 (the newest LLVM 19's
/// NVPTX backend emits; PTX is forward compatible, the driver compiles it for newer GPUs).
std::string ArchOf(const Device& d) {
  const int cc = std::min(cuda::ComputeCapability(d), 90);
  return "sm_" + std::to_string(cc);
}

/// How operand `in` of an output of shape `out` is read: (inner, outer) of Expr::InputBroadcast,
/// or (1, 0) for one element per output element.
std::pair<int64_t, int64_t> ReadOf(const OpInfo& op, const TensorView& in, const Shape& out) {
  if (in.shape == out) return {1, 0};
  if (auto r = passes::BroadcastIndex(in.shape, out)) return *r;
  KILN_THROW(DeviceError) << op.name << ": an operand of shape " << in.shape.str()
                          << " broadcasts to " << out.str()
                          << " in a way the GPU elementwise kernels do not read yet (they take equal "
                             "shapes, scalars and operands that broadcast along leading axes); "
                             "broadcast it first (broadcast_to) or run the op on kiln.cpu()";
}

/// The loaded kernel of an expression on a device: generated and loaded once per (expression,
/// device); later calls are one lookup.
void* KernelFor(const Expr& e, const Device& d, int* num_inputs) {
  static std::mutex mu;
  static std::unordered_map<std::string, void*> loaded;
  const std::string key = e.ToString() + "@" + std::to_string(d.index);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) return it->second;
  }
  PtxKernel k = GeneratePtx(e, ArchOf(d));
  *num_inputs = k.num_inputs;
  void* fn = cuda::LoadKernel(d, k.ir, k.ptx, k.name);
  std::lock_guard<std::mutex> lock(mu);
  loaded.emplace(key, fn);
  return fn;
}

void Launch(const KernelArgs& a, const Expr& e) {
  const TensorView& out = a.out[0];
  const int64_t n = out.shape.numel();
  if (n == 0) return;
  int ignored = 0;
  void* fn = KernelFor(e, a.device, &ignored);
  void* ptrs[4] = {out.data, nullptr, nullptr, nullptr};
  void* args[5] = {&ptrs[0]};
  for (size_t i = 0; i < a.in.size(); ++i) {
    ptrs[i + 1] = a.in[i].data;
    args[i + 1] = &ptrs[i + 1];
  }
  int64_t count = n;
  args[a.in.size() + 1] = &count;
  constexpr int64_t kBlock = 256;
  // A grid-stride loop covers any n: enough blocks to fill the GPU (a few per SM), no more.
  const int64_t blocks = std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, 4096);
  cuda::LaunchKernel(fn, static_cast<unsigned>(blocks), kBlock, 0, args);
}

void CheckFloat32(const KernelArgs& a) {
  for (const TensorView& v : a.in)
    if (v.dtype != DType::kFloat32)
      KILN_THROW(DTypeError) << a.op.name << ": the GPU elementwise kernels compute in float32; found an "
                             << DTypeName(v.dtype) << " operand. Cast it with astype('float32') or run "
                             << "the op on kiln.cpu()";
  if (a.out[0].dtype != DType::kFloat32)
    KILN_THROW(DTypeError) << a.op.name << ": the GPU elementwise kernels write float32; this op's output is "
                           << DTypeName(a.out[0].dtype) << ". Run it on kiln.cpu()";
}

void UnaryGpu(const KernelArgs& a) {
  CheckFloat32(a);
  Expr e;
  e.Unary(*a.op.unary_fn, e.Input(0));
  Launch(a, e);
}

void BinaryGpu(const KernelArgs& a) {
  CheckFloat32(a);
  const Shape& out = a.out[0].shape;
  Expr e;
  int operand[2];
  for (int i = 0; i < 2; ++i) {
    auto [inner, outer] = ReadOf(a.op, a.in[static_cast<size_t>(i)], out);
    operand[i] = outer == 0 ? e.Input(i) : e.InputBroadcast(i, inner, outer);
  }
  e.Binary(*a.op.binary_fn, operand[0], operand[1]);
  Launch(a, e);
}

/// copy and stop_gradient on a GPU: a device-to-device copy on the stream (any dtype).
void CopyGpu(const KernelArgs& a) {
  if (!a.in[0].is_contiguous())
    KILN_THROW(DeviceError) << a.op.name << ": copying a strided view (of shape " << a.in[0].shape.str()
                            << ") does not run on GPUs yet; make it on kiln.cpu() and copy the result over";
  if (a.in[0].dtype == a.out[0].dtype) {
    const size_t bytes = static_cast<size_t>(a.out[0].shape.numel()) * DTypeSize(a.out[0].dtype);
    if (bytes) cuda::CopyAsync(a.out[0].data, a.in[0].data, bytes, cuda::CopyKind::kDeviceToDevice);
    return;
  }
  KILN_THROW(DTypeError) << a.op.name << ": casts between dtypes do not run on GPUs yet (from "
                         << DTypeName(a.in[0].dtype) << " to " << DTypeName(a.out[0].dtype)
                         << "); cast on kiln.cpu() and copy the result to the GPU";
}

/// full (float32) on a GPU: a kernel with the value built in, no inputs.
void FullGpu(const KernelArgs& a) {
  if (a.out[0].dtype != DType::kFloat32)
    KILN_THROW(DTypeError) << "full: on GPUs only float32 tensors can be created yet; found "
                           << DTypeName(a.out[0].dtype) << ". Create it on kiln.cpu() and copy it over";
  Expr e;
  e.Const(a.attrs.Float("value"));
  Launch(a, e);
}

}  // namespace

void BindGpuElementwiseKernels(KernelTable& t) {
  if (!cuda::CompiledWithCuda()) return;
  for (OpId id = op::kFirstUnary; id < op::kFirstOther; ++id)  // KILN_UNARY_OPS, KILN_BINARY_OPS
    t.Bind(id, DeviceType::kGPU, {BinaryFnOf(id) ? BinaryGpu : UnaryGpu, /*contiguous_inputs=*/true});
  // Copies take strided inputs themselves (dispatch makes inputs contiguous through `copy`).
  t.Bind(op::kCopy, DeviceType::kGPU, {CopyGpu});
  t.Bind(op::kStopGradient, DeviceType::kGPU, {CopyGpu});
  t.Bind(op::kCast, DeviceType::kGPU, {CopyGpu});
  t.Bind(op::kFull, DeviceType::kGPU, {FullGpu});
  // Shape-only views: the CPU's layout functions (device-neutral); a view that needs a copy
  // copies a contiguous input as it is.
  for (OpId id : {op::kReshape, op::kExpandDims, op::kSqueeze})
    if (const KernelBinding* cpu = t.Find(id, DeviceType::kCPU)) t.Bind(id, DeviceType::kGPU, {CopyGpu, false, cpu->view});
}

}  // namespace kiln::codegen
