// The kernel emulator's launch: GPU threads as fibers on the calling thread, switched by a small
// x86-64 context switch (ucontext costs a system call per switch), and the host helpers the
// rewritten kernel code calls (special registers, barriers, shared memory, checked accesses,
// directed rounding). Blocks run one after another in a seeded random order; the threads of a
// block run in turn up to the next barrier, warp by warp in a seeded random order. A kernel without barriers
// runs its threads one after another on one stack. Warp-synchronous operations (shuffles, votes) are not
// emulated.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>

#include "gpusim_fiber_san.h"
#include "gpusim_internal.h"
#include "kiln/runtime/error.h"

#if !defined(__x86_64__)
#error "the kernel emulator's context switch is written for x86-64"
#endif

// kiln_gpusim_switch(void** save_sp, void* new_sp): saves the callee-saved registers on the
// current stack (not the floating-point control words: kernels never change them, and the
// directed-rounding helper restores the mode before it returns), stores the stack pointer to *save_sp and
// resumes the context whose stack pointer is new_sp. A new fiber's stack holds a frame whose
// return address is kiln_gpusim_fiber_start, which calls r13(r12).
asm(R"(
  .text
  .p2align 4
  .type kiln_gpusim_switch, @function
kiln_gpusim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kiln_gpusim_switch, .-kiln_gpusim_switch
  .p2align 4
  .type kiln_gpusim_fiber_start, @function
kiln_gpusim_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size kiln_gpusim_fiber_start, .-kiln_gpusim_fiber_start
)");

extern "C" {
void kiln_gpusim_switch(void** save_sp, void* new_sp);
void kiln_gpusim_fiber_start();
}

namespace kiln::codegen::gpusim_detail {
namespace {

constexpr size_t kStackBytes = 128 * 1024; // kernel frames are small; host helpers run here too
const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
constexpr size_t kSharedRedZone = 4096;

enum class State : uint8_t { kRunnable, kAtBarrier, kDone, kFaulted };

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr; // lowest usable byte (a guard page lies below)
  uint32_t tid[3] = {0, 0, 0};
  uint32_t linear = 0;
  State state = State::kRunnable;
  int predicate = 0;
  int barrier_result = 0;
  FiberSan* san = nullptr; // the stack's, in the StackPool
};

/// Stacks for one host thread's launches, kept between launches.
struct StackPool {
  std::vector<char*> stacks;
  std::vector<FiberSan> san; // one per stack (empty without a sanitizer)
  char* Get(size_t i) {
    while (stacks.size() <= i) {
      void* p = ::mmap(nullptr, kStackBytes + kPage, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      KILN_CHECK(p != MAP_FAILED) << "gpusim: cannot map a fiber stack";
      ::mprotect(p, kPage, PROT_NONE); // a stack overflow faults instead of corrupting memory
      stacks.push_back(static_cast<char*>(p) + kPage);
      san.emplace_back();
    }
    return stacks[i];
  }
  ~StackPool() {
    for (FiberSan& f : san) SanDestroyFiber(f);
    for (char* s : stacks) ::munmap(s - kPage, kStackBytes + kPage);
  }
};

struct Fault {
  bool set = false;
  int cuda_error = 0;
  uintptr_t address = 0;
  uint64_t bytes = 0;
  uint64_t align = 0;
  bool is_store = false;
  bool shared = false;
  uint32_t tid[3] = {0, 0, 0};
};

/// The launch running on this host thread.
struct Launch {
  EntryFn entry = nullptr;
  void** args = nullptr;
  gpusim::Dim3 grid, block;
  uint32_t ctaid[3] = {0, 0, 0};
  char* shared = nullptr;
  size_t shared_bytes = 0;
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
  FiberSan host; // the host thread's context, for the sanitizers
  Fault fault;
  gpusim::MemoryWindow window; // of the device memory this launch reaches, read when it starts
};

thread_local Launch* t_launch = nullptr;
thread_local StackPool t_stacks;

// Not instrumented by TSan: this frame never returns, and a fiber that runs one kernel thread after
// another would pile up TSan's record of it.
[[noreturn]] KILN_FIBER_NO_TSAN void FiberMain(Fiber* f) {
  Launch* l = t_launch;
  SanAfterSwitch(*f->san, &l->host);
  l->entry(l->args);
  f->state = State::kDone;
  SanBeforeSwitch(*f->san, l->host, /*from_ends=*/true);
  kiln_gpusim_switch(&f->sp, l->scheduler_sp);
  __builtin_unreachable();
}

void StartFiber(Fiber& f, char* stack, size_t index) {
  f.stack = stack;
  f.san = &t_stacks.san[index];
  SanInitFiber(*f.san, stack, kStackBytes);
  // Stack tops at the same offset in their pages would share a few cache sets; stagger them.
  auto* top = reinterpret_cast<uint64_t*>(stack + kStackBytes - (index % 32) * 192); // 16-byte aligned
  uint64_t* sp = top - 7; // after 6 pops and the ret rsp = top, 16-byte aligned for the call
  sp[0] = 0;              // r15
  sp[1] = 0;              // r14
  sp[2] = reinterpret_cast<uint64_t>(&FiberMain); // r13
  sp[3] = reinterpret_cast<uint64_t>(&f);         // r12
  sp[4] = 0;                                      // rbx
  sp[5] = 0;                                      // rbp
  sp[6] = reinterpret_cast<uint64_t>(&kiln_gpusim_fiber_start);
  f.sp = sp;
  f.state = State::kRunnable;
}

/// Switches from the current fiber back to the scheduler.
void Yield(Fiber* f, State s) {
  f->state = s;
  Launch& l = *t_launch;
  SanBeforeSwitch(*f->san, l.host, /*from_ends=*/s == State::kFaulted);
  kiln_gpusim_switch(&f->sp, l.scheduler_sp);
  SanAfterSwitch(*f->san, nullptr);
}

void Resume(Launch& l, Fiber& f) {
  l.current = &f;
  SanBeforeSwitch(l.host, *f.san, /*from_ends=*/false);
  kiln_gpusim_switch(&l.scheduler_sp, f.sp);
  SanAfterSwitch(l.host, nullptr);
  l.current = nullptr;
}

/// A bijection of [0, n) drawn from `seed`: a 4-round Feistel network over the smallest power of
/// four >= n, walking cycles until the value falls in range (fewer than 4 steps on average).
class BlockOrder {
public:
  BlockOrder(uint64_t n, uint64_t seed) : n_(n) {
    while ((uint64_t{1} << (2 * half_)) < n) ++half_;
    uint64_t s = seed;
    for (uint64_t& k : keys_) k = Mix(s += 0x9E3779B97F4A7C15ull);
  }
  uint64_t operator()(uint64_t i) const {
    if (half_ == 0) return i;
    do i = Permute(i);
    while (i >= n_);
    return i;
  }
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

private:
  uint64_t Permute(uint64_t x) const {
    uint64_t mask = (uint64_t{1} << half_) - 1, l = x >> half_, r = x & mask;
    for (uint64_t k : keys_) {
      uint64_t t = l ^ (Mix(r ^ k) & mask);
      l = r;
      r = t;
    }
    return (l << half_) | r;
  }
  uint64_t n_;
  int half_ = 0;
  uint64_t keys_[4] = {};
};

std::string Dims(const uint32_t* v) {
  return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + ")";
}

// ---- the host helpers the rewritten IR calls ----

extern "C" uint32_t HelperSreg(int which) {
  const Launch& l = *t_launch;
  const Fiber& f = *l.current;
  switch (which) {
  case kTidX: return f.tid[0];
  case kTidY: return f.tid[1];
  case kTidZ: return f.tid[2];
  case kNtidX: return l.block.x;
  case kNtidY: return l.block.y;
  case kNtidZ: return l.block.z;
  case kCtaidX: return l.ctaid[0];
  case kCtaidY: return l.ctaid[1];
  case kCtaidZ: return l.ctaid[2];
  case kNctaidX: return l.grid.x;
  case kNctaidY: return l.grid.y;
  case kNctaidZ: return l.grid.z;
  case kWarpSize: return 32;
  case kLaneId: return f.linear % 32;
  case kWarpId: return f.linear / 32;
  }
  return 0;
}

extern "C" int HelperBarrier(int kind, int predicate) {
  Fiber* f = t_launch->current;
  f->predicate = kind == kBarPlain ? 0 : (predicate != 0);
  Yield(f, State::kAtBarrier);
  const gpusim::Dim3& b = t_launch->block;
  int count = f->barrier_result; // how many threads had a true predicate
  switch (kind) {
  case kBarAnd: return count == static_cast<int>(b.x * b.y * b.z);
  case kBarOr: return count > 0;
  default: return count;
  }
}

extern "C" char* HelperSharedBase() { return t_launch->shared; }

extern "C" const gpusim::MemoryWindow* HelperWindow() { return &t_launch->window; }

extern "C" void* HelperCheckAccess(void* address, uint64_t bytes, int flags, uint64_t align) {
  Launch& l = *t_launch;
  auto a = reinterpret_cast<uintptr_t>(address);
  bool aligned = align <= 1 || a % align == 0; // x86 tolerates a misaligned access, a GPU does not
  int code = 700;
  if (flags & 2) { // shared memory: inside the block's static and dynamic arrays
    auto base = reinterpret_cast<uintptr_t>(l.shared);
    if (aligned && a >= base && a + bytes <= base + l.shared_bytes) return address;
  } else {
    const gpusim::MemoryWindow& w = l.window;
    auto base = reinterpret_cast<uintptr_t>(l.shared);
    if (a + bytes > base - kSharedRedZone && a < base + l.shared_bytes + kSharedRedZone &&
        (a < base || a + bytes > base + l.shared_bytes))
      flags |= 2; // a generic access just outside the block's shared memory
    else if (a - w.device_begin >= w.device_end - w.device_begin)
      return address; // not device memory
    else if (aligned && gpusim::IsLiveDeviceRange(a, bytes))
      return reinterpret_cast<void*>(a + static_cast<uintptr_t>(w.alias_delta));
  }
  if (!aligned) code = 716;
  Fiber* f = l.current;
  l.fault = {.set = true,
             .cuda_error = code,
             .address = a,
             .bytes = bytes,
             .align = align,
             .is_store = (flags & 1) != 0,
             .shared = (flags & 2) != 0};
  std::memcpy(l.fault.tid, f->tid, sizeof f->tid);
  Yield(f, State::kFaulted); // never resumed
  __builtin_unreachable();
}

template <class T> T Rounded(int op, int mode, T a, T b, T c) {
  static const int kModes[] = {FE_TONEAREST, FE_TOWARDZERO, FE_DOWNWARD, FE_UPWARD};
  int saved = std::fegetround();
  std::fesetround(kModes[mode & 3]);
  asm volatile("" : "+x"(a), "+x"(b), "+x"(c)); // the operation stays after fesetround
  T r = 0;
  switch (op) {
  case kRAdd: r = a + b; break;
  case kRMul: r = a * b; break;
  case kRFma: r = std::fma(a, b, c); break;
  case kRDiv: r = a / b; break;
  case kRSqrt: r = std::sqrt(a); break;
  case kRRcp: r = T(1) / a; break;
  }
  asm volatile("" : "+x"(r)); // ... and before the mode is restored
  std::fesetround(saved);
  return r;
}
extern "C" float HelperRoundedF32(int op, int mode, float a, float b, float c) {
  return Rounded(op, mode, a, b, c);
}
extern "C" double HelperRoundedF64(int op, int mode, double a, double b, double c) {
  return Rounded(op, mode, a, b, c);
}

} // namespace

const Helpers& HostHelpers() {
  static const Helpers h{
      .sreg = reinterpret_cast<uintptr_t>(&HelperSreg),
      .barrier = reinterpret_cast<uintptr_t>(&HelperBarrier),
      .shared_base = reinterpret_cast<uintptr_t>(&HelperSharedBase),
      .check_access = reinterpret_cast<uintptr_t>(&HelperCheckAccess),
      .rounded_f32 = reinterpret_cast<uintptr_t>(&HelperRoundedF32),
      .rounded_f64 = reinterpret_cast<uintptr_t>(&HelperRoundedF64),
      .window = reinterpret_cast<uintptr_t>(&HelperWindow),
  };
  return h;
}

std::unique_ptr<gpusim::KernelFault> RunLaunch(EntryFn entry, const std::string& kernel, bool has_barrier,
                                               size_t static_smem, gpusim::Dim3 grid, gpusim::Dim3 block,
                                               size_t dynamic_smem, void** args, uint64_t seed) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  auto fail = [&](int code, const std::string& what) {
    auto f = std::make_unique<gpusim::KernelFault>();
    f->cuda_error = code;
    f->message = "kernel '" + kernel + "': " + what;
    return f;
  };
  if (threads == 0 || threads > 1024 || blocks == 0)
    return fail(9, "invalid launch configuration: block (" + std::to_string(block.x) + ", " +
                       std::to_string(block.y) + ", " + std::to_string(block.z) + ") of " +
                       std::to_string(threads) + " threads, grid of " + std::to_string(blocks) +
                       " blocks (cuda error 9 invalid configuration)");
  KILN_CHECK(t_launch == nullptr) << "gpusim: a kernel launched from inside a simulated kernel";

  Launch l;
  l.entry = entry;
  l.args = args;
  l.grid = grid;
  l.block = block;
  // The window of the launching platform's memory (several simulated platforms each have one).
  l.window = gpusim::DeviceMemoryWindow();
  // Red zones around the block's shared memory: a stray generic access near it corrupts nothing,
  // and checked mode reports it.
  std::vector<char> shared(kSharedRedZone + static_smem + dynamic_smem + kSharedRedZone);
  l.shared = shared.data() + kSharedRedZone;
  l.shared_bytes = static_smem + dynamic_smem;
  std::vector<Fiber> fibers(has_barrier ? threads : 1);
  for (size_t i = 0; i < fibers.size(); ++i) t_stacks.Get(i);
  SanInitHost(l.host);
  t_launch = &l;
  struct Reset {
    const std::vector<Fiber>& fibers;
    ~Reset() {
      t_launch = nullptr;
      for (size_t i = 0; i < fibers.size(); ++i) // fibers a fault or a divergent barrier left behind
        if (fibers[i].san != nullptr && fibers[i].state != State::kDone)
          SanForgetFiber(*fibers[i].san, t_stacks.stacks[i], kStackBytes);
    }
  } reset{fibers};

  // The order depends on the seed, the kernel and the grid only, so that the seed repeats it.
  const uint64_t launch_seed = BlockOrder::Mix(seed ^ std::hash<std::string>{}(kernel) ^
                                               (uint64_t{grid.x} << 40 ^ uint64_t{grid.y} << 20 ^ grid.z));
  const BlockOrder order(blocks, launch_seed);
  // Between two barriers the warps of a block run in a random order too (the threads of a warp
  // in order), so that a missing __syncthreads shows up whichever neighbour a thread reads.
  std::vector<uint32_t> warps((threads + 31) / 32);
  auto seed_note = [&] {
    return " (blocks ran in a random order: KILN_GPU_SIM_SEED=" + std::to_string(seed) + " repeats it)";
  };
  auto set_tid = [&](Fiber& f, uint64_t t) {
    f.linear = static_cast<uint32_t>(t);
    f.tid[0] = static_cast<uint32_t>(t % block.x);
    f.tid[1] = static_cast<uint32_t>(t / block.x % block.y);
    f.tid[2] = static_cast<uint32_t>(t / (uint64_t{block.x} * block.y));
  };
  for (uint64_t i = 0; i < blocks; ++i) {
    uint64_t b = order(i);
    l.ctaid[0] = static_cast<uint32_t>(b % grid.x);
    l.ctaid[1] = static_cast<uint32_t>(b / grid.x % grid.y);
    l.ctaid[2] = static_cast<uint32_t>(b / (uint64_t{grid.x} * grid.y));
    std::memset(l.shared, 0xFF, l.shared_bytes); // poison: NaN as float, -1 as integer
    if (!has_barrier) {                          // one thread after another on one stack
      for (uint64_t t = 0; t < threads && !l.fault.set; ++t) {
        set_tid(fibers[0], t);
        StartFiber(fibers[0], t_stacks.stacks[0], 0);
        Resume(l, fibers[0]);
      }
    } else {
      for (uint64_t t = 0; t < threads; ++t) {
        set_tid(fibers[t], t);
        StartFiber(fibers[t], t_stacks.stacks[t], t);
      }
      std::iota(warps.begin(), warps.end(), 0u);
      std::shuffle(warps.begin(), warps.end(), std::mt19937_64(launch_seed + b));
      for (;;) { // one round: every thread runs to its next barrier or its end
        uint64_t at_barrier = 0, done = 0, popc = 0;
        for (uint32_t w : warps) {
          for (uint64_t t = uint64_t{w} * 32; t < std::min<uint64_t>(threads, uint64_t{w} * 32 + 32); ++t) {
            Fiber& f = fibers[t];
            if (f.state != State::kRunnable) continue;
            Resume(l, f);
            if (l.fault.set) break;
          }
          if (l.fault.set) break;
        }
        if (l.fault.set) break;
        for (const Fiber& f : fibers) {
          at_barrier += f.state == State::kAtBarrier;
          done += f.state == State::kDone;
          popc += f.state == State::kAtBarrier && f.predicate;
        }
        if (at_barrier == 0) break;
        if (done > 0) {
          return fail(719, "__syncthreads() in block " + Dims(l.ctaid) + " was reached by " +
                               std::to_string(at_barrier) + " of " + std::to_string(threads) +
                               " threads; the other " + std::to_string(done) +
                               " had returned. A barrier must be reached by every thread of the block "
                               "(cuda error 719 launch failure)" +
                               seed_note());
        }
        for (Fiber& f : fibers) { // the count that __syncthreads_count/_and/_or derive their result from
          f.barrier_result = static_cast<int>(popc);
          f.state = State::kRunnable;
        }
      }
    }
    if (l.fault.set) {
      const Fault& x = l.fault;
      std::ostringstream os;
      os << "thread " << Dims(x.tid) << " of block " << Dims(l.ctaid) << (x.is_store ? " wrote " : " read ")
         << x.bytes << " bytes at ";
      if (x.shared)
        os << "shared memory offset "
           << static_cast<int64_t>(x.address - reinterpret_cast<uintptr_t>(l.shared));
      else
        os << "device address 0x" << std::hex << x.address << std::dec;
      if (x.cuda_error == 716)
        os << ", which is not aligned to " << x.align
           << " bytes as the access requires (cuda error 716 misaligned address";
      else if (x.shared)
        os << ", outside the block's " << l.shared_bytes
           << " bytes of shared memory (cuda error 700 illegal address";
      else
        os << ", which is not inside one live allocation (cuda error 700 illegal address";
      os << "; checked by KILN_GPU_SIM_ASAN=1)" << seed_note();
      return fail(x.cuda_error, os.str());
    }
  }
  return nullptr;
}

} // namespace kiln::codegen::gpusim_detail
