// What every GPU platform shares of its BLAS (gpu.h): the names of cuBLAS's status codes, the
// BlasError they travel in, and cuBLAS's documented argument checks of cublasSgemm and
// cublasSgemmStridedBatched (plus the dtype and epilogue a GemmArgs may ask for), run before a
// GEMM is issued on CUDA and on the simulator alike, so that a wrong leading dimension fails with
// the same status on both.
#include <algorithm>
#include <string>
#include <utility>

#include "kiln/runtime/gpu.h"

namespace kiln::gpurt {

const char* BlasStatusName(int status) {
  switch (status) {
  case 0: return "CUBLAS_STATUS_SUCCESS";
  case kBlasNotInitialized: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
  case kBlasInvalidValue: return "CUBLAS_STATUS_INVALID_VALUE";
  case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
  case kBlasExecutionFailed: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case kBlasNotSupported: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
  default: return "CUBLAS_STATUS";
  }
}

void FailBlas(int status, const std::string& call, const std::string& detail) {
  throw BlasError(status, call + ": " + BlasStatusName(status) + " (" + std::to_string(status) + "): " + detail);
}

namespace {
const char* OpName(BlasOp op) { return op == BlasOp::kN ? "N" : op == BlasOp::kT ? "T" : "?"; }
}  // namespace

const char* GemmActivationName(GemmActivation a) {
  switch (a) {
  case GemmActivation::kNone: return "none";
  case GemmActivation::kRelu: return "relu";
  case GemmActivation::kGelu: return "gelu";
  }
  return "?";
}

void CheckGemm(const GemmArgs& g, const char* call) {
  if (g.dtype != DType::kFloat32 && g.dtype != DType::kFloat64 && g.dtype != DType::kFloat16 &&
      g.dtype != DType::kBFloat16)
    FailBlas(kBlasNotSupported, call,
             std::string("dtype ") + DTypeName(g.dtype) +
                 ": cuBLASLt GEMMs here take float32, float64, float16 or bfloat16; cast the operands");
  if (g.act != GemmActivation::kNone && g.act != GemmActivation::kRelu && g.act != GemmActivation::kGelu)
    FailBlas(kBlasNotSupported, call,
             "activation " + std::to_string(static_cast<int>(g.act)) + " is none of none (0), relu (1), gelu (2)");
  auto bad = [&](const std::string& why) {
    FailBlas(kBlasInvalidValue, call,
             why + " (m=" + std::to_string(g.m) + ", n=" + std::to_string(g.n) + ", k=" + std::to_string(g.k) +
                 ", transa=" + OpName(g.transa) + ", transb=" + OpName(g.transb) + ", lda=" + std::to_string(g.lda) +
                 ", ldb=" + std::to_string(g.ldb) + ", ldc=" + std::to_string(g.ldc) +
                 "); matrices are column-major: for row-major data pass the operands swapped, "
                 "C^T = op(B)^T op(A)^T");
  };
  if (g.transa != BlasOp::kN && g.transa != BlasOp::kT)
    bad("transa=" + std::to_string(static_cast<int>(g.transa)) + " is neither CUBLAS_OP_N (0) nor CUBLAS_OP_T (1)");
  if (g.transb != BlasOp::kN && g.transb != BlasOp::kT)
    bad("transb=" + std::to_string(static_cast<int>(g.transb)) + " is neither CUBLAS_OP_N (0) nor CUBLAS_OP_T (1)");
  for (auto [name, v] : {std::pair{"m", g.m}, std::pair{"n", g.n}, std::pair{"k", g.k}, std::pair{"batchCount", g.batch}})
    if (v < 0) bad(std::string(name) + "=" + std::to_string(v) + " is negative; expected 0 or more");
  const int64_t a_rows = g.transa == BlasOp::kN ? g.m : g.k;
  const int64_t b_rows = g.transb == BlasOp::kN ? g.k : g.n;
  if (g.lda < std::max<int64_t>(1, a_rows))
    bad("lda=" + std::to_string(g.lda) + " is less than max(1, " + std::string(g.transa == BlasOp::kN ? "m" : "k") +
        ")=" + std::to_string(std::max<int64_t>(1, a_rows)) + ", the rows of A as stored");
  if (g.ldb < std::max<int64_t>(1, b_rows))
    bad("ldb=" + std::to_string(g.ldb) + " is less than max(1, " + std::string(g.transb == BlasOp::kN ? "k" : "n") +
        ")=" + std::to_string(std::max<int64_t>(1, b_rows)) + ", the rows of B as stored");
  if (g.ldc < std::max<int64_t>(1, g.m))
    bad("ldc=" + std::to_string(g.ldc) + " is less than max(1, m)=" + std::to_string(std::max<int64_t>(1, g.m)) +
        ", the rows of C");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;  // nothing is touched
  if ((g.bias || g.act != GemmActivation::kNone) && (g.k == 0 || g.alpha == 0.0f))
    FailBlas(kBlasNotSupported, call,
             std::string("an epilogue (") + (g.bias ? "bias, " : "") + "activation " + GemmActivationName(g.act) +
                 ") needs a product to follow: k=" + std::to_string(g.k) + ", alpha=" + std::to_string(g.alpha) +
                 "; apply the bias and activation as separate ops when k == 0 or alpha == 0");
  if (!g.c) bad(std::string("C is null; expected a device pointer to m x n ") + DTypeName(g.dtype) + " values");
  if (g.k > 0 && g.alpha != 0.0f) {  // A and B are read only then
    if (!g.a) bad(std::string("A is null; expected a device pointer to op(A), m x k ") + DTypeName(g.dtype) + " values");
    if (!g.b) bad(std::string("B is null; expected a device pointer to op(B), k x n ") + DTypeName(g.dtype) + " values");
  }
}

void Platform::Gemm(void*, Stream, const GemmArgs&) {
  Fail(kNotSupported, "cublasLtMatmul", std::string("the ") + Name() + " GPU platform has no BLAS library");
}

}  // namespace kiln::gpurt
