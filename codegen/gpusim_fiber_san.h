// The kernel emulator's fiber switches told to AddressSanitizer and ThreadSanitizer (make
// test-asan, make test-tsan). gpusim_fiber.cc moves the stack pointer between the host thread's
// stack and the fibers' own stacks; unannounced, ASan takes a fiber's frames for a stack overflow
// or stray stack accesses, and TSan attributes every fiber to the host thread's one call stack,
// which then never unwinds. Without a sanitizer every hook here is empty and compiles to nothing.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define KILN_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define KILN_FIBER_TSAN 1
#endif
#if defined(__has_feature) // clang spells it this way
#if __has_feature(address_sanitizer)
#define KILN_FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define KILN_FIBER_TSAN 1
#endif
#endif

#if KILN_FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if KILN_FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#define KILN_FIBER_NO_TSAN __attribute__((no_sanitize_thread))
#else
#define KILN_FIBER_NO_TSAN
#endif
// Always inlined: TSan records a function's entry and exit on the context current at each, so an
// out-of-line hook that switches contexts would enter on one call stack and leave from another.
#define KILN_FIBER_HOOK __attribute__((always_inline)) inline

namespace kiln::codegen::gpusim_detail {

/// What the sanitizers need to know of one execution context: a fiber, or the host thread's stack.
struct FiberSan {
#if KILN_FIBER_ASAN
  void* fake_stack = nullptr;   // ASan's frames of this context (use-after-return) while switched out
  const void* bottom = nullptr; // lowest byte of this context's stack
  size_t size = 0;
#endif
#if KILN_FIBER_TSAN
  void* tsan = nullptr; // TSan's state of this context: its own call stack and clock
#endif
};

/// Sets up `f` for a fiber whose stack is [stack, stack + bytes).
KILN_FIBER_HOOK void SanInitFiber(FiberSan& f, char* stack, size_t bytes) {
#if KILN_FIBER_ASAN
  f.bottom = stack;
  f.size = bytes;
#endif
#if KILN_FIBER_TSAN
  if (f.tsan == nullptr) f.tsan = __tsan_create_fiber(0);
#endif
}

/// Forgets a fiber that was abandoned in the middle of its kernel (a fault, a divergent barrier):
/// the redzones its frames left poisoned on its stack, and TSan's call stack of frames that never
/// returned. The fiber is set up again by SanInitFiber.
KILN_FIBER_HOOK void SanForgetFiber(FiberSan& f, char* stack, size_t bytes) {
#if KILN_FIBER_ASAN
  ASAN_UNPOISON_MEMORY_REGION(stack, bytes);
  f.fake_stack = nullptr; // its fake frames, if any, stay allocated: ASan has no call to free them
#endif
#if KILN_FIBER_TSAN
  if (f.tsan != nullptr) __tsan_destroy_fiber(f.tsan);
  f.tsan = nullptr;
#endif
}

/// Releases what SanInitFiber created (when the host thread's stack pool goes).
KILN_FIBER_HOOK void SanDestroyFiber(FiberSan& f) {
#if KILN_FIBER_TSAN
  if (f.tsan != nullptr) __tsan_destroy_fiber(f.tsan);
  f.tsan = nullptr;
#endif
}

/// The host thread's own context, before it resumes the first fiber of a launch.
KILN_FIBER_HOOK void SanInitHost(FiberSan& host) {
#if KILN_FIBER_TSAN
  host.tsan = __tsan_get_current_fiber();
#endif
}

/// Right before switching from the running context `from` to `to`. `from_ends`: `from` is never
/// resumed (its fake frames are freed).
KILN_FIBER_HOOK void SanBeforeSwitch(FiberSan& from, const FiberSan& to, bool from_ends) {
#if KILN_FIBER_ASAN
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &from.fake_stack, to.bottom, to.size);
#endif
#if KILN_FIBER_TSAN
  // Flags 0: the switch orders everything before it before everything after it (the fibers of a
  // launch run in turn on one host thread).
  __tsan_switch_to_fiber(to.tsan, 0);
#endif
}

/// Right after `self` was switched to. `from`, when given, learns the stack of the context that
/// switched here (a fiber's first switch finds out the host thread's stack this way).
KILN_FIBER_HOOK void SanAfterSwitch(FiberSan& self, FiberSan* from) {
#if KILN_FIBER_ASAN
  __sanitizer_finish_switch_fiber(self.fake_stack, from ? &from->bottom : nullptr, from ? &from->size : nullptr);
#endif
}

} // namespace kiln::codegen::gpusim_detail
