// kiln.distributed on tensors (include/kiln/frontend/distributed.h): argument checks, the engine
// tasks, and the schedule check. The MPI buffer work is runtime/mpi.cc's.
#include "kiln/frontend/distributed.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "kiln/frontend/call_site.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"

namespace kiln::distributed {

namespace {

// Arrays below this size are packed into one buffer per dtype and reduced in one message:
// the per-message latency, not the bandwidth, is what small gradients pay.
constexpr size_t kPackBytes = 64 << 10;

/// Written by every collective task: keeps them in call order, identical on all ranks.
engine::Var* OrderVar() {
  static engine::Var* v = engine::Engine::Get().NewVar();
  return v;
}

/// Runs fn as an ordered collective task and waits for it on this thread; rethrows its error
/// here (not stored on the order variable, which must stay usable).
void RunOrdered(const char* name, std::function<void()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  engine::Var* w[1] = {OrderVar()};
  engine::TaskOptions o;
  o.device = cpu(0);
  o.stream = engine::StreamKind::kComm;
  o.name = name;
  o.call_site = CurrentCallSite();
  engine::Engine::Get().Push(
      [done, fn = std::move(fn)] {
        try {
          fn();
          done->set_value();
        } catch (...) {
          done->set_exception(std::current_exception());
        }
      },
      {}, w, o);
  f.get();
}

void RequireInit(const char* what) {
  if (mpi::IsFinalized())
    KILN_THROW(StateError) << what << ": kiln.distributed was finalized; collectives must come before "
                           << "kiln.distributed.finalize()";
  if (!mpi::IsInitialized())
    KILN_THROW(StateError)
        << what << ": kiln.distributed is not initialized; call "
        << "kiln.distributed.init() first (under mpirun -np N, or alone for a 1-process world)";
}

void CheckArrays(const std::vector<Tensor>& arrays, const char* what) {
  RequireInit(what);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Tensor& t = arrays[i];
    if (!t.defined()) KILN_THROW(ValueError) << what << ": array #" << i << " is undefined";
    if (t.impl()->symbol)
      KILN_THROW(StateError) << what << ": array #" << i << " is a symbol of a hybridize trace; "
                             << "reduce concrete arrays, outside hybridized blocks";
    if (!t.is_contiguous())
      KILN_THROW(ValueError) << what << ": array #" << i << " " << t.shape().str()
                             << " is a strided view; expected contiguous arrays (reduce the array itself, "
                             << "or a .copy() and write it back)";
    if (t.device().is_gpu() != arrays[0].device().is_gpu() ||
        (t.device().is_gpu() && t.device() != arrays[0].device()))
      KILN_THROW(DeviceError) << what << ": array #" << i << " is on " << t.device().str() << ", array #0 on "
                              << arrays[0].device().str()
                              << "; expected CPU arrays, or arrays on one GPU: call once per device";
  }
  // Views of one buffer (a gradient bucket) are fine as long as they do not overlap.
  std::vector<size_t> order(arrays.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) { return std::make_pair(arrays[i].storage().get(), arrays[i].offset()); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  for (size_t k = 1; k < order.size(); ++k) {
    const Tensor &a = arrays[order[k - 1]], &b = arrays[order[k]];
    if (a.SharesStorage(b) && a.offset() + a.numel() > b.offset())
      KILN_THROW(ValueError) << what << ": arrays #" << order[k - 1] << " and #" << order[k]
                             << " overlap in memory and would be reduced twice; pass each array once";
  }
}

/// The variables of the arrays plus the order variable: the task reads and writes all of them.
std::vector<engine::Var*> Vars(const std::vector<Tensor>& arrays) {
  std::vector<engine::Var*> v;
  for (const Tensor& t : arrays) v.push_back(t.storage()->var());
  return v;
}

/// After a failed collective MPI may still write into the arrays (a late peer completing a request
/// that was given up on): their storage is kept alive for the rest of the process.
void KeepForever(const std::vector<Tensor>& arrays) {
  static std::mutex mu;
  static auto* kept = new std::vector<Tensor>();
  std::lock_guard<std::mutex> g(mu);
  kept->insert(kept->end(), arrays.begin(), arrays.end());
}

void PushCollective(const char* name, const std::vector<Tensor>& arrays, std::function<void()> fn) {
  std::vector<engine::Var*> reads = Vars(arrays);
  std::vector<engine::Var*> writes = reads;
  writes.push_back(OrderVar());
  engine::TaskOptions o;
  o.device = arrays[0].device().is_gpu() ? arrays[0].device() : cpu(0);
  o.stream = engine::StreamKind::kComm;
  o.name = name;
  o.call_site = CurrentCallSite();
  engine::Engine::Get().Push(
      [arrays, fn = std::move(fn)] {
        try {
          fn();
        } catch (...) {
          KeepForever(arrays);
          throw;
        }
      },
      reads, writes, o);
}

void AllreduceCpu(const std::vector<Tensor>& arrays, mpi::ReduceOp op) {
  std::map<DType, std::vector<const Tensor*>> small;
  for (const Tensor& t : arrays) {
    size_t bytes = static_cast<size_t>(t.numel()) * DTypeSize(t.dtype());
    if (bytes < kPackBytes)
      small[t.dtype()].push_back(&t);
    else
      mpi::Allreduce(t.View().data, t.numel(), t.dtype(), op);
  }
  for (auto& [dtype, group] : small) {
    if (group.size() == 1) {
      mpi::Allreduce(group[0]->View().data, group[0]->numel(), dtype, op);
      continue;
    }
    const size_t esize = DTypeSize(dtype);
    int64_t total = 0;
    for (const Tensor* t : group) total += t->numel();
    // Leaked if the reduction fails, for the reason of KeepForever.
    auto packed_owner = std::make_unique<std::vector<char>>(static_cast<size_t>(total) * esize);
    std::vector<char>& packed = *packed_owner;
    size_t off = 0;
    for (const Tensor* t : group) {
      size_t n = static_cast<size_t>(t->numel()) * esize;
      std::memcpy(packed.data() + off, t->View().data, n);
      off += n;
    }
    try {
      mpi::Allreduce(packed.data(), total, dtype, op);
    } catch (...) {
      packed_owner.release();
      throw;
    }
    off = 0;
    for (const Tensor* t : group) {
      size_t n = static_cast<size_t>(t->numel()) * esize;
      std::memcpy(t->View().data, packed.data() + off, n);
      off += n;
    }
  }
}

std::string Serialize(const std::vector<ScheduleEntry>& entries) {
  std::string s;
  for (const ScheduleEntry& e : entries) s += EntryText(e) + "\n";
  return s;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

} // namespace

void Init(double timeout_s) {
  mpi::Init(timeout_s);
  OrderVar();
}
bool IsInitialized() { return mpi::IsInitialized(); }
int Rank() { return mpi::Rank(); }
int Size() { return mpi::Size(); }
int LocalRank() { return mpi::LocalRank(); }

void Barrier() {
  RequireInit("barrier");
  RunOrdered("barrier", [] { mpi::Barrier(); });
}

void Allreduce(const std::vector<Tensor>& arrays, mpi::ReduceOp op) {
  CheckArrays(arrays, "allreduce");
  if (arrays.empty()) return;
  const bool gpu = arrays[0].device().is_gpu();
  // Without NCCL for these GPUs (simulated ones, or a build without it) their arrays go through
  // MPI via host copies.
  const bool staged = gpu && !mpi::NcclAvailable();
  for (size_t i = 0; i < arrays.size(); ++i) {
    DType t = arrays[i].dtype();
    if (op == mpi::ReduceOp::kMean && !IsFloat(t))
      KILN_THROW(DTypeError) << "allreduce: op='mean' expected float arrays, found " << DTypeName(t)
                             << " (array #" << i << "); use op='sum', or cast to float32";
    if ((!gpu || staged) && !(t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kInt32 ||
                              t == DType::kInt64 || t == DType::kUInt8))
      KILN_THROW(DTypeError)
          << "allreduce: expected float32, float64, int32, int64 or uint8 " << (gpu ? "arrays on simulated GPUs" : "CPU arrays")
          << ", found " << DTypeName(t) << " (array #" << i << "); cast with astype('float32')";
  }
  if (mpi::IsLocalWorld()) return; // one process: the sum, mean, max and min are the array itself
  PushCollective("allreduce", arrays, [arrays, op, gpu, staged] {
    if (!gpu) return AllreduceCpu(arrays, op);
    if (staged) {  // on the GPU's worker: to the host, through MPI, back
      for (const Tensor& t : arrays) {
        const size_t bytes = static_cast<size_t>(t.numel()) * DTypeSize(t.dtype());
        std::vector<char> host(bytes);
        cuda::CopyAsync(host.data(), t.View().data, bytes, cuda::CopyKind::kDeviceToHost);
        cuda::SynchronizeWorkerStream();
        mpi::Allreduce(host.data(), t.numel(), t.dtype(), op);
        cuda::CopyAsync(t.View().data, host.data(), bytes, cuda::CopyKind::kHostToDevice);
        cuda::SynchronizeWorkerStream();  // `host` is freed when this returns
      }
      return;
    }
    for (const Tensor& t : arrays)
      mpi::NcclAllreduce(t.View().data, t.numel(), t.dtype(), op, t.device().index, cuda::CurrentStream());
  });
}

void Broadcast(const std::vector<Tensor>& arrays, int root) {
  CheckArrays(arrays, "broadcast");
  if (arrays.empty()) return;
  if (root < 0 || root >= mpi::Size())
    KILN_THROW(ValueError) << "broadcast: root " << root << " is not a rank; expected 0 <= root < "
                           << mpi::Size();
  if (mpi::IsLocalWorld()) return;
  // GPU arrays (the Trainer's first parameters, once) go through MPI via host copies, on the
  // GPU's worker.
  PushCollective("broadcast", arrays, [arrays, root, gpu = arrays[0].device().is_gpu()] {
    for (const Tensor& t : arrays) {
      const size_t bytes = static_cast<size_t>(t.numel()) * DTypeSize(t.dtype());
      if (!gpu) {
        mpi::Broadcast(t.View().data, bytes, root);
        continue;
      }
      std::vector<char> host(bytes);
      cuda::CopyAsync(host.data(), t.View().data, bytes, cuda::CopyKind::kDeviceToHost);
      cuda::SynchronizeWorkerStream();
      mpi::Broadcast(host.data(), bytes, root);
      cuda::CopyAsync(t.View().data, host.data(), bytes, cuda::CopyKind::kHostToDevice);
      cuda::SynchronizeWorkerStream();  // `host` is freed when this returns
    }
  });
}

std::string EntryText(const ScheduleEntry& e) {
  return e.name + " " + e.shape.str() + " " + DTypeName(e.dtype);
}

void CheckSchedule(const std::vector<ScheduleEntry>& entries) {
  RequireInit("check_schedule");
  const std::string mine = Serialize(entries);
  std::vector<std::string> all;
  RunOrdered("check_schedule", [&] {
    std::vector<uint64_t> hashes = mpi::AllgatherU64(mpi::Fnv1a(mine), "check_schedule");
    for (uint64_t h : hashes)
      if (h != hashes[0]) {
        all = mpi::AllgatherBytes(mine, "check_schedule");
        return;
      }
  });
  if (all.empty()) return;
  std::vector<std::vector<std::string>> lists;
  size_t longest = 0;
  for (const std::string& s : all) {
    lists.push_back(Lines(s));
    longest = std::max(longest, lists.back().size());
  }
  size_t first = 0;
  for (; first < longest; ++first) {
    bool same = true;
    for (const auto& l : lists)
      same = same && first < l.size() && first < lists[0].size() && l[first] == lists[0][first];
    if (!same) break;
  }
  std::ostringstream msg;
  msg << "check_schedule: the ranks would reduce different arrays, which would hang or mix up values: "
      << "expected the same (name, shape, dtype) list in the same order on every rank, found a difference at "
      << "entry #" << first << ":";
  for (size_t r = 0; r < lists.size(); ++r) {
    msg << "\n  rank " << r << ": ";
    if (first < lists[r].size())
      msg << lists[r][first];
    else
      msg << "no entry #" << first << " (only " << lists[r].size() << " entries)";
  }
  msg << "\nEvery rank must build the same model and reduce its parameters in the same order "
         "(same grad_req, same parameter creation order); this is rank "
      << mpi::Rank() << "'s error.";
  throw DistributedError(msg.str());
}

void Finalize() {
  if (!mpi::IsInitialized()) return;
  try {
    engine::Engine::Get().WaitForAll(); // queued collectives meet their peers first
  } catch (const std::exception&) {
    // an error nobody waited for: the process is exiting anyway
  }
  mpi::Finalize();
}

} // namespace kiln::distributed
