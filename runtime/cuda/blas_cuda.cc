// The real GEMM of gpu.h (Platform::Gemm on CUDA): one cublasLtMatmul per call, column-major,
// strided-batched through the matrix layouts' batch count and offset, the algorithm from
// cuBLASLt's heuristic. float32 accumulates in float32 (CUBLAS_COMPUTE_32F; with g.tf32,
// CUBLAS_COMPUTE_32F_FAST_TF32), float16 and bfloat16 (CUDA_R_16F / CUDA_R_16BF) in float32 with a
// float scale type, float64 in float64 (CUBLAS_COMPUTE_64F, double alpha and beta). The epilogue
// (bias per row of D, relu or GELU) goes through CUBLASLT_MATMUL_DESC_EPILOGUE and _BIAS_POINTER.
// It uses no workspace (split-K and some faster algorithms need one; a per-stream workspace from
// the caching allocator is the next step), and does not cache descriptors or heuristic results
// between calls. k == 0 or alpha == 0 never reaches cublasLtMatmul: C = beta * C (beta == 0 writes
// zeros and never reads C), as cuBLAS defines it (CheckGemm refuses an epilogue there).
#include "blas_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

namespace kiln::cuda {

namespace {

constexpr const char* kCall = "cublasLtMatmul";

void Check(cublasStatus_t st, const char* step) {
  if (st != CUBLAS_STATUS_SUCCESS)
    gpurt::FailBlas(static_cast<int>(st), kCall, std::string(step) + " failed");
}

// RAII over cuBLASLt's descriptors: unique_ptr<Opaque, Deleter<Destroy>>.
template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct Deleter {
  void operator()(Handle h) const { (void)Destroy(h); }
};
template <class Handle, cublasStatus_t (*Destroy)(Handle)>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Deleter<Handle, Destroy>>;
using Layout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;
using TransformDesc = Owned<cublasLtMatrixTransformDesc_t, cublasLtMatrixTransformDescDestroy>;

cudaDataType_t DataType(DType t) {
  switch (t) {
  case DType::kFloat64: return CUDA_R_64F;
  case DType::kFloat16: return CUDA_R_16F;
  case DType::kBFloat16: return CUDA_R_16BF;
  default: return CUDA_R_32F;  // CheckGemm let only these four through
  }
}

// A column-major matrix of `rows` x `cols` as stored, `batch` of them `stride` elements apart.
Layout MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  Check(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
        "cublasLtMatrixLayoutCreate");
  Layout l(raw);
  const auto count = static_cast<int32_t>(batch);
  Check(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
        "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
  Check(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
        "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  return l;
}

cublasOperation_t Op(gpurt::BlasOp op) { return op == gpurt::BlasOp::kN ? CUBLAS_OP_N : CUBLAS_OP_T; }

// C = beta * C over the batch, without reading A or B.
void ScaleC(cublasLtHandle_t h, cudaStream_t s, const gpurt::GemmArgs& g) {
  const size_t elem = DTypeSize(g.dtype);
  if (g.beta == 0.0f) {
    for (int64_t i = 0; i < g.batch; ++i) {
      void* ci = static_cast<char*>(g.c) + static_cast<size_t>(i * g.stride_c) * elem;
      cudaError_t e = cudaMemset2DAsync(ci, static_cast<size_t>(g.ldc) * elem, 0, static_cast<size_t>(g.m) * elem,
                                        static_cast<size_t>(g.n), s);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        gpurt::FailBlas(gpurt::kBlasExecutionFailed, kCall, std::string("clearing C: ") + cudaGetErrorString(e));
      }
    }
    return;
  }
  if (g.beta == 1.0f) return;
  // The scale type: double for float64 data, float otherwise (16-bit data scaled in float).
  const bool f64 = g.dtype == DType::kFloat64;
  cublasLtMatrixTransformDesc_t raw = nullptr;
  Check(cublasLtMatrixTransformDescCreate(&raw, f64 ? CUDA_R_64F : CUDA_R_32F), "cublasLtMatrixTransformDescCreate");
  TransformDesc desc(raw);
  Layout c = MakeLayout(DataType(g.dtype), g.m, g.n, g.ldc, g.batch, g.stride_c);
  const float zero = 0.0f;
  const double beta64 = g.beta, zero64 = 0.0;
  Check(cublasLtMatrixTransform(h, raw, f64 ? static_cast<const void*>(&beta64) : &g.beta, g.c, c.get(),
                                f64 ? static_cast<const void*>(&zero64) : &zero, nullptr, nullptr, g.c, c.get(), s),
        "cublasLtMatrixTransform (C = beta * C)");
}

}  // namespace

void LtGemm(void* handle, void* stream, const gpurt::GemmArgs& g) {
  auto h = static_cast<cublasLtHandle_t>(handle);
  auto s = static_cast<cudaStream_t>(stream);
  if (!h) gpurt::FailBlas(gpurt::kBlasNotInitialized, kCall, "the handle is null; get it with LibraryHandle(kBlasLt, stream)");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.batch > std::numeric_limits<int32_t>::max())
    gpurt::FailBlas(gpurt::kBlasInvalidValue, kCall,
                    "batchCount=" + std::to_string(g.batch) + " is above cuBLASLt's int32 batch count; split the batch");
  if (g.k == 0 || g.alpha == 0.0f) return ScaleC(h, s, g);

  const bool f64 = g.dtype == DType::kFloat64;
  const cudaDataType_t type = DataType(g.dtype);
  const cublasComputeType_t compute = f64                                    ? CUBLAS_COMPUTE_64F
                                      : g.tf32 && g.dtype == DType::kFloat32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                             : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  Check(cublasLtMatmulDescCreate(&raw_desc, compute, f64 ? CUDA_R_64F : CUDA_R_32F), "cublasLtMatmulDescCreate");
  MatmulDesc desc(raw_desc);
  const cublasOperation_t ta = Op(g.transa), tb = Op(g.transb);
  Check(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "cublasLtMatmulDescSetAttribute(TRANSA)");
  Check(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (g.bias || g.act != gpurt::GemmActivation::kNone) {
    // The bias has D's data type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE's default) and m entries,
    // the same for every batch entry (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE's default 0).
    const bool relu = g.act == gpurt::GemmActivation::kRelu, gelu = g.act == gpurt::GemmActivation::kGelu;
    const uint32_t epilogue = g.bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                                                  : CUBLASLT_EPILOGUE_BIAS)
                                     : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_GELU);
    Check(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
          "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (g.bias)
      Check(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias),
            "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  const bool an = g.transa == gpurt::BlasOp::kN, bn = g.transb == gpurt::BlasOp::kN;
  Layout a = MakeLayout(type, an ? g.m : g.k, an ? g.k : g.m, g.lda, g.batch, g.stride_a);
  Layout b = MakeLayout(type, bn ? g.k : g.n, bn ? g.n : g.k, g.ldb, g.batch, g.stride_b);
  Layout c = MakeLayout(type, g.m, g.n, g.ldc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  Check(cublasLtMatmulPreferenceCreate(&raw_pref), "cublasLtMatmulPreferenceCreate");
  Preference pref(raw_pref);
  const uint64_t workspace = 0;
  Check(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace),
        "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  Check(cublasLtMatmulAlgoGetHeuristic(h, raw_desc, a.get(), b.get(), c.get(), c.get(), raw_pref, 1, &result, &found),
        "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    gpurt::FailBlas(gpurt::kBlasNotSupported, kCall,
                    std::string("cuBLASLt has no algorithm for this ") + DTypeName(g.dtype) +
                        (g.bias || g.act != gpurt::GemmActivation::kNone
                             ? std::string(" GEMM with epilogue (bias ") + (g.bias ? "yes" : "no") +
                                   ", activation " + gpurt::GemmActivationName(g.act) + ")"
                             : std::string(" GEMM")) +
                        " (m=" + std::to_string(g.m) + ", n=" +
                        std::to_string(g.n) + ", k=" + std::to_string(g.k) + ", batch=" + std::to_string(g.batch) +
                        ") without a workspace");
  const double alpha64 = g.alpha, beta64 = g.beta;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &g.alpha;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &g.beta;
  Check(cublasLtMatmul(h, raw_desc, alpha, g.a, a.get(), g.b, b.get(), beta, g.c, c.get(), g.c, c.get(),
                       &result.algo, nullptr, 0, s),
        "cublasLtMatmul");
}

}  // namespace kiln::cuda
