// The profiler (kiln/runtime/profiler.h): nothing is recorded while it is off; engine tasks are
// named, on named worker lanes, with their queued time apart from their run; a compiled call's
// steps lie inside the call's event on its lane; compile events, memory counters and collectives
// with byte counts are present; the trace file is written whole or not at all; the aggregate
// table counts per name; GPU tasks get device-time spans from events on their stream.
//
// The trace writer puts one event per line, which the small reader below relies on; the Python
// test (tests/python/test_profiler.py) loads the same trace with a real JSON parser.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/atomic_file.h"
#include "kiln/runtime/collectives.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/profiler.h"
#include "test_util.h"

namespace {

using namespace kiln;
using kiln::testing::Contains;
using kiln::testing::ErrorOf;

struct Ev {
  std::string name, cat, ph, line;
  int tid = 0;
  double ts = 0, dur = 0;
  double Arg(const std::string& key) const {
    std::smatch m;
    std::regex re("\"" + key + "\":(-?[0-9.e+-]+)");
    return std::regex_search(line, m, re) ? std::stod(m[1]) : -1;
  }
};

struct Trace {
  std::vector<Ev> events;
  std::map<int, std::string> lanes; // tid -> thread_name
};

Trace Parse(const std::string& json) {
  Trace t;
  std::istringstream in(json);
  std::string line;
  const std::regex name("\"name\":\"([^\"]*)\""), cat("\"cat\":\"([^\"]*)\""), ph("\"ph\":\"(.)\""),
      tid("\"tid\":([0-9]+)"), ts("\"ts\":([0-9.]+)"), dur("\"dur\":([0-9.]+)"),
      lane("\"args\":\\{\"name\":\"([^\"]*)\"");
  for (std::getline(in, line); std::getline(in, line);) {
    std::smatch m;
    Ev e;
    e.line = line;
    if (std::regex_search(line, m, name)) e.name = m[1];
    if (std::regex_search(line, m, cat)) e.cat = m[1];
    if (std::regex_search(line, m, ph)) e.ph = m[1];
    if (std::regex_search(line, m, tid)) e.tid = std::stoi(m[1]);
    if (std::regex_search(line, m, ts)) e.ts = std::stod(m[1]);
    if (std::regex_search(line, m, dur)) e.dur = std::stod(m[1]);
    if (e.ph == "M" && e.name == "thread_name" && std::regex_search(line, m, lane)) t.lanes[e.tid] = m[1];
    if (!e.ph.empty()) t.events.push_back(e);
  }
  return t;
}

std::vector<Ev> Named(const Trace& t, const std::string& name) {
  std::vector<Ev> out;
  for (const Ev& e : t.events)
    if (e.name == name) out.push_back(e);
  return out;
}

// Records what `f` does with every category on, and returns the trace (the engine drained).
template <class F> Trace Profile(F&& f) {
  engine::Engine::Get().WaitForAll();
  profiler::Clear();
  profiler::SetRecording(profiler::kAll);
  f();
  engine::Engine::Get().WaitForAll();
  profiler::SetRecording(0);
  Trace t = Parse(profiler::TraceJson());
  profiler::Clear();
  return t;
}

} // namespace

TEST_CASE("profiler: while off, the hooks record nothing") {
  engine::Engine::Get().WaitForAll();
  profiler::SetRecording(0);
  profiler::Clear();
  Tensor a = nd::ones({64, 64});
  Tensor b = nd::matmul(a, a);
  b.WaitToRead();
  coll::BufferSet s;
  std::vector<float> x(8, 1.f), y(8, 2.f);
  s.numel = {8};
  s.ptrs = {x.data(), y.data()};
  coll::HostAllReduce(s, coll::ReduceOp::kSum, {});
  engine::Engine::Get().WaitForAll();
  CHECK(profiler::EventCount() == 0);
  CHECK(profiler::Recording() == 0);
}

TEST_CASE("profiler: engine tasks are named on worker lanes, their queued time apart from their run") {
  engine::Engine& e = engine::Engine::Get();
  if (e.IsNaive()) return; // KILN_ENGINE=naive runs tasks on the caller: nothing waits in a queue
  engine::Var* v = e.NewVar();
  Trace t = Profile([&] {
    engine::TaskOptions o;
    o.name = "prof_slow";
    e.Push([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }, {}, {&v, 1}, o);
    o.name = "prof_after";
    e.Push([] {}, {}, {&v, 1}, o); // waits behind prof_slow for about 20 ms
  });
  e.ReleaseVar(v);
  std::vector<Ev> slow = Named(t, "prof_slow"), after = Named(t, "prof_after");
  REQUIRE(slow.size() == 1);
  REQUIRE(after.size() == 1);
  CHECK(slow[0].ph == "X");
  CHECK(slow[0].cat == "operator");
  CHECK(slow[0].dur >= 15000);               // it ran 20 ms (times are microseconds)
  CHECK(after[0].Arg("queued_us") >= 15000); // and the next one waited meanwhile, not running
  CHECK(after[0].dur < 15000);
  CHECK(after[0].ts >= slow[0].ts + slow[0].dur);
  CHECK(Contains(t.lanes[slow[0].tid], "cpu(0) worker"));
}

TEST_CASE("profiler: a compiled call's steps lie inside the call's event, on its lane") {
  Tensor w = nd::random::normal(0, 0.5, {16, 8}), b = nd::zeros({16});
  Tensor x = nd::random::normal(0, 1, {5, 8});
  std::shared_ptr<CachedGraph> g;
  Trace t = Profile([&] {
    {
      trace::TraceScope scope;
      Tensor in = scope.Input("data", x.shape(), x.dtype(), cpu());
      g = scope.Finish({nd::log_softmax(nd::relu(nd::linear(in, w, b)))});
    }
    for (int i = 0; i < 3; ++i) g->Call({x})[0].WaitToRead();
  });
  std::vector<Ev> calls, steps;
  for (const Ev& e : t.events)
    if (e.cat == "symbolic") (e.Arg("steps") >= 0 ? calls : steps).push_back(e);
  REQUIRE(calls.size() == 3);
  REQUIRE(steps.size() >= 3 * 2);
  for (const Ev& s : steps) {
    bool inside = false;
    for (const Ev& c : calls)
      inside |= c.tid == s.tid && s.ts >= c.ts && s.ts + s.dur <= c.ts + c.dur + 0.002; // printed to 1 ns
    CHECK_MESSAGE(inside, "step " << s.name << " at " << s.ts << " is not inside a call on lane " << s.tid);
  }
  // Compilation: the trace, each pass, the plan, the kernel cache.
  CHECK(Named(t, "trace").size() == 1);
  CHECK(Named(t, "compile forward").size() == 1);
  int passes = 0, cache = 0;
  for (const Ev& e : t.events) {
    passes += e.cat == "compile" && e.name.rfind("pass ", 0) == 0;
    cache += e.cat == "compile" && e.name.rfind("kernel cache", 0) == 0;
  }
  CHECK(passes >= 3);
#if KILN_WITH_CODEGEN
  CHECK(cache >= 1); // the fused relu/log_softmax parts are generated kernels
#endif
  // Memory: the call's outputs come from the CPU allocator.
  CHECK(!Named(t, "memory cpu(0)").empty());
  for (const Ev& m : Named(t, "memory cpu(0)")) CHECK(m.ph == "C");
}

TEST_CASE("profiler: collectives carry their byte counts") {
  std::vector<float> x(1000, 1.f), y(1000, 2.f);
  Trace t = Profile([&] {
    coll::BufferSet s;
    s.numel = {1000};
    s.ptrs = {x.data(), y.data()};
    coll::HostAllReduce(s, coll::ReduceOp::kSum, {});
  });
  std::vector<Ev> ar = Named(t, "allreduce");
  REQUIRE(ar.size() == 1);
  CHECK(ar[0].cat == "collective");
  CHECK(ar[0].Arg("bytes") == 4000);
  CHECK(ar[0].Arg("devices") == 2);
  CHECK(y[0] == 3.f);
}

TEST_CASE("profiler: the trace file is written whole, and a bad path is a FileError") {
  profiler::Clear();
  profiler::Complete(profiler::kOperator, "prof_file", 1000, 2000);
  const std::string path = "prof_test_trace.json";
  profiler::WriteTrace(path);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  CHECK(text.str().rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0) == 0);
  CHECK(Contains(text.str(), "\"name\":\"prof_file\""));
  CHECK(Contains(text.str(), "\n],\"otherData\":{\"max_events\":4000000,\"dropped_events\":0}}\n"));
  CHECK(text.str().substr(text.str().size() - 3) == "}}\n");
  std::remove(path.c_str());
  std::string msg = ErrorOf<FileError>([] { profiler::WriteTrace("/nonexistent-dir/trace.json"); });
  CHECK(Contains(msg, "profiler: cannot write '/nonexistent-dir/trace.json'"));
  CHECK(Contains(msg, "the directory '/nonexistent-dir' does not exist: create it first"));
  profiler::Clear();
}

TEST_CASE("profiler: the aggregate table has count, total, min, max and mean per name") {
  profiler::Clear();
  for (int ms = 1; ms <= 3; ++ms) profiler::Complete(profiler::kOperator, "prof_agg", 0, ms * 1000000);
  profiler::Counter(profiler::kMemory, "memory prof", "bytes_in_use", 2048);
  std::string table = profiler::AggregateTable();
  profiler::Clear();
  CHECK(Contains(table, "operator\n================="));
  CHECK(Contains(table, "Total Count"));
  std::smatch m;
  REQUIRE(std::regex_search(table, m,
                            std::regex("prof_agg +([0-9]+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +([0-9.]+)")));
  CHECK(m[1] == "3");
  CHECK(std::stod(m[2]) == doctest::Approx(6.0)); // milliseconds
  CHECK(std::stod(m[3]) == doctest::Approx(1.0));
  CHECK(std::stod(m[4]) == doctest::Approx(3.0));
  CHECK(std::stod(m[5]) == doctest::Approx(2.0));
  CHECK(Contains(table, "Device Storage"));
  CHECK(std::regex_search(table, std::regex("memory prof +1 +2.0480"))); // kilobytes
}

TEST_CASE("gpu profiler: GPU tasks get device-time spans from events on their stream") {
  KILN_REQUIRE_GPU();
  engine::Engine& e = engine::Engine::Get();
  if (e.IsNaive()) return; // the naive engine synchronizes every GPU task: no stream spans
  engine::Var* v = e.NewVar();
  Trace t = Profile([&] {
    engine::TaskOptions o;
    o.device = gpu(0);
    o.name = "prof_gpu";
    // The task's body returns at once; its stream work (a host function) takes 10 ms.
    e.Push(
        [] {
          gpurt::Get().LaunchHostFunc(
              static_cast<gpurt::Stream>(cuda::CurrentStream()),
              [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }, nullptr);
        },
        {}, {&v, 1}, o);
  });
  e.ReleaseVar(v);
  std::vector<Ev> spans = Named(t, "prof_gpu");
  REQUIRE(spans.size() == 2); // the host side on the stream's worker, the device time on the stream
  const Ev& host = spans[0].cat == "operator" ? spans[0] : spans[1];
  const Ev& device = spans[0].cat == "gpu" ? spans[0] : spans[1];
  CHECK(host.cat == "operator");
  CHECK(device.cat == "gpu");
  CHECK(t.lanes[host.tid] == "gpu(0) compute stream (host)");
  CHECK(t.lanes[device.tid] == "gpu(0) compute stream");
  CHECK(device.dur >= 8000);       // the stream was busy 10 ms
  CHECK(device.ts + 1 >= host.ts); // it cannot start before it was issued
}
