// MPI collectives with deadlines (see include/kiln/runtime/mpi.h).
//
// Small buffers use MPI_Iallreduce; large ones a ring allreduce over MPI_Isend/MPI_Irecv:
// reduce-scatter in 1 MB segments, each reduced while still in cache, then allgather. Each rank
// sends 2(p-1)/p of the buffer, the least any algorithm can; OpenMPI's nonblocking allreduce
// reduces through one root for few ranks. Every wait polls MPI_Testall: spinning first (progress
// only happens inside MPI calls), then yielding, then sleeping, until the deadline. Before data
// moves, the ranks compare sizes (CheckAgree); after a failed wait, buffers MPI may still write
// are never freed (KeepOnFailure). Under mpirun, a SIGTERM from the launcher prints which rank
// was waiting in what.
#include "kiln/runtime/mpi.h"

// The C API only: mpi.h would otherwise pull in the C++ bindings (libmpi_cxx), not linked.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "kiln/runtime/env.h"
#include "kiln/runtime/profiler.h"

namespace kiln::mpi {

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultTimeout = 60.0;
constexpr int64_t kRingMinBytes = 256 << 10; // below: MPI_Iallreduce (latency-bound)
constexpr int64_t kSegmentBytes = 1 << 20;   // ring reduce-scatter pieces: arrive, then reduce in cache
constexpr int kTag = 7301;

// ---- the communication thread ----

class CommThread {
public:
  CommThread() : thread_([this] { Loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  /// Runs fn on the communication thread and waits; rethrows its exception.
  void Run(std::function<void()> fn) {
    if (std::this_thread::get_id() == thread_.get_id()) return fn();
    std::packaged_task<void()> task(std::move(fn));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    done.get();
  }

private:
  void Loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// ---- state (written by Init, Finalize and failures; read anywhere) ----

struct World {
  std::atomic<bool> initialized{false};
  std::atomic<bool> finalized{false};
  std::atomic<bool> broken{false};
  bool local = false;    // no launcher: one process, MPI not started
  bool owns_mpi = false; // we called MPI_Init (not someone else, e.g. mpi4py)
  int rank = 0, size = 1, local_rank = 0;
  std::atomic<double> timeout{kDefaultTimeout};
  std::string broken_reason;
  MPI_Comm comm = MPI_COMM_NULL;
  // Only for the barrier of Finalize: on `comm` it could match a collective that a rank still
  // waits in (a rank exiting early would then complete the others' allreduce with garbage).
  MPI_Comm exit_comm = MPI_COMM_NULL;
};

World& W() {
  static World* w = new World(); // leaked: must outlive exit handlers that finalize
  return *w;
}

CommThread& Comm() {
  static CommThread* t = new CommThread(); // leaked for the same reason; its thread idles
  return *t;
}

// MPI_THREAD_SERIALIZED: one MPI call sequence at a time, on whichever thread asks (an engine
// worker, the Python thread). Init and Finalize run on the communication thread, which the
// standard wants to be one and the same thread.
std::mutex& MpiMutex() {
  static std::mutex mu;
  return mu;
}

template <class F> void Serialized(F&& fn) {
  std::lock_guard<std::mutex> g(MpiMutex());
  fn();
}

std::mutex& InitMutex() {
  static std::mutex mu;
  return mu;
}

// The operation an MPI wait is in, for the SIGTERM note.
std::atomic<const char*> g_current_op{nullptr};

void OnSigterm(int sig) {
  // Async-signal-safe: write() and a fixed text. mpirun sends SIGTERM to the survivors when a
  // rank exits with an error; say so instead of dying silently.
  const char* op = g_current_op.load();
  char buf[512];
  int n = 0;
  auto put = [&](const char* s) {
    while (*s && n < static_cast<int>(sizeof(buf)) - 1) buf[n++] = *s++;
  };
  char rank[16];
  int r = W().rank, k = 0;
  char tmp[16];
  do tmp[k++] = static_cast<char>('0' + r % 10), r /= 10;
  while (r && k < 15);
  for (int i = 0; i < k; ++i) rank[i] = tmp[k - 1 - i];
  rank[k] = 0;
  put("kiln.distributed: rank ");
  put(rank);
  put(" was terminated by the launcher (SIGTERM)");
  if (op) put(" while waiting in "), put(op);
  put(": another rank probably failed or exited; its own error is printed above or below\n");
  ssize_t ignored = write(2, buf, static_cast<size_t>(n));
  (void)ignored;
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallSigtermNote() {
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return; // user's own
  struct sigaction sa {};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

bool LaunchedByMpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

double TimeoutFromEnvironment() {
  std::string v = env::Get("KILN_DIST_TIMEOUT");  // declared in runtime/env.cc's switch table
  if (v.empty()) return kDefaultTimeout;
  char* end = nullptr;
  double t = std::strtod(v.c_str(), &end);
  if (*end != '\0' || !(t > 0))
    KILN_THROW(ValueError) << "KILN_DIST_TIMEOUT=" << v << ": expected a positive number of seconds";
  return t;
}

std::string MpiErrorText(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

[[noreturn]] void Fail(const char* what, const std::string& why) {
  World& w = W();
  std::string msg =
      std::string(what) + ": rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) + " " + why;
  if (!w.broken.exchange(true)) w.broken_reason = msg;
  g_current_op.store(nullptr);
  throw DistributedError(msg);
}

void CheckRc(int rc, const char* what, const char* call) {
  if (rc != MPI_SUCCESS)
    Fail(what, std::string("failed in ") + call + ": " + MpiErrorText(rc) +
                   ": expected every rank in the same collective with the same sizes, found an error; "
                   "another rank has probably died (check its output) or reduces different arrays "
                   "(kiln.distributed.check_schedule finds this). kiln.distributed cannot be used again "
                   "in this process");
}

/// Polls the requests until all complete or the deadline passes.
void WaitAll(MPI_Request* reqs, int n, const char* what) {
  World& w = W();
  g_current_op.store(what);
  Clock::time_point start = Clock::now();
  auto limit = std::chrono::duration<double>(w.timeout.load());
  for (int spins = 0;; ++spins) {
    int flag = 0;
    CheckRc(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE), what, "MPI_Testall");
    if (flag) break;
    if (spins % 64 != 63) continue;
    auto waited = Clock::now() - start;
    if (waited > limit) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f", w.timeout.load());
      Fail(what, std::string("waited ") + secs +
                     " s for the other ranks: expected every rank to join the same collective, found "
                     "no progress; a rank has probably died, hangs, or runs a different schedule "
                     "(kiln.distributed.check_schedule finds the latter). Check the other ranks' "
                     "output, or raise the limit with kiln.distributed.init(timeout=...) or "
                     "KILN_DIST_TIMEOUT. kiln.distributed cannot be used again in this process");
    }
    if (waited > std::chrono::milliseconds(20))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    else if (waited > std::chrono::milliseconds(1))
      std::this_thread::yield();
  }
  g_current_op.store(nullptr);
}

void Wait(MPI_Request* req, const char* what) { WaitAll(req, 1, what); }

/// Buffers that MPI may still write after a failed wait (a late peer completing a request we gave
/// up on) must never be freed: on unwinding, this moves the container's heap block into a leaked
/// one instead.
template <class C> class KeepOnFailure {
public:
  explicit KeepOnFailure(C& c) : c_(c), uncaught_(std::uncaught_exceptions()) {}
  ~KeepOnFailure() {
    if (std::uncaught_exceptions() > uncaught_) new C(std::move(c_));
  }
  KeepOnFailure(const KeepOnFailure&) = delete;
  KeepOnFailure& operator=(const KeepOnFailure&) = delete;

private:
  C& c_;
  int uncaught_;
};

void CheckInitialized(const char* what) {
  if (W().finalized.load())
    KILN_THROW(StateError) << what << ": kiln.distributed was finalized; use it before "
                           << "kiln.distributed.finalize()";
  if (!W().initialized.load())
    KILN_THROW(StateError) << what << ": kiln.distributed is not initialized; call kiln.distributed.init() "
                           << "first (under mpirun -np N, or alone for a 1-process world)";
}

void CheckUsable(const char* what) {
  CheckInitialized(what);
  World& w = W();
  if (w.broken.load())
    throw DistributedError(std::string(what) +
                           ": kiln.distributed failed earlier and cannot be used again "
                           "in this process (" +
                           w.broken_reason + ")");
}

MPI_Datatype MpiType(DType t, const char* what) {
  switch (t) {
  case DType::kFloat32: return MPI_FLOAT;
  case DType::kFloat64: return MPI_DOUBLE;
  case DType::kInt32: return MPI_INT32_T;
  case DType::kInt64: return MPI_INT64_T;
  case DType::kUInt8: return MPI_UINT8_T;
  default:
    KILN_THROW(DTypeError) << what << ": expected float32, float64, int32, int64 or uint8 arrays, found "
                           << DTypeName(t) << "; cast with astype('float32') before reducing";
  }
}

MPI_Op ToMpiOp(ReduceOp op) {
  switch (op) {
  case ReduceOp::kMax: return MPI_MAX;
  case ReduceOp::kMin: return MPI_MIN;
  default: return MPI_SUM;
  }
}

template <class T> void Scale(T* d, int64_t n, T factor) {
  for (int64_t i = 0; i < n; ++i) d[i] *= factor;
}

// Ring allreduce: chunk c of the buffer is reduced around the ring, then passed around again.
void RingAllreduce(char* buf, int64_t count, DType dtype, ReduceOp op, const char* what) {
  World& w = W();
  const int p = w.size, r = w.rank;
  const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
  MPI_Datatype type = MpiType(dtype, what);
  auto begin = [&](int c) { return count * c / p; };
  auto chunk = [&](int c) { return begin(c + 1) - begin(c); };
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  auto exchange = [&](char* send, int64_t send_n, char* recv, int64_t recv_n) {
    MPI_Request reqs[2];
    CheckRc(MPI_Irecv(recv, static_cast<int>(recv_n), type, left, kTag, w.comm, &reqs[0]), what, "MPI_Irecv");
    CheckRc(MPI_Isend(send, static_cast<int>(send_n), type, right, kTag, w.comm, &reqs[1]), what,
            "MPI_Isend");
    WaitAll(reqs, 2, what);
  };
  // Reduce-scatter in segments that stay in cache between their arrival and their reduction;
  // every rank walks the same number of segments per step (the last ones may be empty).
  const int64_t seg = std::max<int64_t>(1, kSegmentBytes / esize);
  const int64_t segments = ((count + p - 1) / p + seg - 1) / seg;
  std::vector<char> tmp(static_cast<size_t>(std::min(seg, (count + p - 1) / p) * esize + esize));
  KeepOnFailure keep_tmp(tmp);
  auto part = [&](int c, int64_t k) { // [offset, size) of segment k of chunk c
    int64_t lo = std::min(k * seg, chunk(c)), hi = std::min((k + 1) * seg, chunk(c));
    return std::make_pair(begin(c) + lo, hi - lo);
  };
  for (int s = 0; s < p - 1; ++s) { // rank r ends owning chunk (r + 1) % p
    int send_c = (r - s + p) % p, recv_c = (r - s - 1 + p) % p;
    for (int64_t k = 0; k < segments; ++k) {
      auto [send_at, send_n] = part(send_c, k);
      auto [recv_at, recv_n] = part(recv_c, k);
      exchange(buf + send_at * esize, send_n, tmp.data(), recv_n);
      ReduceInto(buf + recv_at * esize, tmp.data(), recv_n, dtype, op);
    }
  }
  for (int s = 0; s < p - 1; ++s) { // allgather: the reduced chunks go round
    int send_c = (r + 1 - s + p) % p, recv_c = (r - s + p) % p;
    exchange(buf + begin(send_c) * esize, chunk(send_c), buf + begin(recv_c) * esize, chunk(recv_c));
  }
}

// Every rank must pass the same size and the same dtype and op (or root): compared with one small
// allreduce before the data moves, because OpenMPI's shared-memory single-copy path (CMA) writes
// past a receive buffer posted shorter than the message: a mismatch would corrupt memory instead
// of failing. Costs one 32-byte collective per call.
void CheckAgree(const char* what, int64_t count, int64_t code, const char* unit, const char* code_name) {
  World& w = W();
  int64_t v[4] = {count, -count, code, -code};
  MPI_Request req;
  CheckRc(MPI_Iallreduce(MPI_IN_PLACE, v, 4, MPI_INT64_T, MPI_MAX, w.comm, &req), what, "MPI_Iallreduce");
  Wait(&req, what);
  if (v[0] == count && -v[1] == count && v[2] == code && -v[3] == code) return;
  std::string msg = std::string(what) + ": rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) +
                    ": expected the same count of " + unit + " and the same " + code_name +
                    " on every rank, found " + std::to_string(count) + " " + unit + " here";
  if (v[0] != -v[1])
    msg += " and between " + std::to_string(-v[1]) + " and " + std::to_string(v[0]) + " across the ranks";
  if (v[2] != -v[3]) msg += ", and different " + std::string(code_name) + " across the ranks";
  msg += "; every rank must reduce the same arrays in the same order (kiln.distributed.check_schedule "
         "names the first difference)";
  throw DistributedError(msg);
}

void AllreduceLocked(char* buf, int64_t count, DType dtype, ReduceOp op, const char* what) {
  World& w = W();
  CheckAgree(what, count, static_cast<int64_t>(dtype) * 8 + static_cast<int64_t>(op), "elements",
             "dtype and op");
  MPI_Datatype type = MpiType(dtype, what);
  const size_t esize = DTypeSize(dtype);
  // Chunks of at most INT_MAX / p elements: MPI counts are int.
  const int64_t max_count = INT_MAX / std::max(w.size, 1) / 2;
  for (int64_t off = 0; off < count; off += max_count) {
    int64_t n = std::min(max_count, count - off);
    char* p = buf + off * static_cast<int64_t>(esize);
    if (n * static_cast<int64_t>(esize) >= kRingMinBytes && n >= w.size) {
      RingAllreduce(p, n, dtype, op, what);
    } else {
      MPI_Request req;
      CheckRc(MPI_Iallreduce(MPI_IN_PLACE, p, static_cast<int>(n), type, ToMpiOp(op), w.comm, &req), what,
              "MPI_Iallreduce");
      Wait(&req, what);
    }
  }
}

} // namespace

// ---- public ----

void Init(double timeout_s) {
  std::lock_guard<std::mutex> g(InitMutex());
  World& w = W();
  if (w.finalized.load())
    KILN_THROW(StateError) << "kiln.distributed.init: expected a process that has not finalized, found "
                           << "finalize() already called; MPI cannot start twice in one process";
  if (timeout_s > 0) w.timeout.store(timeout_s);
  if (w.initialized.load()) return;
  if (timeout_s <= 0) w.timeout.store(TimeoutFromEnvironment());
  int already = 0;
  MPI_Initialized(&already);
  if (!already && !LaunchedByMpirun()) {
    w.local = true;
    w.initialized.store(true);
    return;
  }
  Comm().Run([&] {
    if (!already) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        KILN_THROW(StateError) << "kiln.distributed.init: MPI_Init_thread failed; run under mpirun -np N";
      w.owns_mpi = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &w.comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &w.exit_comm);
    MPI_Comm_set_errhandler(w.comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(w.exit_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(w.comm, &w.rank);
    MPI_Comm_size(w.comm, &w.size);
    if (const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
      w.local_rank = std::atoi(lr);
    } else {
      MPI_Comm node;
      MPI_Comm_split_type(w.comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
      MPI_Comm_rank(node, &w.local_rank);
      MPI_Comm_free(&node);
    }
  });
  InstallSigtermNote();
  w.initialized.store(true);
}

bool IsInitialized() { return W().initialized.load() && !W().finalized.load(); }
bool IsLocalWorld() { return W().local; }
bool IsFinalized() { return W().finalized.load(); }

int Rank() {
  CheckInitialized("rank");
  return W().rank;
}
int Size() {
  CheckInitialized("size");
  return W().size;
}
int LocalRank() {
  CheckInitialized("local_rank");
  return W().local_rank;
}
double Timeout() { return W().timeout.load(); }
void SetTimeout(double timeout_s) {
  if (!(timeout_s > 0))
    KILN_THROW(ValueError) << "timeout: expected a positive number of seconds, found " << timeout_s;
  W().timeout.store(timeout_s);
}

void Barrier() {
  CheckUsable("barrier");
  if (W().local) return;
  Serialized([] {
    MPI_Request req;
    CheckRc(MPI_Ibarrier(W().comm, &req), "barrier", "MPI_Ibarrier");
    Wait(&req, "barrier");
  });
}

void Allreduce(void* buf, int64_t count, DType dtype, ReduceOp op, const char* what) {
  CheckUsable(what);
  MpiType(dtype, what);
  if (op == ReduceOp::kMean && !IsFloat(dtype))
    KILN_THROW(DTypeError) << what << ": op='mean' expected a float array, found " << DTypeName(dtype)
                           << "; use op='sum' and divide, or cast to float32";
  World& w = W();
  profiler::Scope event(profiler::kCollective, "mpi allreduce",
                        profiler::Args("bytes", static_cast<double>(count) * static_cast<double>(DTypeSize(dtype)),
                                       "processes", w.size));
  if (!w.local) Serialized([&] { AllreduceLocked(static_cast<char*>(buf), count, dtype, op, what); });
  if (op == ReduceOp::kMean && w.size > 1) {
    if (dtype == DType::kFloat32)
      Scale(static_cast<float*>(buf), count, 1.0f / static_cast<float>(w.size));
    else
      Scale(static_cast<double*>(buf), count, 1.0 / w.size);
  }
}

void Broadcast(void* buf, size_t nbytes, int root, const char* what) {
  CheckUsable(what);
  World& w = W();
  profiler::Scope event(profiler::kCollective, "mpi broadcast",
                        profiler::Args("bytes", static_cast<double>(nbytes), "processes", w.size));
  if (root < 0 || root >= w.size)
    KILN_THROW(ValueError) << what << ": root " << root << " is not a rank; expected 0 <= root < " << w.size;
  if (w.local) return;
  Serialized([&] {
    CheckAgree(what, static_cast<int64_t>(nbytes), root, "bytes", "root");
    for (size_t off = 0; off < nbytes; off += INT_MAX / 2) {
      int n = static_cast<int>(std::min<size_t>(INT_MAX / 2, nbytes - off));
      MPI_Request req;
      CheckRc(MPI_Ibcast(static_cast<char*>(buf) + off, n, MPI_BYTE, root, w.comm, &req), what, "MPI_Ibcast");
      Wait(&req, what);
    }
  });
}

std::vector<uint64_t> AllgatherU64(uint64_t value, const char* what) {
  CheckUsable(what);
  World& w = W();
  std::vector<uint64_t> all(static_cast<size_t>(w.size), value);
  KeepOnFailure keep_all(all);
  if (w.local) return all;
  Serialized([&] {
    MPI_Request req;
    CheckRc(MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, w.comm, &req), what,
            "MPI_Iallgather");
    Wait(&req, what);
  });
  return all;
}

std::vector<std::string> AllgatherBytes(const std::string& bytes, const char* what) {
  CheckUsable(what);
  World& w = W();
  if (w.local) return {bytes};
  std::vector<std::string> out;
  Serialized([&] {
    int mine = static_cast<int>(bytes.size());
    std::vector<int> sizes(static_cast<size_t>(w.size)), displs(static_cast<size_t>(w.size));
    KeepOnFailure keep_sizes(sizes);
    MPI_Request req;
    CheckRc(MPI_Iallgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, w.comm, &req), what,
            "MPI_Iallgather");
    Wait(&req, what);
    int total = 0;
    for (int i = 0; i < w.size; ++i)
      displs[static_cast<size_t>(i)] = total, total += sizes[static_cast<size_t>(i)];
    std::vector<char> all(static_cast<size_t>(total) + 1); // + 1: never an empty block
    KeepOnFailure keep_all(all);
    KeepOnFailure keep_displs(displs);
    CheckRc(MPI_Iallgatherv(bytes.data(), mine, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR,
                            w.comm, &req),
            what, "MPI_Iallgatherv");
    Wait(&req, what);
    for (int i = 0; i < w.size; ++i)
      out.emplace_back(all.data() + displs[static_cast<size_t>(i)],
                       static_cast<size_t>(sizes[static_cast<size_t>(i)]));
  });
  return out;
}

void Finalize() {
  std::lock_guard<std::mutex> g(InitMutex());
  World& w = W();
  if (!w.initialized.load() || w.finalized.exchange(true)) return;
  if (w.local) return;
  NcclShutdown();
  Comm().Run([&] {
    std::lock_guard<std::mutex> mpi_lock(MpiMutex());
    if (!w.broken.load()) {
      // A dead peer would make MPI_Finalize hang: meet the others first, with the deadline.
      try {
        MPI_Request req;
        CheckRc(MPI_Ibarrier(w.exit_comm, &req), "finalize", "MPI_Ibarrier");
        Wait(&req, "finalize");
      } catch (const DistributedError&) {
      }
    }
    if (w.broken.load()) return; // MPI_Finalize would wait for the dead rank
    MPI_Comm_free(&w.comm);
    MPI_Comm_free(&w.exit_comm);
    if (w.owns_mpi) MPI_Finalize();
  });
}

void Abort(int code, const std::string& why) {
  World& w = W();
  if (!w.initialized.load() || w.finalized.load() || w.local) return;
  std::string line = "kiln.distributed: rank " + std::to_string(w.rank) + " " + why + "\n";
  ssize_t ignored = write(2, line.data(), line.size());
  (void)ignored;
  // Not through the communication thread, which may be stuck in a wait: MPI_Abort only signals
  // the launcher, which ends every rank.
  MPI_Abort(MPI_COMM_WORLD, code);
}

void ReduceInto(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op) {
  // The loop of the in-process collectives (collectives.h): one reduction loop for both.
  switch (dtype) {
  case DType::kFloat32: case DType::kFloat64: case DType::kInt32: case DType::kInt64: case DType::kUInt8:
    return coll::HostReduceInto(dtype, dst, src, n, op);
  default:
    KILN_THROW(DTypeError) << "reduce: expected float32, float64, int32, int64 or uint8, found "
                           << DTypeName(dtype);
  }
}

uint64_t Fnv1a(std::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

} // namespace kiln::mpi
