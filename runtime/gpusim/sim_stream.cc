// Simulated streams (sim.h): each a worker thread that runs its queue in order, as a GPU stream
// does; and the device-wide parts: the sticky error a kernel fault leaves, device synchronization.
#include <exception>

#include "sim.h"

namespace kiln::gpusim {

StreamImpl::StreamImpl(SimDevice* device, int index) : device_(device), index_(index) {
  worker_ = std::thread([this] { Loop(); });
}

StreamImpl::~StreamImpl() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void StreamImpl::Enqueue(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  cv_.notify_one();
}

void StreamImpl::Drain() {
  std::unique_lock<std::mutex> g(mu_);
  uint64_t target = enqueued_;
  done_cv_.wait(g, [&] { return done_ >= target; });
}

bool StreamImpl::Idle() {
  std::lock_guard<std::mutex> g(mu_);
  return done_ == enqueued_;
}

void StreamImpl::Loop() {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    std::function<void()> op = std::move(queue_.front());
    queue_.pop_front();
    g.unlock();
    if (!device_->sticky.load()) {  // after a fault the device runs nothing more
      try {
        op();
      } catch (const gpurt::GpuError& e) {
        device_->SetSticky(e.code(), e.what());
      } catch (const std::exception& e) {
        device_->SetSticky(gpurt::kLaunchFailed, e.what());
      }
    }
    g.lock();
    ++done_;
    done_cv_.notify_all();
  }
}

void SimDevice::CheckSticky(const char* call) {
  int code = sticky.load();
  if (!code) return;
  std::string m;
  {
    std::lock_guard<std::mutex> g(mu);
    m = sticky_message;
  }
  gpurt::Fail(code, std::string(call) + " on gpu(" + std::to_string(index) + ")",
            "an earlier kernel on this device failed and the device is unusable until the process ends, as on a "
            "real GPU: " + m);
}

void SimDevice::SetSticky(int code, const std::string& message) {
  std::lock_guard<std::mutex> g(mu);
  if (sticky.load()) return;
  sticky_message = message;
  sticky.store(code);
}

void SimDevice::Synchronize() {
  std::lock_guard<std::mutex> g(streams_mu);
  for (StreamImpl* s : streams) s->Drain();
  if (default_stream) default_stream->Drain();
}

}  // namespace kiln::gpusim
