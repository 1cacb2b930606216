// The simulated cuBLASLt GEMM (sim.h, gpu.h's Platform::Gemm): column-major, strided-batched,
// run on the stream's worker thread after cuBLAS's checks (the handle, then the arguments:
// CheckGemm) and the simulator's own (the handle bound to this stream, the stream's device
// current, every matrix and the bias in live memory of the stream's device). float32, float16
// and bfloat16 multiply in float32 over oneDNN's row-major dnnl_sgemm (16-bit operands converted
// first, the result rounded once to nearest even), TF32 by rounding the float32 inputs to 10
// mantissa bits first; float64 multiplies in double. The epilogue (beta * C, bias, relu or
// cuBLASLt's tanh GELU) follows the product in the accumulation type. It does not pick
// algorithms or use a workspace.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/runtime/dtype.h"
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
void CheckOperand(const Memory& memory, int device, const void* p, Extent e, size_t elem, const char* name,
                  const char* call) {
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = base + static_cast<uintptr_t>(e.lo * static_cast<int64_t>(elem));
  const size_t bytes = static_cast<size_t>(e.hi - e.lo + 1) * elem;
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

// One column-major operand as stored (rows x cols, leading dimension ld) packed (ld = rows) in the
// accumulation type Acc, TF32-rounded when asked.
template <class T, class Acc>
std::vector<Acc> Pack(const T* p, int64_t rows, int64_t cols, int64_t ld, bool tf32) {
  std::vector<Acc> out(static_cast<size_t>(rows * cols));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) {
      Acc v = static_cast<Acc>(static_cast<compute_t<T>>(p[i + j * ld]));
      if constexpr (std::is_same_v<Acc, float>)
        if (tf32) v = RoundTf32(v);
      out[static_cast<size_t>(i + j * rows)] = v;
    }
  return out;
}

template <class Acc>
Acc Activate(Acc x, gpurt::GemmActivation act) {
  switch (act) {
  case gpurt::GemmActivation::kNone: return x;
  case gpurt::GemmActivation::kRelu: return x > Acc(0) ? x : Acc(0);  // NaN -> 0, as max(x, 0) on the GPU
  case gpurt::GemmActivation::kGelu: {  // cuBLASLt's GELU epilogue: the tanh approximation
    const Acc c = static_cast<Acc>(0.7978845608028654), d = static_cast<Acc>(0.044715);
    return Acc(0.5) * x * (Acc(1) + std::tanh(c * (x + d * x * x * x)));
  }
  }
  return x;
}

// One column-major GEMM on host-visible (aliased) pointers, in T's accumulation type Acc (float,
// double for float64): the product op(A) op(B) first (oneDNN's sgemm for float, a plain loop for
// double), then cuBLASLt's epilogue per element: alpha * product + beta * C + bias, the
// activation, one rounding to T. cuBLAS never reads C when beta == 0 (NaN there is ignored).
template <class T>
void HostGemm(const gpurt::GemmArgs& g, const T* a, const T* b, T* c) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const bool an = g.transa == gpurt::BlasOp::kN, bn = g.transb == gpurt::BlasOp::kN;
  const bool product = g.k > 0 && g.alpha != 0.0f;
  std::vector<Acc> prod;
  if (product) {
    const int64_t ar = an ? g.m : g.k, ac = an ? g.k : g.m, br = bn ? g.k : g.n, bc = bn ? g.n : g.k;
    const bool tf32 = g.tf32 && std::is_same_v<T, float>;
    const std::vector<Acc> pa = Pack<T, Acc>(a, ar, ac, g.lda, tf32), pb = Pack<T, Acc>(b, br, bc, g.ldb, tf32);
    prod.assign(static_cast<size_t>(g.m * g.n), Acc(0));
    if constexpr (std::is_same_v<Acc, float>) {
      // Column-major P (m x n) is row-major P^T (n x m) = op(B)^T op(A)^T, and a column-major
      // matrix read row-major is its transpose: so B comes first, with its op unchanged, and likewise A.
      dnnl_status_t st = dnnl_sgemm(Op(g.transb), Op(g.transa), g.n, g.m, g.k, 1.0f, pb.data(), std::max<int64_t>(1, br),
                                    pa.data(), std::max<int64_t>(1, ar), 0.0f, prod.data(), g.m);
      if (st != dnnl_success)
        gpurt::FailBlas(gpurt::kBlasExecutionFailed, "cublasLtMatmul",
                        "the simulator's CPU sgemm (oneDNN) failed with status " + std::to_string(static_cast<int>(st)));
    } else {
      for (int64_t j = 0; j < g.n; ++j)
        for (int64_t l = 0; l < g.k; ++l) {
          const Acc bv = pb[static_cast<size_t>(bn ? l + j * br : j + l * br)];
          for (int64_t i = 0; i < g.m; ++i)
            prod[static_cast<size_t>(i + j * g.m)] += pa[static_cast<size_t>(an ? i + l * ar : l + i * ar)] * bv;
        }
    }
  }
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);
  const T* bias = static_cast<const T*>(g.bias);
  for (int64_t j = 0; j < g.n; ++j) {
    T* col = c + j * g.ldc;
    for (int64_t i = 0; i < g.m; ++i) {
      Acc v = product ? alpha * prod[static_cast<size_t>(i + j * g.m)] : Acc(0);
      if (g.beta != 0.0f) v += beta * static_cast<Acc>(static_cast<compute_t<T>>(col[i]));
      if (bias) v += static_cast<Acc>(static_cast<compute_t<T>>(bias[i]));
      col[i] = static_cast<T>(Activate(v, g.act));
    }
  }
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
  const size_t elem = DTypeSize(g.dtype);
  if (reads_ab) {
    CheckOperand(memory, device, g.a, Touched(an ? g.m : g.k, an ? g.k : g.m, g.lda, g.batch, g.stride_a), elem, "A",
                 call);
    CheckOperand(memory, device, g.b, Touched(bn ? g.k : g.n, bn ? g.n : g.k, g.ldb, g.batch, g.stride_b), elem, "B",
                 call);
  }
  CheckOperand(memory, device, g.c, Touched(g.m, g.n, g.ldc, g.batch, g.stride_c), elem, "C", call);
  if (g.bias) CheckOperand(memory, device, g.bias, Touched(g.m, 1, g.m, 1, 0), elem, "the bias", call);

  const intptr_t delta = memory.delta();
  auto alias = [delta](const void* p) { return reinterpret_cast<void*>(reinterpret_cast<intptr_t>(p) + delta); };
  gpurt::GemmArgs w = g;  // the work's own copy, on the host-visible alias of device memory
  w.a = reads_ab ? alias(g.a) : nullptr;
  w.b = reads_ab ? alias(g.b) : nullptr;
  w.c = alias(g.c);
  w.bias = g.bias ? alias(g.bias) : nullptr;
  auto work = [w] {
    auto run = [&w](auto tag) {
      using T = decltype(tag);
      const T *a = static_cast<const T*>(w.a), *b = static_cast<const T*>(w.b);
      T* c = static_cast<T*>(w.c);
      for (int64_t i = 0; i < w.batch; ++i)
        HostGemm<T>(w, a ? a + i * w.stride_a : nullptr, b ? b + i * w.stride_b : nullptr, c + i * w.stride_c);
    };
    switch (w.dtype) {
    case DType::kFloat64: run(double{}); break;
    case DType::kFloat16: run(Half{}); break;
    case DType::kBFloat16: run(BFloat16{}); break;
    default: run(float{}); break;
    }
  };
  if (s->capturing) s->Capture([work](gpurt::Stream r) { reinterpret_cast<StreamImpl*>(r)->Enqueue(work); });
  else s->Enqueue(work);
}

}  // namespace kiln::gpusim
