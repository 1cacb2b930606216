// Tests of the dependency engine (engine.h): ordering of reads and writes, a randomized stress
// against a sequential oracle, error propagation, the naive engine, backpressure and WaitForVar.
// Each test builds its own engine with CreateEngine so that it does not depend on KILN_ENGINE;
// only the last test goes through Tensors and the process engine.
//
// No test asserts on elapsed time. Where concurrency must be shown, two tasks meet at a
// rendezvous (a generous deadline only turns a hang into a failure); where an order must be
// shown, tasks record sequence numbers.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"
#include "test_util.h"

namespace {

using kiln::engine::CreateEngine;
using kiln::engine::Engine;
using kiln::engine::TaskOptions;
using kiln::engine::Var;
using kiln::testing::ScopedEnv;
using namespace std::chrono_literals;

// KILN_CPU_WORKERS is read when the engine is constructed.
std::unique_ptr<Engine> MakeThreaded(int workers) {
  ScopedEnv env("KILN_CPU_WORKERS", std::to_string(workers));
  return CreateEngine("threaded");
}

std::unique_ptr<Engine> MakeEngine(const std::string& config) {
  if (config == "naive") return CreateEngine("naive");
  if (config == "threaded1") return MakeThreaded(1);
  if (config == "threaded2") return MakeThreaded(2);
  FAIL("unknown engine config " << config);
  return nullptr;
}

// Variables released on scope exit (declare after the engine so they go first).
class Vars {
 public:
  Vars(Engine& e, int n) : e_(e) {
    for (int i = 0; i < n; ++i) v_.push_back(e.NewVar());
  }
  ~Vars() {
    for (Var* v : v_) e_.ReleaseVar(v);
  }
  Var* operator[](size_t i) const { return v_[i]; }

 private:
  Engine& e_;
  std::vector<Var*> v_;
};

void Push(Engine& e, std::function<void()> fn, std::vector<Var*> reads, std::vector<Var*> writes,
          const char* name = "task", size_t bytes = 0) {
  TaskOptions o;
  o.name = name;
  o.bytes = bytes;
  e.Push(std::move(fn), reads, writes, o);
}

// Polls `cond` until it holds or `deadline` passes; returns whether it held.
bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds deadline = 10s) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Blocks a task until the test opens the gate.
struct Gate {
  std::atomic<int> open{0};
  void Wait() { open.wait(0); }
  void Open() {
    open.store(1);
    open.notify_all();
  }
};

// The message of the exception `fn` throws as E, or "<no exception>".
template <class E>
std::string ThrownMessage(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

// ---- 1. ordering -------------------------------------------------------------------------------

TEST_CASE("engine: read after write sees the written value") {
  for (int workers : {1, 2}) {
    CAPTURE(workers);
    auto e = MakeThreaded(workers);
    Vars v(*e, 2);
    for (int round = 0; round < 20; ++round) {
      int64_t cell = 0, seen = -1;
      Push(*e, [&] { std::this_thread::sleep_for(2ms), cell = 42 + round; }, {}, {v[0]});
      Push(*e, [&] { seen = cell; }, {v[0]}, {v[1]});
      e->WaitForVar(v[1]);
      CHECK(seen == 42 + round);
    }
  }
}

TEST_CASE("engine: a write waits for the earlier readers") {
  auto e = MakeThreaded(2);
  Vars v(*e, 3);
  std::atomic<int> seq{0};
  int64_t cell = 1;
  int64_t read0 = 0, read1 = 0;
  int end0 = -1, end1 = -1, write_start = -1;
  Push(*e, [&] { std::this_thread::sleep_for(30ms), read0 = cell, end0 = seq++; }, {v[0]}, {v[1]});
  Push(*e, [&] { std::this_thread::sleep_for(10ms), read1 = cell, end1 = seq++; }, {v[0]}, {v[2]});
  Push(*e, [&] { write_start = seq++, cell = 2; }, {}, {v[0]});
  e->WaitForAll();
  CHECK(read0 == 1);
  CHECK(read1 == 1);
  CHECK(write_start > end0);
  CHECK(write_start > end1);
  CHECK(cell == 2);
}

TEST_CASE("engine: writes to one variable apply in push order") {
  for (int workers : {1, 2}) {
    CAPTURE(workers);
    auto e = MakeThreaded(workers);
    Vars v(*e, 1);
    uint64_t cell = 0, expected = 0;
    for (uint64_t i = 0; i < 2000; ++i) {
      // Non-commutative: any reordering changes the result.
      Push(*e, [&cell, i] { cell = cell * 31 + i; }, {}, {v[0]});
      expected = expected * 31 + i;
    }
    int64_t last = -1;
    Push(*e, [&] { last = 7; }, {}, {v[0]});
    e->WaitForVar(v[0]);
    CHECK(cell == expected);
    CHECK(last == 7);
  }
}

TEST_CASE("engine: readers of one variable run concurrently with two workers") {
  auto e = MakeThreaded(2);
  Vars v(*e, 3);
  // Each reader waits for the other to arrive: both arrive only if they run at the same time.
  // A serializing engine makes the first reader give up at the deadline (no timing assertion).
  std::atomic<int> arrived{0};
  std::atomic<int> met{0};
  auto reader = [&] {
    ++arrived;
    auto end = std::chrono::steady_clock::now() + 10s;
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    if (arrived.load() == 2) ++met;
  };
  Push(*e, reader, {v[0]}, {v[1]});
  Push(*e, reader, {v[0]}, {v[2]});
  e->WaitForAll();
  CHECK(met == 2);
}

TEST_CASE("engine: a writer never overlaps a reader or another writer of its variable") {
  auto e = MakeThreaded(2);
  Vars v(*e, 1 + 64);
  std::atomic<int> readers{0}, writers{0}, violations{0};
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    Var* out = v[1 + i % 64];
    if (rng() % 3 == 0) {
      Push(*e, [&] {
        if (writers.fetch_add(1) != 0 || readers.load() != 0) ++violations;
        std::this_thread::sleep_for(50us);
        if (readers.load() != 0) ++violations;
        --writers;
      }, {}, {v[0]});
    } else {
      Push(*e, [&] {
        ++readers;
        if (writers.load() != 0) ++violations;
        std::this_thread::sleep_for(50us);
        if (writers.load() != 0) ++violations;
        --readers;
      }, {v[0]}, {out});
    }
  }
  e->WaitForAll();
  CHECK(violations == 0);
}

// ---- 2. stress against a sequential oracle -----------------------------------------------------

namespace {

// One random task: out = out * 31 + sum(reads) + id for each written cell (non-commutative, so
// a reordering of conflicting tasks changes the result).
struct RandomTask {
  std::vector<int> reads, writes;
  uint64_t id;
  void Apply(uint64_t* cells) const {
    uint64_t sum = 0;
    for (int r : reads) sum += cells[r];
    for (int w : writes) cells[w] = cells[w] * 31 + sum + id;
  }
};

// `n` tasks reading 0-3 cells from `readable` and writing 1-2 distinct cells from `writable`.
std::vector<RandomTask> RandomTasks(int n, const std::vector<int>& readable,
                                    const std::vector<int>& writable, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<RandomTask> tasks(n);
  for (int i = 0; i < n; ++i) {
    RandomTask& t = tasks[i];
    t.id = seed * 1000003 + i;
    for (int k = rng() % 4; k > 0; --k) t.reads.push_back(readable[rng() % readable.size()]);
    int nw = 1 + rng() % 2;
    while (static_cast<int>(t.writes.size()) < nw) {
      int w = writable[rng() % writable.size()];
      if (t.writes.empty() || t.writes[0] != w) t.writes.push_back(w);
    }
  }
  return tasks;
}

void PushTask(Engine& e, const Vars& vars, uint64_t* cells, const RandomTask& t) {
  std::vector<Var*> r, w;
  for (int i : t.reads) r.push_back(vars[i]);
  for (int i : t.writes) w.push_back(vars[i]);
  Push(e, [cells, &t] { t.Apply(cells); }, r, w, "random");
}

}  // namespace

TEST_CASE("engine: stress, one pusher, 20000 random tasks over 64 shared variables") {
  constexpr int kVars = 64, kTasks = 20000;
  std::vector<int> all(kVars);
  for (int i = 0; i < kVars; ++i) all[i] = i;
  std::vector<RandomTask> tasks = RandomTasks(kTasks, all, all, 1);
  std::vector<uint64_t> oracle(kVars);
  for (int i = 0; i < kVars; ++i) oracle[i] = i;
  for (const RandomTask& t : tasks) t.Apply(oracle.data());

  for (const char* config : {"threaded1", "threaded2", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    Vars vars(*e, kVars);
    std::vector<uint64_t> cells(kVars);
    for (int i = 0; i < kVars; ++i) cells[i] = i;
    for (const RandomTask& t : tasks) PushTask(*e, vars, cells.data(), t);
    e->WaitForAll();
    CHECK(cells == oracle);
    kiln::engine::EngineStats s = e->Stats();
    CHECK(s.pending == 0);
    CHECK(s.completed == s.pushed);
    CHECK(s.pushed >= kTasks);
  }
}

TEST_CASE("engine: stress, four pushers over their own variables and shared read-only ones") {
  // Cells 0..7 are shared: written once by an initial (slow) task, then only read by everyone.
  // Pusher p owns cells 8 + 16p .. 8 + 16p + 15; its tasks read its own and the shared cells
  // and write its own, so each pusher's result is fixed by its own sequence.
  constexpr int kShared = 8, kOwn = 16, kPushers = 4, kTasksEach = 5000;
  constexpr int kVars = kShared + kOwn * kPushers;
  std::vector<std::vector<RandomTask>> tasks(kPushers);
  std::vector<uint64_t> oracle(kVars);
  for (int i = 0; i < kVars; ++i) oracle[i] = i < kShared ? 1000 + i : i;
  for (int p = 0; p < kPushers; ++p) {
    std::vector<int> own, readable;
    for (int i = 0; i < kShared; ++i) readable.push_back(i);
    for (int i = 0; i < kOwn; ++i) own.push_back(kShared + kOwn * p + i);
    readable.insert(readable.end(), own.begin(), own.end());
    tasks[p] = RandomTasks(kTasksEach, readable, own, 100 + p);
    for (const RandomTask& t : tasks[p]) t.Apply(oracle.data());
  }

  for (const char* config : {"threaded1", "threaded2", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    Vars vars(*e, kVars);
    std::vector<uint64_t> cells(kVars);
    for (int i = 0; i < kVars; ++i) cells[i] = i;
    std::vector<Var*> shared;
    for (int i = 0; i < kShared; ++i) shared.push_back(vars[i]);
    uint64_t* c = cells.data();
    Push(*e, [c] {
      std::this_thread::sleep_for(5ms);  // readers pushed meanwhile must wait for it
      for (int i = 0; i < kShared; ++i) c[i] = 1000 + i;
    }, {}, shared, "init");
    std::vector<std::thread> pushers;
    for (int p = 0; p < kPushers; ++p)
      pushers.emplace_back([&, p] {
        for (const RandomTask& t : tasks[p]) PushTask(*e, vars, c, t);
      });
    for (auto& t : pushers) t.join();
    e->WaitForAll();
    CHECK(cells == oracle);
    CHECK(e->Stats().completed == e->Stats().pushed);
  }
}

// ---- 3. errors ---------------------------------------------------------------------------------

namespace {

void CheckErrorSemantics(Engine& e) {
  Vars v(e, 4);
  Var *a = v[0], *b = v[1], *c = v[2];
  bool b_ran = false;
  TaskOptions o;
  o.name = "boom_op";
  o.call_site = "model.py:12";
  e.Push([] { throw kiln::ValueError("boom"); }, {}, std::vector<Var*>{a}, o);
  Push(e, [&] { b_ran = true; }, {a}, {b}, "reads_a");

  std::string msg = ThrownMessage<kiln::ValueError>([&] { e.WaitForVar(a); });
  CHECK(Contains(msg, "boom_op"));
  CHECK(Contains(msg, "boom"));
  CHECK(Contains(msg, "model.py:12"));
  CHECK(e.VarError(a) != nullptr);
  // The reader of `a` is skipped and passes the error on to what it writes.
  CHECK(Contains(ThrownMessage<kiln::ValueError>([&] { e.WaitForVar(b); }), "boom"));
  CHECK_FALSE(b_ran);

  // WaitForAll reports the error once; the engine keeps working.
  CHECK_THROWS_AS(e.WaitForAll(), kiln::ValueError);
  CHECK_NOTHROW(e.WaitForAll());
  int c_value = 0;
  Push(e, [&] { c_value = 5; }, {}, {c});
  CHECK_NOTHROW(e.WaitForAll());
  CHECK_NOTHROW(e.WaitForVar(c));
  CHECK(c_value == 5);

  // A successful (pure) write clears the error; `b` keeps its error until it is written.
  int a_value = 0;
  Push(e, [&] { a_value = 1; }, {}, {a});
  CHECK_NOTHROW(e.WaitForVar(a));
  CHECK(e.VarError(a) == nullptr);
  CHECK(a_value == 1);
  CHECK(e.VarError(b) != nullptr);
  Push(e, [&] { b_ran = true; }, {a}, {b});
  CHECK_NOTHROW(e.WaitForVar(b));
  CHECK(b_ran);

  // Typed errors keep their type; anything else becomes kiln::Error.
  Push(e, [] { throw kiln::ShapeError("bad shape"); }, {}, {a}, "shape_op");
  CHECK(Contains(ThrownMessage<kiln::ShapeError>([&] { e.WaitForVar(a); }), "shape_op"));
  Push(e, [] { throw std::runtime_error("plain"); }, {}, {c}, "plain_op");
  CHECK(Contains(ThrownMessage<kiln::Error>([&] { e.WaitForVar(c); }), "plain"));
  // Only the first error since the last WaitForAll is reported.
  CHECK(Contains(ThrownMessage<kiln::ShapeError>([&] { e.WaitForAll(); }), "bad shape"));
  CHECK_NOTHROW(e.WaitForAll());
}

}  // namespace

TEST_CASE("engine: an error is stored on what the task writes and re-raised at sync points") {
  for (const char* config : {"threaded1", "threaded2", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    CheckErrorSemantics(*e);
  }
}

// A variable listed in both reads and writes (an in-place op such as `a += b`) is read by the
// task, so a stored error on it must skip the task and stay; it must not be silently cleared.
TEST_CASE("engine: an in-place task on a failed variable passes the error on") {
  for (const char* config : {"threaded1", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    Vars v(*e, 1);
    bool ran = false;
    Push(*e, [] { throw kiln::ValueError("boom"); }, {}, {v[0]}, "boom_op");
    Push(*e, [&] { ran = true; }, {v[0]}, {v[0]}, "inplace_add");
    CHECK_THROWS_AS(e->WaitForVar(v[0]), kiln::ValueError);
    CHECK_FALSE(ran);
    try {
      e->WaitForAll();
    } catch (const kiln::Error&) {
    }
  }
}

// ---- 4. naive ----------------------------------------------------------------------------------

TEST_CASE("engine: the naive engine runs each task at Push on the calling thread") {
  auto e = CreateEngine("naive");
  CHECK(e->IsNaive());
  CHECK_FALSE(MakeThreaded(1)->IsNaive());
  Vars v(*e, 2);
  std::thread::id ran_on;
  bool worker = true;
  int value = 0;
  Push(*e, [&] { ran_on = std::this_thread::get_id(), worker = kiln::engine::OnWorkerThread(); },
       {}, {v[0]});
  CHECK(ran_on == std::this_thread::get_id());
  CHECK_FALSE(worker);
  Push(*e, [&] { value = 3; }, {v[0]}, {v[1]});
  CHECK(value == 3);  // no wait needed
  CHECK(e->Stats().pending == 0);
  CHECK(e->Stats().completed == 2);
  // The error is raised at the sync point, not by Push.
  CHECK_NOTHROW(Push(*e, [] { throw kiln::ValueError("boom"); }, {}, {v[0]}, "boom_op"));
  CHECK_THROWS_AS(e->WaitForVar(v[0]), kiln::ValueError);
  CHECK_THROWS_AS(e->WaitForAll(), kiln::ValueError);
}

TEST_CASE("engine: threaded tasks run on worker threads") {
  auto e = MakeThreaded(1);
  Vars v(*e, 1);
  std::thread::id ran_on;
  bool worker = false;
  Push(*e, [&] { ran_on = std::this_thread::get_id(), worker = kiln::engine::OnWorkerThread(); },
       {}, {v[0]});
  e->WaitForVar(v[0]);
  CHECK(ran_on != std::this_thread::get_id());
  CHECK(worker);
  CHECK_FALSE(kiln::engine::OnWorkerThread());
}

// ---- 5. backpressure ---------------------------------------------------------------------------

TEST_CASE("engine: backpressure bounds the pending tasks") {
  auto e = MakeThreaded(1);
  constexpr int kLimit = 8, kTasks = 100;
  e->SetLimits(kLimit, int64_t{1} << 40);
  Vars v(*e, kTasks);
  Gate gate;
  std::atomic<int> pushed{0};
  std::thread pusher([&] {
    for (int i = 0; i < kTasks; ++i) {
      Push(*e, [&] { gate.Wait(); }, {}, {v[i]});
      ++pushed;
    }
  });
  // The only worker is held by the first task: the pusher must stop at the limit.
  REQUIRE(WaitUntil([&] { return pushed.load() >= kLimit; }));
  std::this_thread::sleep_for(50ms);  // give a broken limit time to show
  CHECK(pushed.load() == kLimit);
  CHECK(e->Stats().pending <= kLimit);
  CHECK(e->Stats().peak_pending <= kLimit);
  gate.Open();
  pusher.join();
  e->WaitForAll();
  kiln::engine::EngineStats s = e->Stats();
  CHECK(s.completed == kTasks);
  CHECK(s.pending == 0);
  CHECK(s.peak_pending <= kLimit);
}

TEST_CASE("engine: backpressure bounds the pending bytes") {
  auto e = MakeThreaded(1);
  constexpr int64_t kLimit = 1000, kBytes = 100;
  constexpr int kTasks = 100;
  e->SetLimits(0, kLimit);  // 0 keeps the task limit
  Vars v(*e, kTasks);
  Gate gate;
  std::atomic<int> pushed{0};
  std::thread pusher([&] {
    for (int i = 0; i < kTasks; ++i) {
      Push(*e, [&] { gate.Wait(); }, {}, {v[i]}, "bytes", kBytes);
      ++pushed;
    }
  });
  // Push admits a task while the pending bytes are within the limit, so the bytes may exceed it
  // by one task's worth at most (the admitted task does not count itself).
  constexpr int kMaxTasks = kLimit / kBytes + 1;
  REQUIRE(WaitUntil([&] { return pushed.load() >= kLimit / kBytes; }));
  std::this_thread::sleep_for(50ms);
  CHECK(pushed.load() <= kMaxTasks);
  CHECK(e->Stats().pending_bytes <= kLimit + kBytes);
  gate.Open();
  pusher.join();
  e->WaitForAll();
  kiln::engine::EngineStats s = e->Stats();
  CHECK(s.completed == kTasks);
  CHECK(s.pending_bytes == 0);
  CHECK(s.peak_pending_bytes <= kLimit + kBytes);
}

TEST_CASE("engine: a task larger than the byte limit still runs") {
  auto e = MakeThreaded(1);
  e->SetLimits(0, 100);
  Vars v(*e, 1);
  int runs = 0;
  for (int i = 0; i < 3; ++i) Push(*e, [&] { ++runs; }, {}, {v[0]}, "big", 1000);
  e->WaitForAll();
  CHECK(runs == 3);
}

TEST_CASE("engine: tasks pushed from a worker are not throttled (no deadlock)") {
  auto e = MakeThreaded(1);
  e->SetLimits(2, 0);
  Vars v(*e, 21);
  std::atomic<int> inner{0};
  Engine* eng = e.get();
  Push(*e, [&, eng] {
    for (int i = 0; i < 20; ++i) Push(*eng, [&] { ++inner; }, {}, {v[1 + i]});
  }, {}, {v[0]});
  e->WaitForAll();
  CHECK(inner == 20);
}

// ---- 6. WaitForVar -----------------------------------------------------------------------------

TEST_CASE("engine: WaitForVar returns at once when no write is pending") {
  for (const char* config : {"threaded1", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    Vars v(*e, 2);
    CHECK_NOTHROW(e->WaitForVar(v[0]));  // fresh variable
    if (!e->IsNaive()) {
      // A running reader does not make WaitForVar wait.
      Gate gate;
      Push(*e, [&] { gate.Wait(); }, {v[0]}, {v[1]});
      CHECK_NOTHROW(e->WaitForVar(v[0]));
      gate.Open();
      e->WaitForAll();
    }
  }
}

TEST_CASE("engine: WaitForVar blocks while a writer runs") {
  auto e = MakeThreaded(1);
  Vars v(*e, 1);
  Gate gate;
  int value = 0;
  Push(*e, [&] { gate.Wait(), value = 7; }, {}, {v[0]});
  std::atomic<bool> returned{false};
  int seen = -1;
  std::thread waiter([&] {
    e->WaitForVar(v[0]);
    seen = value;
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(returned.load());
  gate.Open();
  waiter.join();
  CHECK(returned.load());
  CHECK(seen == 7);
}

TEST_CASE("engine: waiting inside a task is refused instead of deadlocking") {
  auto e = MakeThreaded(2);
  Vars v(*e, 2);
  Gate gate;
  Push(*e, [&] { gate.Wait(); }, {}, {v[0]}, "held");
  std::string var_msg, all_msg;
  Engine* eng = e.get();
  Push(*e, [&, eng] {
    var_msg = ThrownMessage<kiln::StateError>([&] { eng->WaitForVar(v[0]); });
    all_msg = ThrownMessage<kiln::StateError>([&] { eng->WaitForAll(); });
    gate.Open();
  }, {}, {v[1]}, "waits");
  e->WaitForAll();
  CHECK(Contains(var_msg, "deadlock"));
  CHECK(Contains(all_msg, "deadlock"));
}

TEST_CASE("engine: a released variable lives until its pending tasks finish") {
  auto e = MakeThreaded(1);
  Gate gate;
  Var* a = e->NewVar();
  Var* b = e->NewVar();
  int value = 0;
  Push(*e, [&] { gate.Wait(), value = 1; }, {}, {a});
  Push(*e, [&] { value += 10; }, {a}, {b});
  e->ReleaseVar(a);
  gate.Open();
  e->WaitForVar(b);
  CHECK(value == 11);
  e->ReleaseVar(b);
}

// ---- 7. through Tensors ------------------------------------------------------------------------

TEST_CASE("engine: 1000 chained adds through Tensors on the process engine") {
  kiln::Tensor one = kiln::Tensor::Scalar(1.0);
  kiln::Tensor c = kiln::Tensor::FromVector<float>({0, 1, 2, 3}, {4});
  for (int i = 0; i < 1000; ++i) c = kiln::Invoke1("add", {c, one});
  CHECK(c.ToVector<float>() == std::vector<float>{1000, 1001, 1002, 1003});
  CHECK_NOTHROW(Engine::Get().WaitForAll());
  CHECK(Engine::Get().Stats().pending == 0);
}

TEST_CASE("engine: an inline task runs on the pushing thread only when nothing it needs is pending") {
  auto e = MakeThreaded(1);
  Vars v(*e, 3);
  TaskOptions inl;
  inl.name = "inline";
  inl.may_run_inline = true;
  const std::thread::id me = std::this_thread::get_id();

  // Ready at push: runs before Push returns, on this thread.
  std::thread::id ran_on;
  e->Push([&] { ran_on = std::this_thread::get_id(); }, std::vector<Var*>{v[0]}, std::vector<Var*>{v[1]}, inl);
  CHECK(ran_on == me);

  // Its input still being written: queued behind the writer, Push returns at once, order kept.
  std::atomic<bool> release{false};
  std::atomic<int> cell{0};
  int seen = -1;
  Push(*e, [&] { WaitUntil([&] { return release.load(); }), cell = 7; }, {}, {v[0]});
  e->Push([&] { seen = cell.load(), ran_on = std::this_thread::get_id(); }, std::vector<Var*>{v[0]},
          std::vector<Var*>{v[2]}, inl);
  CHECK(seen == -1);  // not run yet: the writer is blocked
  release = true;
  e->WaitForVar(v[2]);
  CHECK(seen == 7);
  CHECK(ran_on != me);

  // Inside an inline task this thread is a worker: waiting is refused (it would deadlock), not hung.
  bool refused = false;
  e->Push([&] {
    try {
      e->WaitForAll();
    } catch (const kiln::StateError&) {
      refused = true;
    }
  }, std::vector<Var*>{}, std::vector<Var*>{v[0]}, inl);
  CHECK(refused);
  CHECK(!kiln::engine::OnWorkerThread());  // and the flag is restored after it

  // Errors of an inline task are stored on its outputs like any other.
  e->Push([] { KILN_THROW(ValueError) << "inline failure"; }, std::vector<Var*>{}, std::vector<Var*>{v[1]}, inl);
  CHECK_THROWS_WITH_AS(e->WaitForVar(v[1]), doctest::Contains("inline failure"), kiln::ValueError);
  CHECK_THROWS(e->WaitForAll());
}

TEST_CASE("engine: eager ops on small tensors run inline, large ones are queued") {
  using kiln::Tensor;
  size_t old = kiln::SetInlineLimit(1024);
  Tensor small = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor big = Tensor::FromVector<float>(std::vector<float>(4096, 1.f), {4096});
  Engine& e = Engine::Get();
  e.WaitForAll();
  int64_t done = e.Stats().completed;
  Tensor s = kiln::Invoke1("add", {small, small});
  CHECK(e.Stats().completed == done + 1);  // finished before Invoke returned
  Tensor b = kiln::Invoke1("exp", {big});
  CHECK(b.ToVector<float>()[0] == doctest::Approx(2.718281828));
  CHECK(s.ToVector<float>() == std::vector<float>{2, 4, 6});
  kiln::SetInlineLimit(0);  // 0: every op queued, results the same
  CHECK(kiln::Invoke1("add", {small, small}).ToVector<float>() == std::vector<float>{2, 4, 6});
  kiln::SetInlineLimit(old);
}
