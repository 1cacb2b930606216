// GPU kernels backed by the platform's BLAS (gpu.h, Platform::Gemm): matmul, float32, on the
// calling engine worker's stream. Row-major out (..., M, N) = op(a) op(b) is the column-major
// product out^T = op(b)^T op(a)^T, so b goes first. NumPy-broadcast batch dimensions become one
// strided-batched GEMM when the operands' batch offsets are evenly spaced (equal batch shapes,
// or one side broadcast whole: stride 0), else one GEMM per batch entry. Inputs are contiguous
// (contiguous_inputs); other dtypes are a DTypeError (no GPU kernel for them yet).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/kernel.h"

namespace kiln {

namespace {

// The element offset of each of out's batch entries in operand `s` (rank >= 2, contiguous),
// whose batch dimensions broadcast against `batch` NumPy-style.
std::vector<int64_t> BatchOffsets(const Shape& s, const Shape& batch) {
  std::vector<int64_t> offsets(static_cast<size_t>(batch.numel()));
  const int shift = batch.rank() - (s.rank() - 2);
  for (int64_t bi = 0; bi < batch.numel(); ++bi) {
    int64_t rem = bi, off = 0, stride = s[s.rank() - 1] * s[s.rank() - 2];
    for (int d = batch.rank() - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      const int j = d - shift;
      if (j < 0) continue;
      if (s[j] != 1) off += idx * stride;
      stride *= s[j];
    }
    offsets[static_cast<size_t>(bi)] = off;
  }
  return offsets;
}

// The common step of an arithmetic sequence, or -1 when it is not one.
int64_t EvenStep(const std::vector<int64_t>& v) {
  if (v.size() < 2) return 0;
  const int64_t step = v[1] - v[0];
  for (size_t i = 2; i < v.size(); ++i)
    if (v[i] - v[i - 1] != step) return -1;
  return step;
}

void GpuMatmulKernel(const KernelArgs& k) {
  const TensorView &a = k.in[0], &b = k.in[1], &out = k.out[0];
  if (a.dtype != DType::kFloat32 || b.dtype != DType::kFloat32)
    KILN_THROW(DTypeError) << "matmul on " << k.device.str() << ": the GPU kernel (cuBLASLt) takes float32, found "
                           << DTypeName(a.dtype) << " and " << DTypeName(b.dtype)
                           << "; cast to float32, or run it on kiln.cpu()";
  const bool ta = k.attrs.Bool("transpose_a"), tb = k.attrs.Bool("transpose_b");
  const int ro = out.rank(), ra = a.rank();
  const int64_t M = out.shape[ro - 2], N = out.shape[ro - 1], K = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  Shape batch;
  for (int d = 0; d < ro - 2; ++d) batch.push_back(out.shape[d]);
  const std::vector<int64_t> off_a = BatchOffsets(a.shape, batch), off_b = BatchOffsets(b.shape, batch);

  gpurt::GemmArgs g;  // out^T (N x M, column-major) = op(b)^T op(a)^T
  g.m = N, g.n = M, g.k = K;
  g.transa = tb ? gpurt::BlasOp::kT : gpurt::BlasOp::kN;
  g.lda = std::max<int64_t>(1, tb ? K : N);
  g.transb = ta ? gpurt::BlasOp::kT : gpurt::BlasOp::kN;
  g.ldb = std::max<int64_t>(1, ta ? M : K);
  g.ldc = std::max<int64_t>(1, N);
  g.stride_c = M * N;

  if (out.numel() == 0) return;  // an empty batch (or M, N of 0): nothing to write
  gpurt::Platform& p = gpurt::Get();
  auto s = static_cast<gpurt::Stream>(cuda::CurrentStream());  // nullptr (naive engine): the default stream
  void* blas = p.LibraryHandle(gpurt::Library::kBlasLt, s);
  const int64_t step_a = EvenStep(off_a), step_b = EvenStep(off_b);
  const auto* pa = a.ptr<const float>();
  const auto* pb = b.ptr<const float>();
  float* pc = out.ptr<float>();
  if (step_a >= 0 && step_b >= 0) {
    g.a = pb + off_b[0], g.b = pa + off_a[0], g.c = pc;
    g.stride_a = step_b, g.stride_b = step_a, g.batch = batch.numel();
    p.Gemm(blas, s, g);
    return;
  }
  for (size_t i = 0; i < off_a.size(); ++i) {  // batch dims broadcast on both sides
    g.a = pb + off_b[i], g.b = pa + off_a[i], g.c = pc + static_cast<int64_t>(i) * M * N;
    p.Gemm(blas, s, g);
  }
}

}  // namespace

void BindGpuBlasKernels(KernelTable& t) {
  t.Bind(op::kMatmul, DeviceType::kGPU, {GpuMatmulKernel, /*contiguous_inputs=*/true, nullptr, DTypeBit(DType::kFloat32)});
}

}  // namespace kiln
