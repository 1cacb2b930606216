// Platform::Gemm (gpu.h), the cuBLASLt GEMM, on the simulated GPUs: column-major results against a
// plain reference for every transpose and strided batches, beta's rules, cuBLAS's argument checks
// with status 7 and messages that name the argument, the row-major mistakes blind backends make,
// the handle's stream binding, operands in the wrong memory, device 1, and stream order. They run
// on the process's simulator under KILN_GPU_SIM (CTest's "sim2:" run), else on a private one.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_sim_util.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
using gpurt::BlasOp;
using gpurt::GemmArgs;

namespace {

// Uniform in [-1, 1): the same generator and numbers as before, from test_util.h.
std::vector<float> Random(size_t n, unsigned seed) { return kiln::testing::Random(n, -1.0f, 1.0f, seed); }

// Device memory of the current device holding `host`, freed with the test.
struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<float>& host, gpurt::Stream s = nullptr) : n(host.size()) {
    p = static_cast<float*>(Sim().Malloc(n * sizeof(float)));
    Sim().MemcpyAsync(p, host.data(), n * sizeof(float), gpurt::CopyKind::kHostToDevice, s);
  }
  ~DeviceBuffer() { Sim().Free(p); }
  std::vector<float> Read(gpurt::Stream s = nullptr) const {  // pageable: returns when the copy is done
    std::vector<float> h(n);
    Sim().MemcpyAsync(h.data(), p, n * sizeof(float), gpurt::CopyKind::kDeviceToHost, s);
    return h;
  }
  float* p;
  size_t n;
};

// cuBLAS's definition, column-major, in double, on host copies of the operands (one batch entry).
void Reference(const GemmArgs& g, const float* a, const float* b, float* c) {
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double acc = 0;
      for (int64_t l = 0; l < g.k; ++l) {
        const float x = g.transa == BlasOp::kN ? a[i + l * g.lda] : a[l + i * g.lda];
        const float y = g.transb == BlasOp::kN ? b[l + j * g.ldb] : b[j + l * g.ldb];
        acc += static_cast<double>(x) * y;
      }
      float& out = c[i + j * g.ldc];
      out = static_cast<float>(g.alpha * acc + (g.beta == 0.0f ? 0.0 : static_cast<double>(g.beta) * out));
    }
}

// The status and message of the BlasError `f` throws (status -1: it threw none).
template <class F>
std::pair<int, std::string> BlasFailure(F&& f) {
  try {
    f();
  } catch (const gpurt::BlasError& e) {
    return {e.code(), e.what()};
  }
  return {-1, ""};
}

// A float32 product with every operand on the current device: A (rows x cols as stored), B, C.
struct Problem {
  Problem(BlasOp ta, BlasOp tb, int64_t m, int64_t n, int64_t k, int64_t batch = 1, int64_t pad = 0) {
    g.transa = ta, g.transb = tb, g.m = m, g.n = n, g.k = k, g.batch = batch;
    g.lda = (ta == BlasOp::kN ? m : k) + pad;
    g.ldb = (tb == BlasOp::kN ? k : n) + pad;
    g.ldc = m + pad;
    g.stride_a = g.lda * (ta == BlasOp::kN ? k : m);
    g.stride_b = g.ldb * (tb == BlasOp::kN ? n : k);
    g.stride_c = g.ldc * n;
    a = Random(static_cast<size_t>(std::max<int64_t>(1, g.stride_a * batch)), 1);  // k == 0: one unread float
    b = Random(static_cast<size_t>(std::max<int64_t>(1, g.stride_b * batch)), 2);
    c = Random(static_cast<size_t>(g.stride_c * batch), 3);
  }
  // Uploads, runs Gemm on `s` (with its bound handle), returns C as the device left it.
  std::vector<float> Run(gpurt::Stream s) {
    DeviceBuffer da(a, s), db(b, s), dc(c, s);
    GemmArgs d = g;
    d.a = da.p, d.b = db.p, d.c = dc.p;
    Sim().Gemm(Sim().LibraryHandle(gpurt::Library::kBlasLt, s), s, d);
    return dc.Read(s);
  }
  std::vector<float> Expected() const {
    std::vector<float> out = c;
    for (int64_t i = 0; i < g.batch; ++i)
      Reference(g, a.data() + i * g.stride_a, b.data() + i * g.stride_b, out.data() + i * g.stride_c);
    return out;
  }
  GemmArgs g;
  std::vector<float> a, b, c;
};

void CheckClose(const std::vector<float>& got, const std::vector<float>& want, float tol = 1e-5f) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol * (1.0f + std::fabs(want[i])));
  }
}

}  // namespace

TEST_CASE("gpu blas: a row-major product passed as its transpose (operands swapped) matches the CPU") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  const int64_t M = 37, K = 23, N = 19;  // row-major x (M x K) times w (K x N) into y (M x N)
  std::vector<float> x = Random(M * K, 11), w = Random(K * N, 12), want(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < K; ++l) acc += static_cast<double>(x[i * K + l]) * w[l * N + j];
      want[i * N + j] = static_cast<float>(acc);
    }
  DeviceBuffer dx(x, s), dw(w, s), dy(std::vector<float>(M * N, 0.0f), s);
  // y^T = w^T x^T in column-major terms: m = N, n = M, A = w (lda = N), B = x (ldb = K), ldc = N.
  GemmArgs g;
  g.m = N, g.n = M, g.k = K;
  g.a = dw.p, g.lda = N, g.b = dx.p, g.ldb = K, g.c = dy.p, g.ldc = N;
  p.Gemm(p.LibraryHandle(gpurt::Library::kBlasLt, s), s, g);
  CheckClose(dy.Read(s), want);
  p.StreamDestroy(s);
}

TEST_CASE("gpu blas: all four transpose combinations match the column-major definition, padding untouched") {
  gpurt::Stream s = Sim().StreamCreate();
  for (BlasOp ta : {BlasOp::kN, BlasOp::kT})
    for (BlasOp tb : {BlasOp::kN, BlasOp::kT}) {
      CAPTURE(static_cast<int>(ta));
      CAPTURE(static_cast<int>(tb));
      Problem pr(ta, tb, 13, 7, 29, 1, 3);  // lda, ldb, ldc 3 more than the rows: padding rows in C too
      pr.g.alpha = 1.5f;
      CheckClose(pr.Run(s), pr.Expected());  // Expected() keeps C's padding as uploaded
    }
  Sim().StreamDestroy(s);
}

TEST_CASE("gpu blas: strided batches, and a batch stride of 0 repeats one matrix") {
  gpurt::Stream s = Sim().StreamCreate();
  Problem pr(BlasOp::kT, BlasOp::kN, 8, 6, 5, 4);
  CheckClose(pr.Run(s), pr.Expected());
  Problem shared(BlasOp::kN, BlasOp::kN, 8, 6, 5, 4);
  shared.g.stride_a = 0;  // one A for every batch entry (a broadcast weight)
  shared.a.resize(static_cast<size_t>(shared.g.lda * shared.g.k));
  const std::vector<float> got = shared.Run(s);
  CheckClose(got, shared.Expected());
  CHECK(got[0] != got[static_cast<size_t>(shared.g.stride_c)]);  // B differs per entry, so C does
  Sim().StreamDestroy(s);
}

TEST_CASE("gpu blas: beta != 0 accumulates into C, and beta == 0 never reads C (NaN there is ignored)") {
  gpurt::Stream s = Sim().StreamCreate();
  Problem acc(BlasOp::kN, BlasOp::kT, 9, 4, 6);
  acc.g.alpha = 2.0f, acc.g.beta = 0.5f;
  CheckClose(acc.Run(s), acc.Expected());

  Problem nan(BlasOp::kN, BlasOp::kN, 9, 4, 6);
  std::fill(nan.c.begin(), nan.c.end(), std::numeric_limits<float>::quiet_NaN());
  CheckClose(nan.Run(s), nan.Expected());
  Problem empty_k(BlasOp::kN, BlasOp::kN, 9, 4, 0);  // k == 0: C = beta * C
  empty_k.g.ldb = 1;  // max(1, k)
  std::fill(empty_k.c.begin(), empty_k.c.end(), std::numeric_limits<float>::quiet_NaN());
  for (float v : empty_k.Run(s)) REQUIRE(v == 0.0f);
  Problem scaled(BlasOp::kN, BlasOp::kN, 9, 4, 0);
  scaled.g.ldb = 1, scaled.g.beta = -3.0f;
  CheckClose(scaled.Run(s), scaled.Expected());
  Sim().StreamDestroy(s);
}

TEST_CASE("gpu blas: every argument check fails with CUBLAS_STATUS_INVALID_VALUE naming argument, expected, found") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kBlasLt, s);
  Problem pr(BlasOp::kN, BlasOp::kN, 6, 5, 4);
  DeviceBuffer da(pr.a, s), db(pr.b, s), dc(pr.c, s);
  GemmArgs ok = pr.g;
  ok.a = da.p, ok.b = db.p, ok.c = dc.p;
  struct Case {
    const char* what;
    std::function<void(GemmArgs&)> change;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"m < 0", [](GemmArgs& g) { g.m = -1; }, {"m=-1 is negative", "expected 0 or more"}},
      {"n < 0", [](GemmArgs& g) { g.n = -2; }, {"n=-2 is negative"}},
      {"k < 0", [](GemmArgs& g) { g.k = -3; }, {"k=-3 is negative"}},
      {"batch < 0", [](GemmArgs& g) { g.batch = -1; }, {"batchCount=-1 is negative"}},
      {"transa", [](GemmArgs& g) { g.transa = static_cast<BlasOp>(7); }, {"transa=7", "CUBLAS_OP_N"}},
      {"transb", [](GemmArgs& g) { g.transb = static_cast<BlasOp>(9); }, {"transb=9", "CUBLAS_OP_T"}},
      {"lda < m", [](GemmArgs& g) { g.lda = 5; }, {"lda=5 is less than max(1, m)=6"}},
      {"lda < k (A transposed)", [](GemmArgs& g) { g.transa = BlasOp::kT, g.lda = 3; },
       {"lda=3 is less than max(1, k)=4"}},
      {"ldb < k", [](GemmArgs& g) { g.ldb = 3; }, {"ldb=3 is less than max(1, k)=4"}},
      {"ldb < n (B transposed)", [](GemmArgs& g) { g.transb = BlasOp::kT, g.ldb = 4; },
       {"ldb=4 is less than max(1, n)=5"}},
      {"ldc < m", [](GemmArgs& g) { g.ldc = 2; }, {"ldc=2 is less than max(1, m)=6"}},
      {"ldc of an empty C", [](GemmArgs& g) { g.m = 0, g.lda = 1, g.ldc = 0; }, {"ldc=0 is less than max(1, m)=1"}},
      {"C null", [](GemmArgs& g) { g.c = nullptr; }, {"C is null", "expected a device pointer"}},
      {"A null", [](GemmArgs& g) { g.a = nullptr; }, {"A is null"}},
      {"B null", [](GemmArgs& g) { g.b = nullptr; }, {"B is null"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    GemmArgs g = ok;
    c.change(g);
    auto [status, message] = BlasFailure([&] { p.Gemm(h, s, g); });
    CHECK(status == gpurt::kBlasInvalidValue);
    CHECK(message.find("cublasLtMatmul: CUBLAS_STATUS_INVALID_VALUE (7)") != std::string::npos);
    for (const std::string& part : c.says) CHECK_MESSAGE(message.find(part) != std::string::npos, message);
  }
  CHECK(dc.Read(s) == pr.c);  // nothing ran
  // Operands the product does not read may be null, as in cuBLAS: alpha == 0, or nothing to compute.
  GemmArgs no_ab = ok;
  no_ab.alpha = 0.0f, no_ab.a = nullptr, no_ab.b = nullptr;
  CHECK(BlasFailure([&] { p.Gemm(h, s, no_ab); }).first == -1);
  GemmArgs nothing = ok;
  nothing.batch = 0, nothing.a = nullptr, nothing.b = nullptr, nothing.c = nullptr;
  CHECK(BlasFailure([&] { p.Gemm(h, s, nothing); }).first == -1);
  p.StreamSynchronize(s);
  p.StreamDestroy(s);
}

TEST_CASE("gpu blas: row-major data passed as column-major with lda = k fails with status 7, as on a GPU") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  const int64_t M = 6, K = 4, N = 5;  // row-major A (M x K), B (K x N): their leading dimensions are K and N
  DeviceBuffer da(Random(M * K, 5), s), db(Random(K * N, 6), s), dc(std::vector<float>(M * N), s);
  GemmArgs g;
  g.m = M, g.n = N, g.k = K, g.a = da.p, g.lda = K, g.b = db.p, g.ldb = N, g.c = dc.p, g.ldc = N;
  auto [status, message] = BlasFailure([&] { p.Gemm(p.LibraryHandle(gpurt::Library::kBlasLt, s), s, g); });
  CHECK(status == gpurt::kBlasInvalidValue);
  CHECK_MESSAGE(message.find("lda=4 is less than max(1, m)=6") != std::string::npos, message);
  CHECK_MESSAGE(message.find("pass the operands swapped") != std::string::npos, message);
  p.StreamDestroy(s);
}

TEST_CASE("gpu blas: the handle must be bound to the stream the GEMM is issued on") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s1 = p.StreamCreate(), s2 = p.StreamCreate();
  Problem pr(BlasOp::kN, BlasOp::kN, 4, 3, 2);
  DeviceBuffer da(pr.a, s1), db(pr.b, s1), dc(pr.c, s1);
  GemmArgs g = pr.g;
  g.a = da.p, g.b = db.p, g.c = dc.p;
  void* h = p.LibraryHandle(gpurt::Library::kBlasLt, s1);
  CHECK(p.LibraryHandle(gpurt::Library::kBlasLt, s2) == h);  // now bound to s2
  auto [status, message] = BlasFailure([&] { p.Gemm(h, s1, g); });
  CHECK(status == gpurt::kBlasInvalidValue);
  CHECK_MESSAGE(message.find("the handle is bound to stream") != std::string::npos, message);
  CHECK_MESSAGE(message.find("LibraryHandle(kBlasLt, stream)") != std::string::npos, message);
  CHECK(BlasFailure([&] { p.Gemm(h, s2, g); }).first == -1);  // the stream it is bound to
  // Not a cuBLASLt handle: NOT_INITIALIZED, as cuBLAS answers a bad handle.
  void* dnn = p.LibraryHandle(gpurt::Library::kDnn, s1);
  CHECK(BlasFailure([&] { p.Gemm(dnn, s1, g); }).first == gpurt::kBlasNotInitialized);
  int junk = 0;
  CHECK(BlasFailure([&] { p.Gemm(&junk, s1, g); }).first == gpurt::kBlasNotInitialized);
  CHECK(BlasFailure([&] { p.Gemm(nullptr, s1, g); }).first == gpurt::kBlasNotInitialized);
  // Device 0's handle on a stream of device 1: bound elsewhere. A stream of device 1 issued with
  // device 0 current: cuBLAS's launch fails (EXECUTION_FAILED).
  p.SetDevice(1);
  gpurt::Stream t = p.StreamCreate();
  CHECK(BlasFailure([&] { p.Gemm(h, t, g); }).first == gpurt::kBlasInvalidValue);
  void* h1 = p.LibraryHandle(gpurt::Library::kBlasLt, t);
  CHECK(h1 != h);
  p.SetDevice(0);
  auto wrong_device = BlasFailure([&] { p.Gemm(h1, t, g); });
  CHECK(wrong_device.first == gpurt::kBlasExecutionFailed);
  CHECK_MESSAGE(wrong_device.second.find("current device is gpu(0)") != std::string::npos, wrong_device.second);
  p.StreamSynchronize(s2);
  for (gpurt::Stream x : {s1, s2, t}) p.StreamDestroy(x);
}

TEST_CASE("gpu blas: operands must lie in memory of the stream's device (else CUDA_ERROR_ILLEGAL_ADDRESS)") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kBlasLt, s);
  Problem pr(BlasOp::kN, BlasOp::kN, 4, 3, 2);
  DeviceBuffer da(pr.a, s), db(pr.b, s), dc(pr.c, s);
  GemmArgs ok = pr.g;
  ok.a = da.p, ok.b = db.p, ok.c = dc.p;
  auto fails = [&](GemmArgs g, const std::string& says) {
    try {
      p.Gemm(h, s, g);
    } catch (const gpurt::BlasError& e) {
      FAIL("a BlasError where an illegal address was expected: " << e.what());
    } catch (const gpurt::GpuError& e) {
      CHECK(e.code() == gpurt::kIllegalAddress);
      CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
      return;
    }
    FAIL("no error");
  };
  GemmArgs host = ok;
  host.b = pr.b.data();  // host memory
  fails(host, "B is host memory");
  p.SetDevice(1);
  DeviceBuffer other(pr.c);
  p.SetDevice(0);
  GemmArgs elsewhere = ok;
  elsewhere.c = other.p;
  fails(elsewhere, "C is memory of gpu(1)");
  GemmArgs overrun = ok;
  overrun.ldc = 100;  // legal for cuBLAS, but C's 3 columns then reach 204 floats, past its 512-byte block
  fails(overrun, "C spans");
  GemmArgs batch = ok;
  batch.batch = 2, batch.stride_a = 200;  // A's second matrix lies past the allocation
  fails(batch, "A spans");
  CHECK(dc.Read(s) == pr.c);  // nothing ran
  p.StreamDestroy(s);
}

TEST_CASE("gpu blas: a GEMM on device 1 runs on device 1's stream") {
  gpurt::DeviceGuard dg(1, Sim());
  gpurt::Stream s = Sim().StreamCreate();
  Problem pr(BlasOp::kT, BlasOp::kT, 11, 10, 9, 2, 1);
  CheckClose(pr.Run(s), pr.Expected());
  Sim().StreamDestroy(s);
}

TEST_CASE("gpu blas: the GEMM is stream-ordered behind a copy and a kernel, and an event after it sees C") {
  LambdaCompilerScope scope;
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s = p.StreamCreate(), reader = p.StreamCreate();
  Problem pr(BlasOp::kN, BlasOp::kN, 16, 8, 12);
  DeviceBuffer da(std::vector<float>(pr.a.size(), 0.0f), s), db(pr.b, s), dc(pr.c, s);
  p.StreamSynchronize(s);
  // A kernel that doubles B, by one thread per element.
  LambdaModules()["test:blas-double"] = [] {
    gpusim::KernelAttributes a;
    a.param_sizes = {8};
    return std::make_unique<LambdaKernel>(
        [](gpusim::Dim3 b, gpusim::Dim3 t, gpusim::Dim3 bd, void** args) {
          HostView<float>(*static_cast<void**>(args[0]))[b.x * bd.x + t.x] *= 2.0f;
        },
        a);
  };
  gpurt::Function twice = p.ModuleGetFunction(LambdaCompilerScope::Load(p, "test:blas-double"), "k");
  std::atomic<bool> go{false};
  p.LaunchHostFunc(s, [](void* x) { while (!static_cast<std::atomic<bool>*>(x)->load()) std::this_thread::yield(); },
                   &go);
  auto* pinned = static_cast<float*>(p.HostAllocPinned(pr.a.size() * sizeof(float)));
  std::copy(pr.a.begin(), pr.a.end(), pinned);
  p.MemcpyAsync(da.p, pinned, pr.a.size() * sizeof(float), gpurt::CopyKind::kHostToDevice, s);  // asynchronous
  float* b_ptr = db.p;
  void* args[] = {&b_ptr};
  p.LaunchKernel(twice, {static_cast<uint32_t>(pr.b.size() / 8)}, {8}, 0, s, args);
  GemmArgs g = pr.g;
  g.a = da.p, g.b = db.p, g.c = dc.p;
  p.Gemm(p.LibraryHandle(gpurt::Library::kBlasLt, s), s, g);
  gpurt::Event done = p.EventCreate(false);
  p.EventRecord(done, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(p.EventQuery(done));  // queued, not run: the stream is held
  go = true;
  p.StreamWaitEvent(reader, done);
  const std::vector<float> got = dc.Read(reader);  // on another stream, ordered only by the event
  for (float& v : pr.b) v *= 2.0f;
  CheckClose(got, pr.Expected());
  p.StreamSynchronize(s);
  p.EventDestroy(done);
  p.HostFreePinned(pinned);
  p.StreamDestroy(s);
  p.StreamDestroy(reader);
}

TEST_CASE("gpu blas: a GEMM captured into a graph runs at each replay, not at capture") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard dg(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  Problem pr(BlasOp::kN, BlasOp::kN, 5, 4, 3);
  pr.g.beta = 1.0f;  // each replay adds A B once more
  DeviceBuffer da(pr.a, s), db(pr.b, s), dc(pr.c, s);
  GemmArgs g = pr.g;
  g.a = da.p, g.b = db.p, g.c = dc.p;
  void* h = p.LibraryHandle(gpurt::Library::kBlasLt, s);
  p.StreamSynchronize(s);
  p.StreamBeginCapture(s);
  p.Gemm(h, s, g);
  gpurt::Graph graph = p.StreamEndCapture(s);
  CHECK(dc.Read(s) == pr.c);  // captured, not run
  gpurt::GraphExec exec = p.GraphInstantiate(graph);
  p.GraphLaunch(exec, s);
  p.GraphLaunch(exec, s);
  std::vector<float> want = pr.Expected();
  pr.c = want;
  CheckClose(dc.Read(s), pr.Expected());
  p.GraphExecDestroy(exec);
  p.GraphDestroy(graph);
  p.StreamDestroy(s);
}

TEST_CASE("gpu blas: the CUDA platform runs the same argument checks before it reaches cuBLASLt") {
  // Runs without a GPU: the checks come before the handle is used. A build without CUDA has no
  // CUDA platform to ask.
  static gpurt::Platform* cuda = gpurt::CreateCudaPlatform();
  if (!cuda) {
    MESSAGE("this kiln was built without CUDA: no CUDA platform to check");
    return;
  }
  GemmArgs g;
  g.m = 6, g.n = 5, g.k = 4, g.lda = 4, g.ldb = 4, g.ldc = 6;  // row-major A passed with lda = k
  auto [status, message] = BlasFailure([&] { cuda->Gemm(nullptr, nullptr, g); });
  CHECK(status == gpurt::kBlasInvalidValue);
  CHECK_MESSAGE(message.find("lda=4 is less than max(1, m)=6") != std::string::npos, message);
  std::vector<float> host(64);
  g.lda = 6, g.a = host.data(), g.b = host.data(), g.c = host.data();
  CHECK(BlasFailure([&] { cuda->Gemm(nullptr, nullptr, g); }).first == gpurt::kBlasNotInitialized);
}
