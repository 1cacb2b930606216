// The one interface through which kiln reaches a GPU (DESIGN.md section 4a): devices and their
// limits, the current device of a thread, streams, events, device and pinned host memory, copies,
// module loading and kernel launch, graph capture and replay, library handles and collectives.
//
// Implementations, chosen once per process by gpurt::Get():
//   - the simulator (runtime/gpusim/), when KILN_GPU_SIM=N > 0, in every build;
//   - CUDA (runtime/cuda/), over cudart and the driver API reached through
//     cudaGetDriverEntryPointByVersion, in CUDA builds (zero devices without a driver);
//   - none (runtime/nocuda/), in builds without CUDA: zero devices.
// Code above this file never asks which one it has. Failures are GpuErrors carrying the CUDA
// driver API's result code (CUresult numbering, e.g. 1 CUDA_ERROR_INVALID_VALUE), so that the
// simulator's checks and the real driver's can be compared by number. CUDA's headers never leak
// through this file; handles are opaque pointers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/runtime/collectives.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpusim/emulator.h"

namespace kiln {
struct TensorView;
}

namespace kiln::gpurt {

/// CUresult codes the platform reports (cudart's cudaError_t uses the same numbers for these,
/// except where noted in CodeName's table).
enum Code : int {
  kSuccess = 0,
  kInvalidValue = 1,        ///< CUDA_ERROR_INVALID_VALUE (bad launch configuration, bad pointer)
  kOutOfMemory = 2,         ///< CUDA_ERROR_OUT_OF_MEMORY
  kNoDevice = 100,          ///< CUDA_ERROR_NO_DEVICE
  kInvalidDevice = 101,     ///< CUDA_ERROR_INVALID_DEVICE
  kInvalidImage = 200,      ///< CUDA_ERROR_INVALID_IMAGE (a module the loader cannot use)
  kInvalidContext = 201,    ///< CUDA_ERROR_INVALID_CONTEXT
  kIllegalState = 401,      ///< CUDA_ERROR_ILLEGAL_STATE (ending a capture that was not begun)
  kInvalidHandle = 400,     ///< CUDA_ERROR_INVALID_HANDLE (a stream/event/function of another device)
  kNotFound = 500,          ///< CUDA_ERROR_NOT_FOUND (no kernel of that name)
  kNotReady = 600,          ///< CUDA_ERROR_NOT_READY
  kIllegalAddress = 700,    ///< CUDA_ERROR_ILLEGAL_ADDRESS
  kLaunchOutOfResources = 701,  ///< CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (registers x threads)
  kMisalignedAddress = 716,     ///< CUDA_ERROR_MISALIGNED_ADDRESS
  kLaunchFailed = 719,          ///< CUDA_ERROR_LAUNCH_FAILED
  kNotSupported = 801,          ///< CUDA_ERROR_NOT_SUPPORTED
  kCaptureUnsupported = 900,    ///< CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
  kCaptureInvalidated = 901,    ///< CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
  kCaptureUnmatched = 903,      ///< CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
  kCapturedEvent = 907,         ///< CUDA_ERROR_CAPTURED_EVENT (an event last recorded in a capture)
  kCaptureWrongThread = 908,    ///< CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
};
/// "CUDA_ERROR_INVALID_VALUE" for 1; "CUDA_ERROR_<number>" for codes not in the table.
const char* CodeName(int code);

/// A failed GPU call: DeviceError with the CUDA code. what() reads
/// "<call> on gpu(i): CUDA_ERROR_NAME (code): <why and what to do>".
class GpuError : public DeviceError {
 public:
  GpuError(int code, const std::string& what) : DeviceError(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};
/// Throws GpuError(code) with "<call>: CUDA_ERROR_NAME (code): <detail>".
[[noreturn]] void Fail(int code, const std::string& call, const std::string& detail);

/// Grid and block sizes (one type with the kernel emulator's).
using Dim3 = gpusim::Dim3;

/// What cudaGetDeviceProperties reports, the parts kiln uses.
struct DeviceProperties {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
  size_t l2_bytes = 0;
  int warp_size = 32;
  int max_threads_per_block = 1024;
  Dim3 max_block{1024, 1024, 64};
  Dim3 max_grid{2147483647u, 65535, 65535};
  size_t shared_per_block = 48 << 10;         ///< without the per-kernel opt-in
  size_t shared_per_block_optin = 227 << 10;  ///< the most a kernel may opt in to
  int registers_per_block = 64 << 10;
  bool unified_addressing = true;
};

struct StreamRec;
struct EventRec;
struct ModuleRec;
struct FunctionRec;
struct GraphRec;
struct GraphExecRec;
using Stream = StreamRec*;  ///< cudaStream_t
using Event = EventRec*;    ///< cudaEvent_t
using Module = ModuleRec*;  ///< CUmodule
using Function = FunctionRec*;  ///< CUfunction
using Graph = GraphRec*;        ///< cudaGraph_t
using GraphExec = GraphExecRec*;  ///< cudaGraphExec_t

// The arguments of the cuDNN calls (kiln/runtime/gpu_dnn.h).
struct ConvForwardArgs;
struct DnnAlgoPerf;
struct ConvBackwardDataArgs;
struct ConvBackwardFilterArgs;
struct PoolingForwardArgs;
struct PoolingBackwardArgs;
struct BatchNormArgs;
struct BatchNormBackwardArgs;

/// One kernel module in both forms kiln generates: CUDA loads the PTX, the simulator the NVPTX
/// LLVM IR it was made from. Either may be empty where that platform is not used.
struct ModuleImage {
  std::string nvptx_ir;
  std::string ptx;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

/// The libraries whose handles the platform keeps (one per device, bound to a stream).
enum class Library { kBlasLt, kDnn };

/// cuBLAS status codes (cublasStatus_t numbering) that library calls report.
enum BlasStatus : int {
  kBlasNotInitialized = 1,   ///< CUBLAS_STATUS_NOT_INITIALIZED (no handle, or not a cuBLAS one)
  kBlasInvalidValue = 7,     ///< CUBLAS_STATUS_INVALID_VALUE (a documented argument check failed)
  kBlasExecutionFailed = 13, ///< CUBLAS_STATUS_EXECUTION_FAILED
  kBlasNotSupported = 15,    ///< CUBLAS_STATUS_NOT_SUPPORTED (no algorithm for the problem)
};
/// "CUBLAS_STATUS_INVALID_VALUE" for 7; "CUBLAS_STATUS_<number>" for others.
const char* BlasStatusName(int status);
/// A failed cuBLAS/cuBLASLt call: a GpuError whose code() is the cublasStatus_t (not a CUresult).
/// what() reads "<call>: CUBLAS_STATUS_NAME (n): <why and what to do>".
class BlasError : public GpuError {
 public:
  using GpuError::GpuError;
};
/// Throws BlasError(status) with "<call>: CUBLAS_STATUS_NAME (status): <detail>".
[[noreturn]] void FailBlas(int status, const std::string& call, const std::string& detail);

/// cublasOperation_t: CUBLAS_OP_N, CUBLAS_OP_T.
enum class BlasOp : int { kN = 0, kT = 1 };

/// The activation a GEMM's epilogue applies after the bias (cublasLtEpilogue_t: DEFAULT/BIAS,
/// RELU(_BIAS), GELU(_BIAS)). kGelu is cuBLASLt's: the tanh approximation
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), not kiln's exact x * Phi(x) (nd::gelu);
/// the two differ by less than 5e-4 everywhere.
enum class GemmActivation : int { kNone = 0, kRelu = 1, kGelu = 2 };
const char* GemmActivationName(GemmActivation a);

/// One (strided-batched) GEMM with cuBLAS's column-major semantics and cuBLASLt's epilogue:
///   C[i] = act(alpha * op(A[i]) * op(B[i]) + beta * C[i] + bias)   for i < batch,
/// op(A) m x k, op(B) k x n, C m x n, all column-major with leading dimensions lda, ldb, ldc;
/// A[i] = a + i * stride_a (elements; 0 repeats one matrix), likewise B and C. Pointers are device
/// memory of the stream's device; alpha and beta are host values. beta == 0 never reads C.
/// Row-major data: C^T = op(B)^T op(A)^T, i.e. pass the operands swapped (m <-> n, a <-> b).
/// dtype is that of A, B, C and bias: float32 (the default), float16 or bfloat16 (float32
/// accumulation and scale, the result rounded to nearest even once), or float64 (float64
/// throughout). tf32: float32 products on tensor cores with inputs rounded to 10 mantissa bits
/// (CUBLAS_COMPUTE_32F_FAST_TF32, relative error ~1e-3); ignored for other dtypes.
/// bias: null, or m values (one per row of column-major C, i.e. per column of row-major data,
/// the same for every batch entry) added before the activation.
struct GemmArgs {
  BlasOp transa = BlasOp::kN, transb = BlasOp::kN;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  DType dtype = DType::kFloat32;
  bool tf32 = false;
  const void* bias = nullptr;
  GemmActivation act = GemmActivation::kNone;
};
/// cuBLAS's documented argument checks of cublasSgemm(StridedBatched), shared by every platform:
/// BlasError kBlasInvalidValue when m, n, k or batch < 0, an op is neither N nor T,
/// lda < max(1, transa == N ? m : k), ldb < max(1, transb == N ? k : n), ldc < max(1, m),
/// or a pointer the product needs is null; kBlasNotSupported for a dtype other than float32,
/// float64, float16 or bfloat16, or an activation out of range.
void CheckGemm(const GemmArgs& g, const char* call);

/// kiln's matmul (op matmul: row-major out = op(a) op(b), NumPy-broadcast batch dimensions) on the
/// calling engine worker's stream through Platform::Gemm (runtime/gpu_kernels_blas.cc), with
/// cuBLASLt's epilogue: `bias` (null, or out's last dimension of values, out's dtype) added per
/// output column, then `act`. Contiguous operands of one dtype; a DTypeError for dtypes cuBLASLt
/// is not asked for here (integers, bool). float32 uses TF32 when the math mode allows it for
/// matmuls (kiln/runtime/math_mode.h). Compiled plans on GPUs
/// run their matmul + bias + activation groups through it.
void MatmulOnGpu(const TensorView& a, const TensorView& b, const TensorView& out, bool transpose_a,
                 bool transpose_b, const TensorView* bias = nullptr, GemmActivation act = GemmActivation::kNone);

class Platform {
 public:
  virtual ~Platform() = default;
  /// "cuda", "simulator" or "none".
  virtual const char* Name() const = 0;
  /// The CUDA version the driver supports (13000 for 13.0); 0 without one.
  virtual int DriverVersion() = 0;

  // ---- devices ----
  virtual int DeviceCount() = 0;
  virtual DeviceProperties Properties(int device) = 0;
  /// The calling thread's current device (cudaSetDevice); 0 until it is set, as in CUDA.
  virtual void SetDevice(int device) = 0;
  virtual int GetDevice() = 0;
  /// Waits for all work of the current device.
  virtual void DeviceSynchronize() = 0;
  virtual bool CanAccessPeer(int device, int peer) = 0;
  /// Lets the current device read `peer`'s memory directly (idempotent).
  virtual void EnablePeerAccess(int peer) = 0;

  // ---- streams and events (created on the current device) ----
  virtual Stream StreamCreate() = 0;  ///< non-blocking with respect to the legacy default stream
  virtual void StreamDestroy(Stream s) = 0;
  virtual void StreamSynchronize(Stream s) = 0;
  /// True when everything queued on `s` has finished (kNotReady is not an error here).
  virtual bool StreamQuery(Stream s) = 0;
  /// Work queued on `s` after this waits for the most recent record of `e` (any device's).
  virtual void StreamWaitEvent(Stream s, Event e) = 0;
  /// cudaLaunchHostFunc: `fn(data)` runs on a host thread once the work before it on `s` is done;
  /// the work after it waits for it. `fn` must not call the platform.
  virtual void LaunchHostFunc(Stream s, void (*fn)(void*), void* data) = 0;
  virtual Event EventCreate(bool timing) = 0;
  virtual void EventDestroy(Event e) = 0;
  /// `s` must belong to the event's device.
  virtual void EventRecord(Event e, Stream s) = 0;
  virtual bool EventQuery(Event e) = 0;
  virtual void EventSynchronize(Event e) = 0;
  /// Milliseconds between two completed records of timing events of one device.
  virtual float EventElapsedMs(Event start, Event end) = 0;

  // ---- memory ----
  /// Device memory of the current device; GpuError kOutOfMemory when it is exhausted.
  virtual void* Malloc(size_t nbytes) = 0;
  virtual void Free(void* p) = 0;
  virtual void* HostAllocPinned(size_t nbytes) = 0;
  virtual void HostFreePinned(void* p) = 0;
  /// True for memory from HostAllocPinned (copies from it are asynchronous).
  virtual bool IsPinnedHost(const void* p) = 0;
  /// Stream-ordered copy. From or to pageable host memory it returns once the host side is done
  /// (as cudaMemcpyAsync does); with pinned memory it returns at once.
  virtual void MemcpyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind, Stream s) = 0;
  virtual void MemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                               Stream s) = 0;
  virtual void MemsetAsync(void* dst, int value, size_t nbytes, Stream s) = 0;

  // ---- modules and kernels ----
  /// Loads `image` on the current device.
  virtual Module ModuleLoad(const ModuleImage& image) = 0;
  virtual void ModuleUnload(Module m) = 0;
  /// GpuError kNotFound when the module has no kernel `name`.
  virtual Function ModuleGetFunction(Module m, const std::string& name) = 0;
  /// The per-kernel opt-in to more than 48 KiB of dynamic shared memory.
  virtual void FuncSetMaxDynamicSharedMemory(Function f, size_t bytes) = 0;
  /// cuLaunchKernel: `args` holds one pointer per kernel parameter; their values are copied
  /// before this returns. `s` must belong to the calling thread's current device.
  virtual void LaunchKernel(Function f, Dim3 grid, Dim3 block, size_t dynamic_smem, Stream s, void** args) = 0;

  // ---- graphs (thread-local capture mode: the capturing thread may not allocate, free or
  // synchronize; other threads may) ----
  virtual void StreamBeginCapture(Stream s) = 0;
  virtual Graph StreamEndCapture(Stream s) = 0;
  virtual bool StreamIsCapturing(Stream s) = 0;
  virtual GraphExec GraphInstantiate(Graph g) = 0;
  virtual void GraphLaunch(GraphExec g, Stream s) = 0;
  virtual void GraphDestroy(Graph g) = 0;
  virtual void GraphExecDestroy(GraphExec g) = 0;

  // ---- libraries ----
  /// The handle of `lib` for the current device (cublasLtHandle_t, cudnnHandle_t), created on
  /// first use, bound to `s` (cudnnSetStream) before it is returned.
  virtual void* LibraryHandle(Library lib, Stream s) = 0;
  /// The (strided-batched) GEMM of `g` on stream `s`, through `blas` = LibraryHandle(kBlasLt, s)
  /// (cublasLtMatmul on CUDA; on the simulator, the CPU's sgemm with cuBLAS's checks), from a thread
  /// whose current device is the stream's. Stream-ordered: returns once queued; capturable.
  /// Errors: BlasError kBlasNotInitialized (not a cuBLASLt handle), kBlasInvalidValue (CheckGemm's
  /// rules; on the simulator also a handle bound to another stream), kBlasExecutionFailed (the
  /// stream's device is not current); on the simulator, GpuError kIllegalAddress for an operand
  /// outside live memory of the stream's device (a real GPU's kernel faults there later).
  /// The default implementation fails with kNotSupported (no GPU library).
  virtual void Gemm(void* blas, Stream s, const GemmArgs& g);

  // ---- cuDNN ----
  // Each runs on `s` through `dnn` = LibraryHandle(Library::kDnn, s), which must be bound to `s`
  // (else CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH); data pointers are device memory of the stream's
  // device. cuDNN's argument checks (gpu_dnn.h) fail with a DnnError carrying cuDNN's status.
  // Stream-ordered: each returns once queued. The defaults fail (no GPU library).
  virtual void DnnConvolutionForward(void* dnn, Stream s, const ConvForwardArgs& a);
  virtual void DnnConvolutionBackwardData(void* dnn, Stream s, const ConvBackwardDataArgs& a);
  virtual void DnnConvolutionBackwardFilter(void* dnn, Stream s, const ConvBackwardFilterArgs& a);
  /// The workspace bytes the call with these arguments needs (its algorithm chosen and cached per
  /// shape; the same checks as the call), for the args' `workspace`; 0: none (the default).
  virtual size_t DnnConvolutionWorkspaceSize(void* dnn, Stream s, const ConvForwardArgs& a);
  virtual size_t DnnConvolutionWorkspaceSize(void* dnn, Stream s, const ConvBackwardDataArgs& a);
  virtual size_t DnnConvolutionWorkspaceSize(void* dnn, Stream s, const ConvBackwardFilterArgs& a);
  /// Every algorithm of the call with these arguments, run on its buffers (the output is
  /// overwritten) with its workspace (`workspace_bytes` at most; an algorithm that needs more is
  /// reported, not run), fastest first (cudnnFind*AlgorithmEx). Waits for the stream; refused while
  /// it captures. The default: none (a platform that cannot measure; the heuristic choice stands).
  virtual std::vector<DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, Stream s, const ConvForwardArgs& a);
  virtual std::vector<DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, Stream s, const ConvBackwardDataArgs& a);
  virtual std::vector<DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, Stream s,
                                                                const ConvBackwardFilterArgs& a);
  /// What a measured choice depends on besides the problem (the library's version, the device's
  /// model): part of the key of a choice cached on disk. Empty: choices are not kept on disk.
  virtual std::string DnnLibraryKey(int device);
  virtual void DnnPoolingForward(void* dnn, Stream s, const PoolingForwardArgs& a);
  virtual void DnnBatchNormForwardTraining(void* dnn, Stream s, const BatchNormArgs& a);
  virtual void DnnBatchNormForwardInference(void* dnn, Stream s, const BatchNormArgs& a);
  virtual void DnnPoolingBackward(void* dnn, Stream s, const PoolingBackwardArgs& a);
  virtual void DnnBatchNormBackward(void* dnn, Stream s, const BatchNormBackwardArgs& a);

  // ---- collectives among this process's GPUs (NCCL on CUDA, in-process on the simulator) ----
  // Each runs on the calling thread over `devices` (distinct, in device order) and returns when
  // the results are final; see runtime/collectives.h for the contracts.
  virtual void AllReduce(std::span<const Device> devices, const coll::BufferSet& b, coll::ReduceOp op) = 0;
  virtual void Broadcast(std::span<const Device> devices, const coll::BufferSet& b, int root) = 0;
  virtual void ReduceScatter(std::span<const Device> devices, DType dt, std::span<const void* const> in, int64_t n,
                             std::span<void* const> out, coll::ReduceOp op) = 0;
  virtual void AllGather(std::span<const Device> devices, DType dt, std::span<const void* const> in,
                         std::span<const int64_t> counts, std::span<void* const> out) = 0;
};

/// The process's platform: the simulator under KILN_GPU_SIM=N > 0, else CUDA in CUDA builds,
/// else none. Chosen on first call; lives for the process. Every call through it is counted
/// (Counters()).
Platform& Get();

/// What decides a GPU step's speed, counted at the platform's calls (process-wide, every device,
/// since the process started; the same on CUDA and the simulator): a test or benchmark reads them
/// before and after a step (kiln.gpu_step_stats). A capture's launches count as launches (the
/// capture issues them); a graph's replay is one graph launch and no kernel launch.
struct PlatformCounters {
  std::atomic<int64_t> kernel_launches{0};  ///< LaunchKernel (kiln's own kernels, fused or not)
  std::atomic<int64_t> library_calls{0};    ///< cuBLASLt GEMMs and cuDNN calls (not workspace queries)
  std::atomic<int64_t> graph_launches{0};   ///< CUDA graph replays
  /// An engine worker (a thread with a GPU stream) waited for the device inside its work: a kernel
  /// reading a flag back, a copy into host memory. The program's own waits (asnumpy, waitall) are
  /// not counted: they are where a step ends.
  std::atomic<int64_t> host_syncs{0};
  std::atomic<int64_t> device_mallocs{0};   ///< cudaMalloc (the caching allocator's misses, arenas, buffers)
  std::atomic<int64_t> h2d_bytes{0}, d2h_bytes{0}, d2d_bytes{0};  ///< bytes copied, by direction
  std::atomic<int64_t> copies{0};           ///< copies of any direction (and peer copies)
  std::atomic<int64_t> memsets{0};
};
PlatformCounters& Counters();

/// Makes `device` current on this thread (on platform `p`) for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, Platform& p = Get()) : p_(p), prev_(p.GetDevice()) {
    if (prev_ != device) p_.SetDevice(device);
  }
  ~DeviceGuard() {
    try {
      if (p_.GetDevice() != prev_) p_.SetDevice(prev_);
    } catch (...) {
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Platform& p_;
  int prev_;
};

// Implementations (each defined by its folder; Get() picks one).
Platform* CreateCudaPlatform();       ///< runtime/cuda/ or runtime/nocuda/ (nullptr there)
Platform* CreateSimulatedPlatform(int devices, size_t bytes_per_device);  ///< runtime/gpusim/
Platform* CreateNoPlatform();         ///< zero devices, every call a DeviceError

}  // namespace kiln::gpurt
