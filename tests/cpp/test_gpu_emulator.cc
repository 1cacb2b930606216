// The simulated GPU's kernel emulator (codegen/gpusim_*.cc) on hand-written NVPTX IR, as clang
// emits it for CUDA C++: index math over 1D/2D/3D grids with tails, barriers and shared memory
// (static and dynamic), the shared memory's poison, a block reduction's speed, the blocks' seeded
// random order, device memory reached through an alias window (a fake one mapped here twice),
// and the planted bugs a real GPU reports: an out-of-bounds and a misaligned access in checked
// mode, a barrier reached by only some threads, warp operations the emulator refuses.
// The libdevice functions and kiln's generated kernels are in test_gpu_emulator_math.cc.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/codegen/gpu_emulator.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/gpusim/seam_internal.h"
#include "test_util.h"

namespace {

using kiln::codegen::CompileEmulatedModule;
using kiln::gpusim::Dim3;

const char* kHeader = R"(
target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.y()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.z()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.y()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.z()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()
declare i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()
declare void @llvm.nvvm.barrier0()
declare i32 @llvm.nvvm.barrier0.popc(i32)
)";

// out[(z * ny + y) * nx + x] = x + 1000 y + 1000000 z and count[...] += 1 for x < nx, y < ny,
// z < nz, where (x, y, z) = blockIdx * blockDim + threadIdx.
const char* kIndex = R"(
define ptx_kernel void @index3d(ptr %out, ptr %count, i32 %nx, i32 %ny, i32 %nz) {
  %tx = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %ty = call i32 @llvm.nvvm.read.ptx.sreg.tid.y()
  %tz = call i32 @llvm.nvvm.read.ptx.sreg.tid.z()
  %bx = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %by = call i32 @llvm.nvvm.read.ptx.sreg.ntid.y()
  %bz = call i32 @llvm.nvvm.read.ptx.sreg.ntid.z()
  %cx = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %cy = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()
  %cz = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()
  %x0 = mul i32 %cx, %bx
  %x = add i32 %x0, %tx
  %y0 = mul i32 %cy, %by
  %y = add i32 %y0, %ty
  %z0 = mul i32 %cz, %bz
  %z = add i32 %z0, %tz
  %okx = icmp ult i32 %x, %nx
  %oky = icmp ult i32 %y, %ny
  %okz = icmp ult i32 %z, %nz
  %ok1 = and i1 %okx, %oky
  %ok = and i1 %ok1, %okz
  br i1 %ok, label %write, label %done
write:
  %l0 = mul i32 %z, %ny
  %l1 = add i32 %l0, %y
  %l2 = mul i32 %l1, %nx
  %l = add i32 %l2, %x
  %l64 = zext i32 %l to i64
  %v0 = mul i32 %y, 1000
  %v1 = mul i32 %z, 1000000
  %v2 = add i32 %v0, %v1
  %v = add i32 %v2, %x
  %p = getelementptr i32, ptr %out, i64 %l64
  store i32 %v, ptr %p, align 4
  %q = getelementptr i32, ptr %count, i64 %l64
  %old = atomicrmw add ptr %q, i32 1 monotonic
  br label %done
done:
  ret void
}
)";

// Sums blocks of blockDim.x (a power of two, <= 256) floats in shared memory @SMEM: out[block] =
// sum(in[block * blockDim.x + t]) over t with index < n.
const char* kReduce = R"(
define ptx_kernel void @block_sum(ptr %in, ptr %out, i32 %n) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %bid = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %bdim = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %base = mul i32 %bid, %bdim
  %i = add i32 %base, %tid
  %inb = icmp slt i32 %i, %n
  br i1 %inb, label %load, label %st
load:
  %i64 = sext i32 %i to i64
  %p = getelementptr float, ptr %in, i64 %i64
  %v = load float, ptr %p, align 4
  br label %st
st:
  %x = phi float [%v, %load], [0.0, %entry]
  %tid64 = zext i32 %tid to i64
  %sp = getelementptr [256 x float], ptr addrspace(3) @SMEM, i64 0, i64 %tid64
  store float %x, ptr addrspace(3) %sp, align 4
  call void @llvm.nvvm.barrier0()
  %s0 = lshr i32 %bdim, 1
  br label %loop
loop:
  %s = phi i32 [%s0, %st], [%snext, %sync]
  %more = icmp ugt i32 %s, 0
  br i1 %more, label %body, label %done
body:
  %act = icmp ult i32 %tid, %s
  br i1 %act, label %add, label %sync
add:
  %j = add i32 %tid, %s
  %j64 = zext i32 %j to i64
  %q = getelementptr [256 x float], ptr addrspace(3) @SMEM, i64 0, i64 %j64
  %a = load float, ptr addrspace(3) %sp, align 4
  %b = load float, ptr addrspace(3) %q, align 4
  %c = fadd float %a, %b
  store float %c, ptr addrspace(3) %sp, align 4
  br label %sync
sync:
  call void @llvm.nvvm.barrier0()
  %snext = lshr i32 %s, 1
  br label %loop
done:
  %is0 = icmp eq i32 %tid, 0
  br i1 %is0, label %w, label %ret
w:
  %r = load float, ptr addrspace(3) @SMEM, align 4
  %bid64 = zext i32 %bid to i64
  %o = getelementptr float, ptr %out, i64 %bid64
  store float %r, ptr %o, align 4
  br label %ret
ret:
  ret void
}
)";

kiln::codegen::EmulatorOptions Opts(bool checked, std::optional<uint64_t> seed = std::nullopt) {
  kiln::codegen::EmulatorOptions o;
  o.checked = checked;
  o.seed = seed;
  return o;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p; (p = s.find(from)) != std::string::npos;) s.replace(p, from.size(), to);
  return s;
}

std::string StaticReduce() {
  return kHeader + std::string("@smem = internal addrspace(3) global [256 x float] undef, align 4\n") +
         Replace(kReduce, "@SMEM", "@smem");
}
std::string DynamicReduce() {
  return kHeader + std::string("@dyn = external addrspace(3) global [0 x float], align 16\n") +
         Replace(Replace(kReduce, "[256 x float]", "[0 x float]"), "@SMEM", "@dyn");
}

std::unique_ptr<kiln::gpusim::KernelFault> Launch(kiln::gpusim::EmulatedModule& m, const std::string& name,
                                                  Dim3 grid, Dim3 block, size_t dyn,
                                                  std::vector<void*> args) {
  kiln::gpusim::EmulatedKernel* k = m.Function(name);
  REQUIRE(k != nullptr);
  return k->Run(grid, block, dyn, args.data());
}

std::vector<double> BlockSums(const std::vector<float>& in, int block) {
  std::vector<double> s((in.size() + block - 1) / block, 0.0);
  for (size_t i = 0; i < in.size(); ++i) s[i / block] += in[i];
  return s;
}

/// Device memory the host cannot touch, mapped a second time at an alias the emulator uses: the
/// simulated GPU's layout, made here with memfd (the simulated devices are not needed). It is the
/// test thread's device memory while it lives, as a platform's is around its launches.
class FakeDevice final : public kiln::gpusim::DeviceMemory {
public:
  explicit FakeDevice(size_t bytes) : bytes_(bytes) {
    int fd = ::memfd_create("kiln-fake-gpu", 0);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    alias_ = static_cast<char*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    device_ = static_cast<char*>(::mmap(nullptr, bytes, PROT_NONE, MAP_SHARED, fd, 0));
    ::close(fd);
    REQUIRE(alias_ != MAP_FAILED);
    REQUIRE(device_ != MAP_FAILED);
    window_ = {reinterpret_cast<uintptr_t>(device_), reinterpret_cast<uintptr_t>(device_ + bytes), alias_ - device_};
    scope_.emplace(*this);
  }
  ~FakeDevice() {
    scope_.reset();
    ::munmap(alias_, bytes_);
    ::munmap(device_, bytes_);
  }
  /// A device allocation of `bytes` (256-byte aligned, allocations back to back).
  template <class T> T* Alloc(size_t count) {
    size_t at = (used_ + 255) / 256 * 256;
    used_ = at + count * sizeof(T);
    REQUIRE(used_ <= bytes_);
    allocs_.push_back({reinterpret_cast<uintptr_t>(device_ + at), count * sizeof(T)});
    return reinterpret_cast<T*>(device_ + at);
  }
  /// The host's view of device memory (what a copy would read).
  template <class T> T* Host(T* device) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(device) - device_ + alias_);
  }

  const kiln::gpusim::MemoryWindow& window() const override { return window_; }
  bool IsLive(uintptr_t a, size_t n) const override {
    for (auto [b, size] : allocs_)
      if (a >= b && a + n <= b + size) return true;
    return false;
  }

private:
  size_t bytes_, used_ = 0;
  char *alias_, *device_;
  kiln::gpusim::MemoryWindow window_;
  std::optional<kiln::gpusim::DeviceMemoryScope> scope_;
  std::vector<std::pair<uintptr_t, size_t>> allocs_;
};

} // namespace

TEST_CASE("gpu emulator: index math over 1D, 2D and 3D grids with tails writes every element once") {
  auto m = CompileEmulatedModule(kHeader + std::string(kIndex), Opts(false));
  struct Case {
    Dim3 grid, block;
    uint32_t nx, ny, nz;
  };
  for (Case c : {Case{{5, 1, 1}, {64, 1, 1}, 300, 1, 1}, Case{{3, 4, 1}, {16, 8, 1}, 45, 29, 1},
                 Case{{2, 3, 4}, {4, 3, 2}, 7, 8, 7}, Case{{1, 1, 1}, {1, 1, 1}, 1, 1, 1}}) {
    CAPTURE(c.nx);
    CAPTURE(c.ny);
    CAPTURE(c.nz);
    size_t n = size_t{c.nx} * c.ny * c.nz;
    std::vector<int32_t> out(n, -1), count(n, 0);
    int32_t* po = out.data();
    int32_t* pc = count.data();
    REQUIRE(Launch(*m, "index3d", c.grid, c.block, 0, {&po, &pc, &c.nx, &c.ny, &c.nz}) == nullptr);
    int wrong = 0;
    for (uint32_t z = 0; z < c.nz; ++z)
      for (uint32_t y = 0; y < c.ny; ++y)
        for (uint32_t x = 0; x < c.nx; ++x) {
          size_t l = (size_t{z} * c.ny + y) * c.nx + x;
          wrong += out[l] != static_cast<int32_t>(x + 1000 * y + 1000000 * z) || count[l] != 1;
        }
    CHECK(wrong == 0);
  }
  CHECK(m->Function("no_such_kernel") == nullptr);
}

TEST_CASE("gpu emulator: block reduction in static and dynamic shared memory, with barriers") {
  std::vector<float> in(10000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  int n = static_cast<int>(in.size());
  for (bool dynamic : {false, true}) {
    CAPTURE(dynamic);
    auto m = CompileEmulatedModule(dynamic ? DynamicReduce() : StaticReduce(), Opts(false));
    kiln::gpusim::EmulatedKernel* k = m->Function("block_sum");
    REQUIRE(k);
    CHECK(k->attributes().static_smem_bytes == (dynamic ? 0u : 1024u));
    CHECK(k->attributes().num_regs > 0);
    CHECK(k->attributes().num_regs <= 255);
    for (uint32_t block : {256u, 64u, 1u}) {
      CAPTURE(block);
      std::vector<float> out((in.size() + block - 1) / block, -1.0f);
      const float* pi = in.data();
      float* po = out.data();
      Dim3 grid{static_cast<uint32_t>(out.size()), 1, 1};
      REQUIRE(Launch(*m, "block_sum", grid, {block, 1, 1}, dynamic ? block * 4 : 0, {&pi, &po, &n}) ==
              nullptr);
      std::vector<double> want = BlockSums(in, static_cast<int>(block));
      double err = 0;
      for (size_t b = 0; b < out.size(); ++b) err = std::max(err, std::abs(out[b] - want[b]));
      CHECK(err == 0.0); // integers: exact in float
    }
  }
}

TEST_CASE("gpu emulator: shared memory starts poisoned, __syncthreads_count counts the block") {
  std::string ir = kHeader + std::string(R"(
@s = internal addrspace(3) global [64 x i32] undef, align 4
define ptx_kernel void @peek(ptr %out) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %t64 = zext i32 %t to i64
  %p = getelementptr [64 x i32], ptr addrspace(3) @s, i64 0, i64 %t64
  %v = load i32, ptr addrspace(3) %p, align 4
  %odd = and i32 %t, 1
  %cnt = call i32 @llvm.nvvm.barrier0.popc(i32 %odd)
  %sum = add i32 %v, %cnt
  %q = getelementptr i32, ptr %out, i64 %t64
  store i32 %sum, ptr %q, align 4
  store i32 %t, ptr addrspace(3) %p, align 4
  ret void
}
)");
  auto m = CompileEmulatedModule(ir, Opts(false));
  std::vector<int32_t> out(64, 0);
  int32_t* po = out.data();
  for (int launch = 0; launch < 2; ++launch) { // the second launch sees poison again, not the first's values
    REQUIRE(Launch(*m, "peek", {2, 1, 1}, {64, 1, 1}, 0, {&po}) == nullptr);
    for (int t = 0; t < 64; ++t) CHECK(out[t] == -1 + 32); // 0xFFFFFFFF poison + 32 odd threads
  }
}

TEST_CASE("gpu emulator: a 1M-element block reduction takes well under a second") {
  std::vector<float> in(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  int n = static_cast<int>(in.size());
  auto m = CompileEmulatedModule(StaticReduce(), Opts(false));
  std::vector<float> out(in.size() / 256);
  const float* pi = in.data();
  float* po = out.data();
  // CPU time of this thread: the emulator's cost, not the load of a shared test machine.
  auto cpu = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  auto t0 = std::chrono::steady_clock::now();
  double c0 = cpu();
  REQUIRE(Launch(*m, "block_sum", {static_cast<uint32_t>(out.size()), 1, 1}, {256, 1, 1}, 0,
                 {&pi, &po, &n}) == nullptr);
  double s = cpu() - c0;
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("1M-element block reduction (4096 blocks of 256 fiber threads, 9 barriers each): "
          << s * 1e3 << " ms CPU, " << wall * 1e3 << " ms wall");
  CHECK(s < 1.0 * kiln::testing::kSanitizerSlowdown);
  std::vector<double> want = BlockSums(in, 256);
  CHECK(std::equal(out.begin(), out.end(), want.begin()));
}

TEST_CASE("gpu emulator: launches on several host threads at once (each stream's worker) do not mix") {
  auto m = CompileEmulatedModule(StaticReduce(), Opts(false));
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> in(20000);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i + t) % 11);
      int n = static_cast<int>(in.size());
      std::vector<float> out((in.size() + 127) / 128);
      const float* pi = in.data();
      float* po = out.data();
      std::vector<void*> args = {&pi, &po, &n};
      bool good = true;
      for (int rep = 0; rep < 5; ++rep) {
        good &= m->Function("block_sum")
                    ->Run({static_cast<uint32_t>(out.size()), 1, 1}, {128, 1, 1}, 0, args.data()) == nullptr;
        std::vector<double> want = BlockSums(in, 128);
        good &= std::equal(out.begin(), out.end(), want.begin());
      }
      ok[static_cast<size_t>(t)] = good;
    });
  for (auto& th : threads) th.join();
  CHECK(ok == std::vector<int>(4, 1));
}

TEST_CASE("gpu emulator: blocks run in a random order that the seed repeats") {
  std::string ir = kHeader + std::string(R"(
define ptx_kernel void @order(ptr %order, ptr %counter) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %first = icmp eq i32 %t, 0
  br i1 %first, label %w, label %done
w:
  %b = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %slot = atomicrmw add ptr %counter, i32 1 monotonic
  %s64 = zext i32 %slot to i64
  %p = getelementptr i32, ptr %order, i64 %s64
  store i32 %b, ptr %p, align 4
  br label %done
done:
  ret void
}
)");
  auto run = [&](uint64_t seed) {
    auto m = CompileEmulatedModule(ir, Opts(false, seed));
    std::vector<int32_t> order(1000, -1);
    int32_t counter = 0;
    int32_t* po = order.data();
    int32_t* pc = &counter;
    REQUIRE(Launch(*m, "order", {1000, 1, 1}, {32, 1, 1}, 0, {&po, &pc}) == nullptr);
    return order;
  };
  std::vector<int32_t> a = run(1), b = run(1), c = run(2), sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota); // every block ran once
  CHECK(a != iota);      // ... not in order
  CHECK(a == b);         // the same seed repeats the order
  CHECK(a != c);
}

TEST_CASE("gpu emulator: device memory is reached through the alias window, never at its own address") {
  FakeDevice dev(1 << 20);
  std::vector<float> in(3000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 13);
  float* d_in = dev.Alloc<float>(in.size());
  float* d_out = dev.Alloc<float>(12);
  std::memcpy(dev.Host(d_in), in.data(), in.size() * sizeof(float));
  int n = static_cast<int>(in.size());
  for (bool checked : {false, true}) {
    CAPTURE(checked);
    auto m = CompileEmulatedModule(StaticReduce(), Opts(checked));
    REQUIRE(Launch(*m, "block_sum", {12, 1, 1}, {256, 1, 1}, 0, {&d_in, &d_out, &n}) == nullptr);
    std::vector<double> want = BlockSums(in, 256);
    for (int b = 0; b < 12; ++b) CHECK(dev.Host(d_out)[b] == want[static_cast<size_t>(b)]);
  }
}

TEST_CASE("gpu emulator: checked mode reports a planted out-of-bounds access as cuda error 700") {
  FakeDevice dev(1 << 20);
  float* d_in = dev.Alloc<float>(1000);
  float* d_out = dev.Alloc<float>(4);
  // The planted bug: the bound check is `i <= n` instead of `i < n`.
  std::string ir = Replace(StaticReduce(), "%inb = icmp slt i32 %i, %n", "%inb = icmp sle i32 %i, %n");
  int n = 1000;
  auto m = CompileEmulatedModule(ir, Opts(true, 7));
  auto fault = Launch(*m, "block_sum", {4, 1, 1}, {256, 1, 1}, 0, {&d_in, &d_out, &n});
  REQUIRE(fault != nullptr);
  CHECK(fault->cuda_error == 700);
  MESSAGE(fault->message);
  CHECK(fault->message.find("kernel 'block_sum'") != std::string::npos);
  CHECK(fault->message.find("thread (232, 0, 0) of block (3, 0, 0) read 4 bytes") != std::string::npos);
  char addr[32];
  std::snprintf(addr, sizeof addr, "0x%lx",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(d_in + 1000)));
  CHECK(fault->message.find(addr) != std::string::npos);
  CHECK(fault->message.find("KILN_GPU_SIM_SEED=7") != std::string::npos);
  // KILN_GPU_SIM_ASAN=1 turns the checks on for modules compiled without an explicit choice.
  ::setenv("KILN_GPU_SIM_ASAN", "1", 1);
  auto by_env = CompileEmulatedModule(ir);
  ::unsetenv("KILN_GPU_SIM_ASAN");
  auto again = Launch(*by_env, "block_sum", {4, 1, 1}, {256, 1, 1}, 0, {&d_in, &d_out, &n});
  REQUIRE(again != nullptr);
  CHECK(again->cuda_error == 700);
  // Without the bug the same kernel passes the checks.
  auto good = CompileEmulatedModule(StaticReduce(), Opts(true));
  CHECK(Launch(*good, "block_sum", {4, 1, 1}, {256, 1, 1}, 0, {&d_in, &d_out, &n}) == nullptr);
}

TEST_CASE("gpu emulator: checked mode reports a misaligned vector load as cuda error 716") {
  FakeDevice dev(1 << 20);
  float* d = dev.Alloc<float>(64);
  std::string ir = kHeader + std::string(R"(
define ptx_kernel void @vec4(ptr %p) {
  %v = load <4 x float>, ptr %p, align 16
  %q = getelementptr float, ptr %p, i64 8
  store <4 x float> %v, ptr %q, align 16
  ret void
}
)");
  auto m = CompileEmulatedModule(ir, Opts(true));
  float* aligned = d;
  CHECK(Launch(*m, "vec4", {1, 1, 1}, {1, 1, 1}, 0, {&aligned}) == nullptr);
  float* off = d + 1; // 4-byte aligned: fine on x86, a fault on a GPU
  auto fault = Launch(*m, "vec4", {1, 1, 1}, {1, 1, 1}, 0, {&off});
  REQUIRE(fault != nullptr);
  CHECK(fault->cuda_error == 716);
  CHECK(fault->message.find("not aligned to 16 bytes") != std::string::npos);
}

TEST_CASE("gpu emulator: checked mode reports a shared-memory access past the block's arrays") {
  // The planted bug: s[tid + 1] for 256 threads over a 256-element array.
  std::string ir = kHeader + std::string(R"(
@s = internal addrspace(3) global [256 x float] undef, align 4
define ptx_kernel void @shift(ptr %out) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %t1 = add i32 %t, 1
  %i = zext i32 %t1 to i64
  %p = getelementptr [256 x float], ptr addrspace(3) @s, i64 0, i64 %i
  store float 1.0, ptr addrspace(3) %p, align 4
  call void @llvm.nvvm.barrier0()
  ret void
}
)");
  auto m = CompileEmulatedModule(ir, Opts(true));
  auto fault = Launch(*m, "shift", {1, 1, 1}, {256, 1, 1}, 0, {nullptr});
  REQUIRE(fault != nullptr);
  MESSAGE(fault->message);
  CHECK(fault->cuda_error == 700);
  CHECK(fault->message.find(
            "thread (255, 0, 0) of block (0, 0, 0) wrote 4 bytes at shared memory offset 1024, outside "
            "the block's 1024 bytes") != std::string::npos);
  CHECK(Launch(*m, "shift", {1, 1, 1}, {255, 1, 1}, 0, {nullptr}) == nullptr);
}

TEST_CASE("gpu emulator: warps run in a random order between barriers, so a missing barrier shows") {
  // The planted bug: each thread writes s[t] and reads s[t - 1] with no __syncthreads between;
  // run in thread order the read would always find the neighbour's value.
  std::string ir = kHeader + std::string(R"(
@s = internal addrspace(3) global [256 x i32] undef, align 4
define ptx_kernel void @racy(ptr %out) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %t64 = zext i32 %t to i64
  %p = getelementptr [256 x i32], ptr addrspace(3) @s, i64 0, i64 %t64
  store i32 %t, ptr addrspace(3) %p, align 4
  %first = icmp eq i32 %t, 0
  %prev = select i1 %first, i64 0, i64 1
  %j = sub i64 %t64, %prev
  %q = getelementptr [256 x i32], ptr addrspace(3) @s, i64 0, i64 %j
  %v = load i32, ptr addrspace(3) %q, align 4
  %o = getelementptr i32, ptr %out, i64 %t64
  store i32 %v, ptr %o, align 4
  call void @llvm.nvvm.barrier0()
  ret void
}
)");
  auto m = CompileEmulatedModule(ir, Opts(false, 11));
  std::vector<int32_t> out(256, 0);
  int32_t* po = out.data();
  REQUIRE(Launch(*m, "racy", {1, 1, 1}, {256, 1, 1}, 0, {&po}) == nullptr);
  int poisoned = 0;
  for (int t = 1; t < 256; ++t) poisoned += out[static_cast<size_t>(t)] == -1;
  MESSAGE(poisoned << " of 255 reads of a neighbour found the poison");
  CHECK(poisoned > 0);
  CHECK(poisoned < 8); // only first threads of warps that ran before the warp below them
}

TEST_CASE("gpu emulator: a barrier reached by only some threads of a block is reported") {
  // The planted bug: threads >= 24 return before __syncthreads.
  std::string ir = kHeader + std::string(R"(
define ptx_kernel void @early_exit(ptr %out) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %late = icmp uge i32 %t, 24
  br i1 %late, label %done, label %sync
sync:
  call void @llvm.nvvm.barrier0()
  %t64 = zext i32 %t to i64
  %p = getelementptr i32, ptr %out, i64 %t64
  store i32 %t, ptr %p, align 4
  br label %done
done:
  ret void
}
)");
  auto m = CompileEmulatedModule(ir, Opts(false, 3));
  std::vector<int32_t> out(256);
  int32_t* po = out.data();
  auto fault = Launch(*m, "early_exit", {2, 1, 1}, {256, 1, 1}, 0, {&po});
  REQUIRE(fault != nullptr);
  MESSAGE(fault->message);
  CHECK(fault->cuda_error == 719);
  CHECK(fault->message.find("kernel 'early_exit'") != std::string::npos);
  CHECK(fault->message.find("reached by 24 of 256 threads") != std::string::npos);
  CHECK(fault->message.find("KILN_GPU_SIM_SEED=3") != std::string::npos);
}

TEST_CASE("gpu emulator: what it cannot emulate is refused by name") {
  std::string shfl = kHeader + std::string(R"(
declare i32 @llvm.nvvm.shfl.sync.down.i32(i32, i32, i32, i32)
define ptx_kernel void @warp(ptr %out) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %v = call i32 @llvm.nvvm.shfl.sync.down.i32(i32 -1, i32 %t, i32 1, i32 31)
  store i32 %v, ptr %out, align 4
  ret void
}
)");
  CHECK_THROWS_WITH_AS(CompileEmulatedModule(shfl), doctest::Contains("llvm.nvvm.shfl.sync.down.i32"),
                       kiln::DeviceError);
  std::string ext = kHeader + std::string(R"(
declare i32 @vprintf(ptr, ptr)
define ptx_kernel void @say(ptr %fmt) {
  %r = call i32 @vprintf(ptr %fmt, ptr null)
  ret void
}
)");
  CHECK_THROWS_WITH_AS(CompileEmulatedModule(ext), doctest::Contains("vprintf"), kiln::DeviceError);
  CHECK_THROWS_WITH_AS(CompileEmulatedModule("define void @f( {"), doctest::Contains("not valid LLVM IR"),
                       kiln::DeviceError);
  std::string none = kHeader + std::string("define void @helper() {\n  ret void\n}\n");
  CHECK_THROWS_WITH_AS(CompileEmulatedModule(none), doctest::Contains("no kernel"), kiln::DeviceError);
}

TEST_CASE("gpu emulator: InstallGpuEmulator makes it the simulated GPUs' module compiler") {
  kiln::codegen::InstallGpuEmulator();
  kiln::gpusim::ModuleCompiler compile = kiln::gpusim::GetModuleCompiler();
  REQUIRE(static_cast<bool>(compile));
  auto m = compile(kHeader + std::string(kIndex));
  CHECK(m->Function("index3d") != nullptr);
}

// Each simulated platform has its own device memory window; a process may hold several (tests
// make private ones). Kernels used to translate with the window of the platform made last, so a
// launch on an earlier platform read its own memory at the device address the host cannot touch:
// SIGSEGV in the kernel's code (gpu dnn's private simulators, then d2l's accuracy on the process's).
TEST_CASE("gpu emulator: a kernel reaches its own platform's memory when another simulated platform was made later") {
  kiln::codegen::InstallGpuEmulator();
  namespace gpurt = kiln::gpurt;
  const int nx = 300;
  // Launches index3d over nx elements on `p`'s device 0 and returns out and count.
  auto index = [&](gpurt::Platform& p, gpurt::Module& m) {
    gpurt::DeviceGuard guard(0, p);
    if (!m) m = p.ModuleLoad({kHeader + std::string(kIndex), ""});
    gpurt::Function f = p.ModuleGetFunction(m, "index3d");
    gpurt::Stream s = p.StreamCreate();
    void* out = p.Malloc(nx * sizeof(int32_t));
    void* count = p.Malloc(nx * sizeof(int32_t));
    CHECK(kiln::gpusim::IsLiveDeviceRange(reinterpret_cast<uintptr_t>(out), nx * sizeof(int32_t)));
    p.MemsetAsync(count, 0, nx * sizeof(int32_t), s);
    int ny = 1, nz = 1, n = nx;
    void* args[] = {&out, &count, &n, &ny, &nz};
    p.LaunchKernel(f, {(nx + 127) / 128, 1, 1}, {128, 1, 1}, 0, s, args);
    std::vector<int32_t> got(2 * nx);
    p.MemcpyAsync(got.data(), out, nx * sizeof(int32_t), gpurt::CopyKind::kDeviceToHost, s);
    p.MemcpyAsync(got.data() + nx, count, nx * sizeof(int32_t), gpurt::CopyKind::kDeviceToHost, s);
    p.StreamSynchronize(s);
    p.Free(out), p.Free(count);
    p.StreamDestroy(s);
    return got;
  };
  std::vector<int32_t> want(2 * nx, 1);
  std::iota(want.begin(), want.begin() + nx, 0);
  std::unique_ptr<gpurt::Platform> first(gpurt::CreateSimulatedPlatform(1, size_t{16} << 20));
  gpurt::Module first_module = nullptr, second_module = nullptr;
  CHECK(index(*first, first_module) == want);
  std::unique_ptr<gpurt::Platform> second(gpurt::CreateSimulatedPlatform(1, size_t{16} << 20));
  delete gpurt::CreateSimulatedPlatform(1, size_t{16} << 20);  // made and gone again
  CHECK(index(*first, first_module) == want);  // the module loaded before, and ...
  first->ModuleUnload(first_module);
  first_module = nullptr;
  CHECK(index(*first, first_module) == want);  // ... one loaded now
  CHECK(index(*second, second_module) == want);
  second->ModuleUnload(second_module);
  second.reset();
  CHECK(index(*first, first_module) == want);
  first->ModuleUnload(first_module);
}

#endif // KILN_WITH_CODEGEN
