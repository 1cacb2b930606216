// GPU kernels backed by the platform's BLAS (gpu.h, Platform::Gemm): matmul in float32, float64,
// float16 and bfloat16 (the 16-bit ones accumulate in float32), on the calling engine worker's
// stream, and gpu.h's MatmulOnGpu, the same with cuBLASLt's bias and activation epilogue (what
// compiled plans on GPUs run for a matmul + bias + relu group). Row-major out (..., M, N) =
// op(a) op(b) is the column-major product out^T = op(b)^T op(a)^T, so b goes first, and a bias
// per column of out is cuBLASLt's bias per row of out^T. NumPy-broadcast batch dimensions become
// one strided-batched GEMM when the operands' batch offsets are evenly spaced (equal batch
// shapes, or one side broadcast whole: stride 0), else one GEMM per batch entry. Inputs are
// contiguous (contiguous_inputs); integer and bool dtypes are a DTypeError. float32 runs on TF32
// tensor cores only when the math mode allows it (KILN_MATMUL_TF32=1 or kiln.set_math_mode,
// kiln/runtime/math_mode.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/math_mode.h"

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

bool GemmDType(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
}

void GpuMatmulKernel(const KernelArgs& k) {
  gpurt::MatmulOnGpu(k.in[0], k.in[1], k.out[0], k.attrs.Bool("transpose_a"), k.attrs.Bool("transpose_b"));
}

}  // namespace

void gpurt::MatmulOnGpu(const TensorView& a, const TensorView& b, const TensorView& out, bool ta, bool tb,
                        const TensorView* bias, GemmActivation act) {
  if (a.dtype != b.dtype || a.dtype != out.dtype || !GemmDType(a.dtype))
    KILN_THROW(DTypeError) << "matmul on a GPU: the GPU kernel (cuBLASLt) takes float32, float64, float16 or "
                           << "bfloat16 operands of one dtype, found " << DTypeName(a.dtype) << " and "
                           << DTypeName(b.dtype) << " (output " << DTypeName(out.dtype)
                           << "); cast them to one float dtype, or run it on kiln.cpu()";
  const int ro = out.rank(), ra = a.rank();
  const int64_t M = out.shape[ro - 2], N = out.shape[ro - 1], K = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  if (bias && (bias->dtype != out.dtype || bias->numel() != N))
    KILN_THROW(ShapeError) << "matmul epilogue on a GPU: the bias must hold " << N << " " << DTypeName(out.dtype)
                           << " values (one per output column), found " << bias->numel() << " "
                           << DTypeName(bias->dtype) << " values";
  Shape batch;
  for (int d = 0; d < ro - 2; ++d) batch.push_back(out.shape[d]);
  const std::vector<int64_t> off_a = BatchOffsets(a.shape, batch), off_b = BatchOffsets(b.shape, batch);

  gpurt::GemmArgs g;  // out^T (N x M, column-major) = op(b)^T op(a)^T
  g.dtype = out.dtype;
  g.tf32 = out.dtype == DType::kFloat32 && gpurt::Tf32Allowed(gpurt::MathOp::kMatmul);
  g.m = N, g.n = M, g.k = K;
  g.transa = tb ? gpurt::BlasOp::kT : gpurt::BlasOp::kN;
  g.lda = std::max<int64_t>(1, tb ? K : N);
  g.transb = ta ? gpurt::BlasOp::kT : gpurt::BlasOp::kN;
  g.ldb = std::max<int64_t>(1, ta ? M : K);
  g.ldc = std::max<int64_t>(1, N);
  g.stride_c = M * N;
  g.bias = bias ? bias->data : nullptr;
  g.act = act;

  if (out.numel() == 0) return;  // an empty batch (or M, N of 0): nothing to write
  gpurt::Platform& p = gpurt::Get();
  auto s = static_cast<gpurt::Stream>(cuda::CurrentStream());  // nullptr (naive engine): the default stream
  void* blas = p.LibraryHandle(gpurt::Library::kBlasLt, s);
  const int64_t step_a = EvenStep(off_a), step_b = EvenStep(off_b);
  const size_t elem = DTypeSize(out.dtype);
  auto at = [elem](const void* base, int64_t off) { return static_cast<const char*>(base) + off * static_cast<int64_t>(elem); };
  char* pc = static_cast<char*>(out.data);
  if (step_a >= 0 && step_b >= 0) {
    g.a = at(b.data, off_b[0]), g.b = at(a.data, off_a[0]), g.c = pc;
    g.stride_a = step_b, g.stride_b = step_a, g.batch = batch.numel();
    p.Gemm(blas, s, g);
    return;
  }
  for (size_t i = 0; i < off_a.size(); ++i) {  // batch dims broadcast on both sides
    g.a = at(b.data, off_b[i]), g.b = at(a.data, off_a[i]);
    g.c = pc + static_cast<int64_t>(i) * M * N * static_cast<int64_t>(elem);
    p.Gemm(blas, s, g);
  }
}

void BindGpuBlasKernels(KernelTable& t) {
  t.Bind(op::kMatmul, DeviceType::kGPU, {GpuMatmulKernel, /*contiguous_inputs=*/true, nullptr,
                                                DTypeBit(DType::kFloat32) | DTypeBit(DType::kFloat64) |
                                                    DTypeBit(DType::kFloat16) | DTypeBit(DType::kBFloat16)});
}

}  // namespace kiln
