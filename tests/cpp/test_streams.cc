// Stream assignment (passes/stream_assignment.h): independent branches go to separate streams,
// chains stay on one, memory reuse becomes a dependency; the executor (runtime/executor.h) keeps
// every dependency while running streams as lanes concurrently, and issues its work to a Lanes
// implementation in step order.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kiln/passes/stream_assignment.h"
#include "kiln/runtime/executor.h"

using Schedule = kiln::passes::StreamSchedule;
using Step = kiln::passes::StreamStep;
using Buffer = kiln::passes::ArenaBlock;

namespace {
Schedule Assign(const std::vector<Step>& steps, int max_streams) { return kiln::passes::AssignStreams(steps, max_streams); }

kiln::exec::LaneSchedule Lanes(const Schedule& s) { return {s.num_streams, s.stream, s.waits, s.lists}; }
}  // namespace

namespace {

// Every dependency of every step is satisfied by the schedule: same stream and earlier, or a
// wait on it (or on a later step of its stream).
void CheckValid(const std::vector<Step>& steps, const Schedule& s) {
  std::vector<int> pos(steps.size());
  for (const auto& list : s.lists)
    for (size_t k = 0; k < list.size(); ++k) pos[static_cast<size_t>(list[k])] = static_cast<int>(k);
  for (size_t i = 0; i < steps.size(); ++i)
    for (int d : steps[i].deps) {
      if (s.stream[static_cast<size_t>(d)] == s.stream[i]) {
        CHECK(pos[static_cast<size_t>(d)] < pos[i]);
        continue;
      }
      bool covered = false;
      for (int w : s.waits[i])
        covered |= s.stream[static_cast<size_t>(w)] == s.stream[static_cast<size_t>(d)] && w >= d;
      CHECK_MESSAGE(covered, "step " << i << " does not wait for step " << d);
    }
}

}  // namespace

TEST_CASE("streams: a chain stays on one stream") {
  std::vector<Step> steps = {{{}, 1}, {{0}, 1}, {{1}, 1}, {{2}, 1}};
  Schedule s = Assign(steps, 4);
  CHECK(s.num_streams == 1);
  CHECK(s.critical == doctest::Approx(4));
  CheckValid(steps, s);
}

TEST_CASE("streams: two independent branches run on two streams and join") {
  // 0 -> 1 -> 2 and 3 -> 4 -> 5, then 6 reads 2 and 5
  std::vector<Step> steps = {{{}, 2}, {{0}, 2}, {{1}, 2}, {{}, 2}, {{3}, 2}, {{4}, 2}, {{2, 5}, 1}};
  Schedule s = Assign(steps, 2);
  CHECK(s.num_streams == 2);
  CHECK(s.stream[0] == s.stream[1]);
  CHECK(s.stream[1] == s.stream[2]);
  CHECK(s.stream[3] == s.stream[4]);
  CHECK(s.stream[0] != s.stream[3]);
  CHECK(s.waits[6].size() == 1);  // joins the other branch with one wait
  CHECK(s.critical == doctest::Approx(7));
  CHECK(s.total == doctest::Approx(13));
  CheckValid(steps, s);
}

TEST_CASE("streams: at most max_streams, balanced by cost") {
  std::vector<Step> steps;
  for (int i = 0; i < 6; ++i) steps.push_back({{}, 1});
  Schedule s = Assign(steps, 2);
  CHECK(s.num_streams == 2);
  CHECK(s.lists[0].size() == 3);
  CHECK(s.lists[1].size() == 3);
  CHECK(s.critical == doctest::Approx(3));
  Schedule one = Assign(steps, 1);
  CHECK(one.num_streams == 1);
  CHECK(one.critical == doctest::Approx(6));
}

TEST_CASE("streams: memory reuse orders the reusing writer after the earlier buffer's users") {
  // a (step 0) read by step 2; b (step 1) reuses a's bytes after a died: without the rule 1 could
  // run beside 0 or 2 on another stream and overwrite a.
  std::vector<Step> steps = {{{}, 1}, {{}, 1}, {{0}, 1}, {{1, 2}, 1}};
  std::vector<Buffer> bufs = {{0, 64, 0, {2}}, {32, 96, 1, {3}}, {128, 192, 2, {3}}};
  kiln::passes::AddReuseDeps(bufs, steps);
  CHECK(steps[1].deps == std::vector<int>{0});  // only earlier steps: 2 comes later in the plan
  std::vector<Buffer> disjoint = {{0, 64, 0, {2}}, {64, 128, 1, {3}}};
  std::vector<Step> fresh = {{{}, 1}, {{}, 1}, {{0}, 1}, {{1, 2}, 1}};
  kiln::passes::AddReuseDeps(disjoint, fresh);
  CHECK(fresh[1].deps.empty());
}

TEST_CASE("streams: the executor keeps every dependency while streams run concurrently") {
  // A diamond lattice of 200 steps; each step records when it ran.
  std::vector<Step> steps;
  for (int i = 0; i < 200; ++i) {
    Step st;
    st.cost = 1;
    if (i >= 2) st.deps.push_back(i - 2);
    if (i % 10 == 9) st.deps.push_back(i - 1);
    steps.push_back(st);
  }
  Schedule s = Assign(steps, kiln::exec::CpuLanes().MaxLanes());
  CHECK(s.num_streams >= 2);
  std::vector<std::atomic<int>> order(steps.size());
  std::atomic<int> clock{0};
  std::mutex mu;
  std::vector<std::thread::id> ran_on(steps.size());
  kiln::exec::RunLanes(Lanes(s), [&](int i) {
    for (int d : steps[static_cast<size_t>(i)].deps) CHECK(order[static_cast<size_t>(d)].load() > 0);
    std::lock_guard<std::mutex> g(mu);
    ran_on[static_cast<size_t>(i)] = std::this_thread::get_id();
    order[static_cast<size_t>(i)].store(++clock);
  });
  for (auto& o : order) CHECK(o.load() > 0);
  bool two_threads = false;
  for (auto& id : ran_on) two_threads |= id != ran_on[0];
  CHECK(two_threads);
}

TEST_CASE("streams: an error in one stream stops the others and reaches the caller") {
  std::vector<Step> steps;
  for (int i = 0; i < 40; ++i) steps.push_back({i >= 2 ? std::vector<int>{i - 2} : std::vector<int>{}, 1});
  Schedule s = Assign(steps, 2);
  REQUIRE(s.num_streams == 2);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(kiln::exec::RunLanes(Lanes(s), [&](int i) {
    ++ran;
    if (i == 7) throw std::runtime_error("kernel 7 failed");
  }), "kernel 7 failed", std::runtime_error);
  CHECK(ran.load() < 40);
  // and the pool is usable again
  std::atomic<int> again{0};
  kiln::exec::RunLanes(Lanes(s), [&](int) { ++again; });
  CHECK(again.load() == 40);
}

namespace {
// A Lanes implementation that logs what the executor issues and runs it in issue order.
class LoggingLanes final : public kiln::exec::Lanes {
 public:
  std::vector<std::string> log;
  int MaxLanes() const override { return 3; }
  bool Begin(int num_lanes, int num_steps, const std::function<void(int)>& launch) override {
    log.push_back("begin " + std::to_string(num_lanes) + " " + std::to_string(num_steps));
    launch_ = &launch;
    return true;
  }
  void Wait(int lane, int event) override { log.push_back(std::to_string(lane) + " wait " + std::to_string(event)); }
  void Launch(int lane, int step) override {
    log.push_back(std::to_string(lane) + " launch " + std::to_string(step));
    (*launch_)(step);
  }
  void Record(int lane, int event) override { log.push_back(std::to_string(lane) + " record " + std::to_string(event)); }
  void Finish() override { log.push_back("finish"); }

 private:
  const std::function<void(int)>* launch_ = nullptr;
};
}  // namespace

TEST_CASE("lanes: the executor issues waits, launches and records in step order") {
  // 0 -> 1 and 2 -> 3 on two lanes, 4 joins both.
  std::vector<Step> steps = {{{}, 2}, {{0}, 2}, {{}, 2}, {{2}, 2}, {{1, 3}, 1}};
  Schedule s = Assign(steps, 2);
  REQUIRE(s.num_streams == 2);
  LoggingLanes lanes;
  std::vector<int> ran;
  kiln::exec::RunLanes(Lanes(s), [&](int i) { ran.push_back(i); }, lanes);
  const std::string a = std::to_string(s.stream[0]), b = std::to_string(s.stream[2]);
  const std::string join = std::to_string(s.stream[4]), other = s.stream[4] == s.stream[0] ? "3" : "1";
  std::vector<std::string> expected = {"begin 2 5", a + " launch 0", a + " launch 1"};
  if (other == "1") expected.push_back(a + " record 1");
  expected.insert(expected.end(), {b + " launch 2", b + " launch 3"});
  if (other == "3") expected.push_back(b + " record 3");
  expected.insert(expected.end(), {join + " wait " + other, join + " launch 4", "finish"});
  CHECK(lanes.log == expected);
  CHECK(ran == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("lanes: a busy Lanes runs the steps in order on the calling thread") {
  struct Busy final : kiln::exec::Lanes {
    int MaxLanes() const override { return 2; }
    bool Begin(int, int, const std::function<void(int)>&) override { return false; }
    void Wait(int, int) override { FAIL("wait issued to busy lanes"); }
    void Launch(int, int) override { FAIL("launch issued to busy lanes"); }
    void Record(int, int) override { FAIL("record issued to busy lanes"); }
    void Finish() override { FAIL("finish on busy lanes"); }
  } busy;
  std::vector<Step> steps = {{{}, 1}, {{}, 1}, {{0}, 1}, {{1}, 1}};
  Schedule s = Assign(steps, 2);
  REQUIRE(s.num_streams == 2);
  std::vector<int> ran;
  std::thread::id self = std::this_thread::get_id();
  kiln::exec::RunLanes(Lanes(s), [&](int i) {
    CHECK(std::this_thread::get_id() == self);
    ran.push_back(i);
  }, busy);
  CHECK(ran == std::vector<int>{0, 1, 2, 3});
}

// ---- compiled plans ------------------------------------------------------------------------------

#include <cmath>
#include <random>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "test_util.h"

namespace {

using kiln::Shape;
using kiln::Tensor;
namespace nd = kiln::nd;

// A random DAG of matmuls, elementwise ops and reductions over `branches` independent inputs of
// shape (n, n), joined at the end: memory gets reused across branches, and branches run side by
// side when streams run concurrently.
std::vector<Tensor> RandomProgram(std::mt19937& rng, const std::vector<Tensor>& in, int nodes) {
  std::vector<Tensor> vals = in;
  for (int k = 0; k < nodes; ++k) {
    auto pick = [&] { return vals[std::uniform_int_distribution<size_t>(0, vals.size() - 1)(rng)]; };
    // Prefer recent values: long chains per branch, with occasional cross links.
    auto recent = [&] {
      size_t lo = vals.size() > 4 ? vals.size() - 4 : 0;
      return vals[std::uniform_int_distribution<size_t>(lo, vals.size() - 1)(rng)];
    };
    Tensor a = rng() % 3 ? recent() : pick();
    switch (rng() % 6) {
      case 0: vals.push_back(nd::tanh(nd::matmul(a, pick()))); break;
      case 1: vals.push_back(nd::add(a, pick())); break;
      case 2: vals.push_back(nd::multiply(nd::exp(nd::multiply(a, 0.1)), 0.5)); break;
      case 3: vals.push_back(nd::relu(nd::subtract(a, 0.25))); break;
      case 4: vals.push_back(nd::add(a, nd::sum(a, {1}, true))); break;
      default: vals.push_back(nd::sigmoid(a)); break;
    }
  }
  // Every value nobody read yet is an output, so nothing is dead.
  return {vals.end() - std::min<std::ptrdiff_t>(3, static_cast<std::ptrdiff_t>(vals.size())), vals.end()};
}

std::shared_ptr<kiln::CachedGraph> TraceRandom(uint32_t seed, int branches, int64_t n, int nodes) {
  std::mt19937 rng(seed);
  kiln::trace::TraceScope scope;
  std::vector<Tensor> in;
  for (int b = 0; b < branches; ++b)
    in.push_back(scope.Input(std::string(1, static_cast<char>('a' + b)), Shape{n, n}, kiln::DType::kFloat32, kiln::cpu()));
  return scope.Finish(RandomProgram(rng, in, nodes));
}

struct ForceConcurrent {  // every plan with two streams runs them concurrently
  double saved = kiln::passes::MinConcurrentWork();
  ForceConcurrent() { kiln::passes::MinConcurrentWork() = 0, kiln::exec::AlwaysConcurrent() = true; }
  ~ForceConcurrent() { kiln::passes::MinConcurrentWork() = saved, kiln::exec::AlwaysConcurrent() = false; }
};

}  // namespace

TEST_CASE("streams: random compiled graphs give the same results with streams concurrent") {
  int concurrent_plans = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    int branches = 2 + static_cast<int>(seed % 3);
    int64_t n = 8 + (seed % 5) * 9;
    std::shared_ptr<kiln::CachedGraph> serial, concurrent;
    {
      kiln::testing::ScopedEnv off("KILN_DISABLE_PASS", "streams");
      serial = TraceRandom(seed, branches, n, 14);
    }
    ForceConcurrent force;  // planned and run concurrently
    concurrent = TraceRandom(seed, branches, n, 14);
    kiln::CompileReport rs = serial->compile_report(), rc = concurrent->compile_report();
    REQUIRE(rs.plans.size() == 1);
    CHECK(rs.plans[0].streams == 1);
    CHECK_FALSE(rs.plans[0].concurrent);
    concurrent_plans += rc.plans[0].concurrent;
    std::vector<Tensor> in;
    for (int b = 0; b < branches; ++b) in.push_back(nd::random::uniform(-1, 1, Shape{n, n}));
    for (int rep = 0; rep < 3; ++rep) {  // the arena is reused between calls too
      std::vector<Tensor> want = serial->Call(in), got = concurrent->Call(in);
      REQUIRE(want.size() == got.size());
      for (size_t o = 0; o < want.size(); ++o) {
        std::vector<float> w = want[o].ToVector<float>(), g = got[o].ToVector<float>();
        for (size_t i = 0; i < w.size(); ++i)
          if (w[i] != g[i] && !(std::abs(w[i] - g[i]) <= 1e-5f * (1 + std::abs(w[i]))) && !(std::isnan(w[i]) && std::isnan(g[i]))) {
            FAIL_CHECK("output " << o << " element " << i << ": serial " << w[i] << ", concurrent " << g[i]);
            break;
          }
      }
    }
  }
  CHECK(concurrent_plans >= 30);  // the comparison is not serial against serial
}

TEST_CASE("streams: a small plan stays serial by default and reports its streams") {
  std::shared_ptr<kiln::CachedGraph> g = TraceRandom(7, 2, 8, 6);
  kiln::CompileReport r = g->compile_report();
  CHECK_FALSE(r.plans[0].concurrent);  // far below the work that pays for a hand-off
  CHECK(r.str().find("streams: ") != std::string::npos);
}

TEST_CASE("streams: on a CPU, branches whose concurrent memory layout needs much more arena run serially") {
  // Two branches, one after the other in the graph, each holding four matmul outputs until it
  // reduces their product. Serially the second branch reuses the first one's blocks; run concurrently, each
  // stream keeps the blocks it freed for itself. At 2048 x 2048 (16 MiB a value) that costs more
  // than an eighth of the serial arena and more than 16 MiB, so the plan runs the branches one
  // after another; at 64 x 64 it does not.
  auto trace = [](int64_t n) {
    kiln::trace::TraceScope scope;
    auto branch = [&](const Tensor& a) {
      std::vector<Tensor> xs = {nd::tanh(nd::matmul(a, a))};
      for (int k = 0; k < 3; ++k) xs.push_back(nd::tanh(nd::matmul(xs.back(), a)));
      return nd::sum(nd::multiply(nd::multiply(xs[0], xs[1]), nd::multiply(xs[2], xs[3])), {}, false);
    };
    Tensor a = scope.Input("a", Shape{n, n}, kiln::DType::kFloat32, kiln::cpu());
    Tensor b = scope.Input("b", Shape{n, n}, kiln::DType::kFloat32, kiln::cpu());
    Tensor sa = branch(a), sb = branch(b);
    return scope.Finish({nd::add(sa, sb)});
  };
  ForceConcurrent force;
  kiln::CompileReport big = trace(2048)->compile_report(), small = trace(64)->compile_report();
  REQUIRE(big.plans.size() == 1);
  CHECK(big.plans[0].streams >= 2);  // as many as the machine's threads allow: 2 here, 4 on 16 cores
  CHECK_FALSE(big.plans[0].concurrent);
  CHECK(big.plans[0].concurrent_extra_bytes > (size_t{16} << 20));
  CHECK(big.str().find("needs") != std::string::npos);
  CHECK(small.plans[0].concurrent);
  CHECK(small.plans[0].concurrent_extra_bytes == 0);
}
