// WaitPoint: where threads sleep until a condition holds, and how other threads wake them without
// a system call on the busy path. A waiter registers (sleepers_) and then re-checks its condition
// under the mutex; a notifier first makes the condition true, then looks for sleepers. With
// seq_cst on both sides one of them always sees the other, so no wake-up is lost. `notified_`
// limits a burst of notifications to one condition-variable broadcast per sleep.
// WaitInterruptible also wakes every kInterruptPoll to run the interrupt check (interrupt.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "kiln/runtime/interrupt.h"

namespace kiln {

class WaitPoint {
 public:
  /// Blocks until done() is true. done() must read state that notifiers change before Notify().
  template <class Pred>
  void Wait(Pred done) {
    if (done()) return;
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1);
    notified_.store(false);
    while (!done()) {
      cv_.wait(lock);
      notified_.store(false);
    }
    sleepers_.fetch_sub(1);
  }

  /// Wait, except that the interrupt check (if one is installed) runs every kInterruptPoll
  /// meanwhile, without the lock; when it throws, the wait ends with its exception.
  template <class Pred>
  void WaitInterruptible(Pred done) {
    InterruptCheck check = GetInterruptCheck();
    if (!check) return Wait(done);
    if (done()) return;
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1);
    struct Leave {  // also when the check throws
      std::atomic<int>& n;
      ~Leave() { n.fetch_sub(1); }
    } leave{sleepers_};
    notified_.store(false);
    while (!done()) {
      if (cv_.wait_for(lock, kInterruptPoll) == std::cv_status::timeout) {
        lock.unlock();
        check();
        lock.lock();
      }
      notified_.store(false);
    }
  }

  /// Whether a thread sleeps here now (seq_cst: a notifier that changed the condition and then
  /// sees false knows the sleeper will see the change when it re-checks).
  bool HasSleepers() const { return sleepers_.load() != 0; }

  /// Wakes the waiters (if any) after the caller changed what they wait for.
  void Notify() {
    if (sleepers_.load() == 0 || notified_.exchange(true)) return;
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> notified_{false};
};

}  // namespace kiln
