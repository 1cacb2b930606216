// The short paths of tiny eager ops: the engine's task-free inline run (runtime/engine.cc,
// RunInline) and the small-op path of dispatch (frontend/dispatch.cc, TrySameShape). Each must
// fall back to the general path whenever its conditions do not hold, with the same results,
// ordering and errors.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/engine.h"

namespace {

using kiln::Tensor;
using kiln::engine::Engine;
using kiln::engine::TaskOptions;
using kiln::engine::Var;

TaskOptions Inline() {
  TaskOptions o;
  o.name = "inline";
  o.may_run_inline = true;
  return o;
}

void Spin(const std::atomic<bool>& flag) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!flag.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

}  // namespace

TEST_CASE("inline run: a write waits for a running reader, a read for a running writer") {
  auto e = kiln::engine::CreateEngine("threaded");
  Var* v = e->NewVar();
  Var* out = e->NewVar();
  std::atomic<bool> started{false}, release{false};
  std::atomic<int> cell{0};
  TaskOptions slow;
  slow.name = "slow";
  Var* vs[1] = {v};
  e->Push([&] { started = true, Spin(release), cell = 1; }, vs, {}, slow);  // a reader of v
  Spin(started);
  int seen = -1;
  std::thread::id ran_on;
  e->Push([&] { seen = cell.load(), ran_on = std::this_thread::get_id(); }, {}, vs, Inline());  // writes v
  CHECK(seen == -1);  // not run inline: the reader still runs
  release = true;
  e->WaitForVar(v);
  CHECK(seen == 1);
  CHECK(ran_on != std::this_thread::get_id());

  // A writer running on v: an inline reader of v is queued behind it.
  started = false, release = false;
  e->Push([&] { started = true, Spin(release), cell = 2; }, {}, vs, slow);
  Spin(started);
  Var* outs[1] = {out};
  e->Push([&] { seen = cell.load(); }, vs, outs, Inline());
  CHECK(seen == 1);
  release = true;
  e->WaitForVar(out);
  CHECK(seen == 2);
  e->WaitForAll();
  kiln::engine::EngineStats s = e->Stats();
  CHECK(s.pushed == s.completed);
  CHECK(s.pending == 0);
  e->ReleaseVar(v), e->ReleaseVar(out);
}

TEST_CASE("inline run: tasks pushed by another thread during it wait for it") {
  auto e = kiln::engine::CreateEngine("threaded");
  Var* v = e->NewVar();
  Var* vs[1] = {v};
  std::atomic<bool> inside{false}, pushed{false};
  std::atomic<int> cell{0};
  int seen = -1;
  std::thread other;
  e->Push([&] {
    inside = true;
    other = std::thread([&] {
      TaskOptions o;
      o.name = "reader";
      Var* out[1] = {e->NewVar()};
      e->Push([&] { seen = cell.load(); }, vs, out, o);  // must see the inline task's write
      pushed = true;
      e->ReleaseVar(out[0]);
    });
    Spin(pushed);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cell = 5;
  }, {}, vs, Inline());
  CHECK(inside);
  other.join();
  e->WaitForAll();
  CHECK(seen == 5);
  e->ReleaseVar(v);
}

TEST_CASE("inline run: in-place updates, duplicates and errors follow the general rules") {
  auto e = kiln::engine::CreateEngine("threaded");
  Var* v = e->NewVar();
  Var* w = e->NewVar();
  int x = 1;
  Var* vv[2] = {v, v};
  e->Push([&] { x += 1; }, vv, vv, Inline());  // listed twice on both sides: one write
  CHECK(x == 2);
  Var* ws[1] = {w};
  Var* vs[1] = {v};
  e->Push([] { KILN_THROW(ValueError) << "inline failure"; }, {}, vs, Inline());
  CHECK_THROWS_WITH_AS(e->WaitForVar(v), doctest::Contains("inline failure"), kiln::ValueError);
  bool ran = false;
  e->Push([&] { ran = true; }, vs, ws, Inline());  // reads a failed variable: skipped, error passed on
  CHECK(!ran);
  CHECK_THROWS_WITH_AS(e->WaitForVar(w), doctest::Contains("inline failure"), kiln::ValueError);
  CHECK_THROWS(e->WaitForAll());
  e->Push([&] { ran = true; }, {}, vs, Inline());  // a fresh write clears the error
  CHECK(ran);
  CHECK_NOTHROW(e->WaitForVar(v));
  e->ReleaseVar(v), e->ReleaseVar(w);
}

TEST_CASE("small-op path: same results as the general path, which handles everything else") {
  Tensor a = Tensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::FromVector<float>({4, 3, 2, 1}, {2, 2});
  for (int i = 0; i < 2; ++i) {  // the first call teaches the table, the second takes the path
    CHECK(kiln::nd::add(a, b).ToVector<float>() == std::vector<float>{5, 5, 5, 5});
    Tensor lt = kiln::nd::less(a, b);
    CHECK(lt.dtype() == kiln::DType::kBool);
    CHECK(lt.ToVector<bool>() == std::vector<bool>{true, true, false, false});
    CHECK(kiln::nd::multiply(a, 2.0).ToVector<float>() == std::vector<float>{2, 4, 6, 8});  // 0-d operand
    CHECK(kiln::nd::relu(kiln::nd::negative(a)).ToVector<float>() == std::vector<float>{0, 0, 0, 0});
  }
  Tensor row = Tensor::FromVector<float>({10, 20}, {2});
  CHECK(kiln::nd::add(a, row).ToVector<float>() == std::vector<float>{11, 22, 13, 24});  // broadcast
  Tensor c = Tensor::FromVector<float>({1, 2, 3}, {3});
  CHECK_THROWS_WITH_AS(kiln::nd::add(a, c), doctest::Contains("add"), kiln::ShapeError);
  Tensor i = Tensor::FromVector<int32_t>({1, 2, 3, 4}, {2, 2});
  CHECK(kiln::nd::add(a, i).dtype() == kiln::DType::kFloat32);  // promotion
  Tensor other = Tensor::FromVector<float>({1, 2, 3, 4}, {2, 2}, kiln::cpu(1));
  CHECK_THROWS_AS(kiln::nd::add(a, other), kiln::DeviceError);
  Tensor t = kiln::nd::transpose(a);  // strided input: the kernel sees the right elements
  CHECK(kiln::nd::add(t, b).ToVector<float>() == std::vector<float>{5, 6, 4, 5});
  CHECK_THROWS_AS(kiln::Invoke1("add", {a, Tensor()}), kiln::ValueError);
  CHECK_THROWS_WITH(kiln::Invoke1("add", {a, a, a}), doctest::Contains("add"));  // arity: general path
  CHECK_THROWS_WITH(kiln::Invoke1("add", {a}), doctest::Contains("add"));
}

TEST_CASE("small-op path: autograd records as the general path does") {
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor y = Tensor::FromVector<float>({4, 5, 6}, {3});
  (void)kiln::nd::multiply(x, y);
  x.AttachGrad();
  Tensor z;
  {
    kiln::autograd::RecordScope record;
    z = kiln::nd::add(kiln::nd::multiply(x, y), x);
  }
  z.Backward();
  CHECK(x.grad().ToVector<float>() == std::vector<float>{5, 6, 7});
}

TEST_CASE("small-op path: four threads read shared tensors while one rewrites them in place") {
  Tensor shared = Tensor::FromVector<float>({1, 1, 1, 1}, {4});
  Tensor ones = Tensor::FromVector<float>({1, 1, 1, 1}, {4});
  constexpr int kThreads = 4, kIters = 3000;
  std::vector<Tensor> acc(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Tensor c = Tensor::FromVector<float>({0, 0, 0, 0}, {4});
      for (int i = 0; i < kIters; ++i) {
        c = kiln::nd::add(c, shared);  // inline when `shared` is idle, queued behind its writer if not
        if (t == 0 && i % 7 == 0) {    // rewrite `shared` with the same values: a writer among readers
          const Tensor* in[2] = {&ones, &ones};
          Tensor two = kiln::Invoke1(kiln::ir::FindOp("add"), in);
          const Tensor src[1] = {kiln::nd::subtract(two, ones)};
          const Tensor dst[1] = {shared};
          kiln::InvokeInto(kiln::ir::FindOp("copy"), src, {}, dst);
        }
      }
      acc[t] = c;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    CHECK(acc[t].ToVector<float>() == std::vector<float>(4, static_cast<float>(kIters)));
  CHECK_NOTHROW(Engine::Get().WaitForAll());
  CHECK(Engine::Get().Stats().pending == 0);
}
