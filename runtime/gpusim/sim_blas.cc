// The simulated cuBLASLt GEMM (sim.h, gpu.h's Platform::Gemm): column-major, strided-batched
// float32, run on the stream's worker thread over oneDNN's row-major dnnl_sgemm, after cuBLAS's
// checks (the handle, then the arguments: CheckGemm) and the simulator's own (the handle bound to
// this stream, the stream's device current, every matrix in live memory of the stream's device).
// It does not pick algorithms or use a workspace.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "sim.h"

namespace kiln::gpusim {

namespace {

std::string Gpu(int d) { return d < 0 ? std::string("host memory") : "gpu(" + std::to_string(d) + ")"; }

// The elements [lo, hi] one operand touches over the batch: `rows` x `cols` column-major with
// leading dimension `ld`, matrix i at i * stride.
struct Extent {
  int64_t lo = 0, hi = 0;
};
Extent Touched(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  const int64_t last = (cols - 1) * ld + rows - 1, step = (batch - 1) * stride;
  return {std::min<int64_t>(0, step), last + std::max<int64_t>(0, step)};
}

// On a GPU an operand outside the device's memory makes the GEMM kernel fault with
// CUDA_ERROR_ILLEGAL_ADDRESS (700), found later and sticky. The simulator reports the same code at
// the call, naming the operand, and leaves the device usable.
void CheckOperand(const Memory& memory, int device, const void* p, Extent e, const char* name, const char* call) {
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = base + static_cast<uintptr_t>(e.lo * 4);
  const size_t bytes = static_cast<size_t>(e.hi - e.lo + 1) * 4;
  const int owner = memory.DeviceOf(p);
  if (owner != device)
    gpurt::Fail(gpurt::kIllegalAddress, std::string(call) + " on gpu(" + std::to_string(device) + ")",
                std::string(name) + " is " + (owner < 0 ? std::string("host memory") : "memory of " + Gpu(owner)) +
                    ", not device memory of the stream's gpu(" + std::to_string(device) +
                    "); the GEMM kernel would fault there: copy the operand to the stream's device first");
  if (!memory.IsLive(first, bytes))
    gpurt::Fail(gpurt::kIllegalAddress, std::string(call) + " on gpu(" + std::to_string(device) + ")",
                std::string(name) + " spans " + std::to_string(bytes) + " bytes from its pointer" +
                    (e.lo < 0 ? " (negative batch stride)" : "") +
                    " given its shape, leading dimension and batch stride, past the end of its allocation: "
                    "check the leading dimension and stride (they count elements, column-major)");
}

char Op(gpurt::BlasOp op) { return op == gpurt::BlasOp::kN ? 'N' : 'T'; }

// One column-major GEMM on host-visible (aliased) pointers. cuBLAS never reads C when beta == 0
// (NaN there is ignored), so C is cleared instead of scaled.
void HostGemm(const gpurt::GemmArgs& g, const float* a, const float* b, float* c) {
  if (g.beta != 1.0f)
    for (int64_t j = 0; j < g.n; ++j) {
      float* col = c + j * g.ldc;
      if (g.beta == 0.0f) std::fill(col, col + g.m, 0.0f);
      else
        for (int64_t i = 0; i < g.m; ++i) col[i] *= g.beta;
    }
  if (g.k == 0 || g.alpha == 0.0f) return;
  // Column-major C (m x n) is row-major C^T (n x m) = op(B)^T op(A)^T, and a column-major matrix
  // read row-major is its transpose: so B comes first, with its op unchanged, and likewise A.
  dnnl_status_t st = dnnl_sgemm(Op(g.transb), Op(g.transa), g.n, g.m, g.k, g.alpha, b, g.ldb, a, g.lda, 1.0f, c, g.ldc);
  if (st != dnnl_success)
    gpurt::FailBlas(gpurt::kBlasExecutionFailed, "cublasLtMatmul",
                    "the simulator's CPU sgemm (oneDNN) failed with status " + std::to_string(static_cast<int>(st)));
}

}  // namespace

void EnqueueGemm(const Memory& memory, StreamImpl* s, gpurt::Stream h, int current_device, const LibraryBinding& bound,
                 const gpurt::GemmArgs& g) {
  const char* call = "cublasLtMatmul";
  if (!bound.found || bound.lib != gpurt::Library::kBlasLt)
    gpurt::FailBlas(gpurt::kBlasNotInitialized, call,
                    "the handle is not a cuBLASLt handle of this platform; get it with LibraryHandle(kBlasLt, stream)");
  // A real cuBLAS handle left bound to another stream runs the work there, racing with this
  // stream's work, and no status reports it; the simulator refuses with INVALID_VALUE (7).
  auto name = [](gpurt::Stream x, int dev) {  // by address: the bound stream may be destroyed by now
    char id[32];
    std::snprintf(id, sizeof id, "stream %p", static_cast<void*>(x));
    return (x ? std::string(id) : std::string("the default stream")) + " of " + Gpu(dev);
  };
  if (bound.device != s->device()->index || bound.stream != h)
    gpurt::FailBlas(gpurt::kBlasInvalidValue, call,
                    "the handle is bound to " + name(bound.stream, bound.device) +
                        " (by the last LibraryHandle call) but the GEMM is issued on " + name(h, s->device()->index) +
                        "; call LibraryHandle(kBlasLt, stream) for the stream you issue on, right before the call");
  gpurt::CheckGemm(g, call);
  const int device = s->device()->index;
  if (device != current_device)  // cuBLAS's kernel launch fails in the wrong context
    gpurt::FailBlas(gpurt::kBlasExecutionFailed, call,
                    "the stream belongs to " + Gpu(device) + " but this thread's current device is " +
                        Gpu(current_device) + "; call cudaSetDevice(" + std::to_string(device) + ") first");
  s->device()->CheckSticky(call);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;  // nothing is touched, as in cuBLAS
  const bool an = g.transa == gpurt::BlasOp::kN, bn = g.transb == gpurt::BlasOp::kN;
  const bool reads_ab = g.k > 0 && g.alpha != 0.0f;
  if (reads_ab) {
    CheckOperand(memory, device, g.a, Touched(an ? g.m : g.k, an ? g.k : g.m, g.lda, g.batch, g.stride_a), "A", call);
    CheckOperand(memory, device, g.b, Touched(bn ? g.k : g.n, bn ? g.n : g.k, g.ldb, g.batch, g.stride_b), "B", call);
  }
  CheckOperand(memory, device, g.c, Touched(g.m, g.n, g.ldc, g.batch, g.stride_c), "C", call);

  const intptr_t delta = memory.delta();
  auto alias = [delta](const float* p) { return reinterpret_cast<float*>(reinterpret_cast<intptr_t>(p) + delta); };
  gpurt::GemmArgs w = g;  // the work's own copy, on the host-visible alias of device memory
  w.a = reads_ab ? alias(g.a) : nullptr;
  w.b = reads_ab ? alias(g.b) : nullptr;
  w.c = alias(g.c);
  auto work = [w] {
    for (int64_t i = 0; i < w.batch; ++i)
      HostGemm(w, w.a ? w.a + i * w.stride_a : nullptr, w.b ? w.b + i * w.stride_b : nullptr, w.c + i * w.stride_c);
  };
  if (s->capturing) s->Capture([work](gpurt::Stream r) { reinterpret_cast<StreamImpl*>(r)->Enqueue(work); });
  else s->Enqueue(work);
}

}  // namespace kiln::gpusim
