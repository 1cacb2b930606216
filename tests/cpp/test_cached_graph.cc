// Hybridize's machinery: a traced graph runs compiled with the same results, forward and
// gradients, as eager execution of the same code; captured parameters are read live; in-place
// copies into captured tensors (batch norm statistics) happen on every call; reading a symbolic
// tensor is refused. The compile report names passes and fused groups and counts kernels, bytes
// and memory; elementwise outputs run in place, other ops never do. A frozen graph computes its
// parameter expressions once and keeps the values it was compiled with.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/engine.h"
#include "test_util.h"

namespace {

using namespace kiln;
using kiln::testing::ScopedEnv;
using kiln::testing::ErrorOf;
using kiln::testing::Contains;

void CheckClose(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(y[i]).epsilon(tol));
}

// A small MLP with a softmax cross-entropy head: the kind of block users hybridize.
struct Mlp {
  Tensor w1 = nd::random::normal(0, 0.5, {16, 8}), b1 = nd::random::normal(0, 0.1, {16});
  Tensor w2 = nd::random::normal(0, 0.5, {4, 16}), b2 = nd::zeros({4});
  Tensor operator()(const Tensor& x) const {
    Tensor h = nd::relu(nd::linear(x, w1, b1));
    return nd::log_softmax(nd::linear(h, w2, b2));
  }
};

std::shared_ptr<CachedGraph> Trace(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& examples) {
  trace::TraceScope scope;
  std::vector<Tensor> in;
  for (size_t i = 0; i < examples.size(); ++i)
    in.push_back(scope.Input("data" + std::to_string(i), examples[i].shape(), examples[i].dtype(), cpu()));
  return scope.Finish(f(in));
}

TEST_CASE("hybridize: a traced MLP runs compiled with the eager results") {
  Mlp net;
  Tensor x = nd::random::normal(0, 1, {5, 8});
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{net(in[0])}; }, {x});
  CHECK(g->num_data_inputs() == 1);
  CHECK(g->captured().size() == 4);  // the four parameters
  CheckClose(g->Call({x})[0], net(x));
  // Parameters are read on every call, not frozen at trace time.
  (net.w2 * 2.0).CopyTo(net.w2);
  CheckClose(g->Call({x})[0], net(x));
  // Another batch of the same shape.
  Tensor x2 = nd::random::normal(0, 1, {5, 8});
  CheckClose(g->Call({x2})[0], net(x2));
}

TEST_CASE("hybridize: gradients through a compiled call equal eager gradients") {
  Mlp net;
  Tensor x = nd::random::normal(0, 1, {5, 8});
  Tensor y = Tensor::FromVector<int64_t>({0, 1, 2, 3, 0}, {5});
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{net(in[0])}; }, {x});
  std::vector<Tensor*> params = {&net.w1, &net.b1, &net.w2, &net.b2};
  auto grads = [&](bool compiled) {
    for (Tensor* p : params) p->AttachGrad();
    {
      autograd::RecordScope record;
      Tensor out = compiled ? g->Call({x})[0] : net(x);
      Tensor loss = nd::mean(nd::negative(nd::sum(nd::multiply(out, nd::one_hot(y, 4)), {1})));
      loss.Backward();
    }
    std::vector<Tensor> gs;
    for (Tensor* p : params) gs.push_back(p->grad().To(cpu(), true));
    return gs;
  };
  std::vector<Tensor> eager = grads(false), compiled = grads(true);
  for (size_t i = 0; i < eager.size(); ++i) CheckClose(compiled[i], eager[i], 1e-4);
}

TEST_CASE("hybridize: intermediates share an arena planned by liveness") {
  // A chain of 6 elementwise ops on 1024 floats: at most two intermediates live at once.
  Tensor x = nd::random::normal(0, 1, {1024});
  auto f = [](const Tensor& a) {
    Tensor t = a;
    for (int i = 0; i < 6; ++i) t = nd::add(nd::tanh(t), 1.0);
    return t;
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x});
  CHECK(g->arena_bytes() <= 2 * 1024 * sizeof(float));
  CheckClose(g->Call({x})[0], f(x));
#if KILN_WITH_CODEGEN
  // The whole chain (tanh, add with a scalar, six times) is one generated kernel.
  CHECK(g->num_fused_groups() == 1);
  CHECK(g->num_fused_ops() == 12);
#endif
}

TEST_CASE("hybridize: a full constant of any shape is built into the fused kernel, never materialized") {
  Tensor x = nd::random::normal(0, 1, {4, 256});
  auto f = [](const Tensor& a) { return nd::relu(nd::add(nd::multiply(a, nd::full({4, 256}, 3.0)), nd::ones({256}))); };
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x});
  CheckClose(g->Call({x})[0], f(x));
#if KILN_WITH_CODEGEN
  CHECK(g->num_fused_groups() == 1);
  CHECK(g->arena_bytes() == 0);  // neither fill exists in memory
#endif
}

TEST_CASE("hybridize: KILN_DISABLE_PASS=fusion runs every op unfused, with the same result") {
  Tensor x = nd::random::normal(0, 1, {1024});
  auto f = [](const Tensor& a) { return nd::multiply(nd::relu(nd::add(nd::tanh(a), 1.0)), a); };
  auto trace = [&] { return Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x}); };
  std::shared_ptr<CachedGraph> unfused;
  {
    ScopedEnv env("KILN_DISABLE_PASS", "fusion");
    unfused = trace();
  }
  CHECK(unfused->num_fused_groups() == 0);
  CheckClose(unfused->Call({x})[0], f(x));
#if KILN_WITH_CODEGEN
  CHECK(trace()->num_fused_groups() == 1);
#endif
  ScopedEnv typo("KILN_DISABLE_PASS", "fuson");
  CHECK(Contains(ErrorOf<ValueError>([&] { trace(); }), "did you mean 'fusion'?"));
}

TEST_CASE("hybridize: copies into captured tensors happen on every call") {
  Tensor running = nd::zeros({3});
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  auto g = Trace([&](const std::vector<Tensor>& in) {
    nd::add(running, in[0]).CopyTo(running);  // running += x, as batch norm updates its statistics
    return std::vector<Tensor>{nd::multiply(in[0], 2.0)};
  }, {x});
  CHECK(running.ToVector<float>() == std::vector<float>{0, 0, 0});  // tracing ran nothing
  CHECK(g->Call({x})[0].ToVector<float>() == std::vector<float>{2, 4, 6});
  g->Call({x});
  CHECK(running.ToVector<float>() == std::vector<float>{2, 4, 6});
}

TEST_CASE("hybridize: reading a symbolic tensor while tracing is refused") {
  trace::TraceScope scope;
  Tensor s = scope.Input("data", {2}, DType::kFloat32, cpu());
  Tensor y = nd::exp(s);
  CHECK(trace::IsSymbolic(y));
  CHECK_THROWS_WITH_AS(y.ToVector<float>(), doctest::Contains("symbolic tensor of a hybridized block"), StateError);
  CHECK_THROWS_AS(nd::sum(y).Item(), StateError);
}

TEST_CASE("hybridize: random ops draw fresh values on every call") {
  Tensor x = nd::ones({256});
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{nd::dropout(in[0], 0.5, true)}; },
                 {x});
  std::vector<float> a = g->Call({x})[0].ToVector<float>(), b = g->Call({x})[0].ToVector<float>();
  CHECK(a != b);
  for (float v : a) CHECK((v == 0.f || v == 2.f));
}

TEST_CASE("hybridize: a call with the wrong input shape is a ShapeError naming both shapes") {
  Tensor x = nd::ones({4, 8});
  Mlp net;
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{net(in[0])}; }, {x});
  CHECK_THROWS_WITH_AS(g->Call({nd::ones({3, 8})}), doctest::Contains("(3, 8)"), ShapeError);
}

}  // namespace

namespace {

TEST_CASE("hybridize: the traced graph of a dense layer, golden text") {
  Tensor w = nd::ones({3, 4}), b = nd::zeros({3});
  trace::TraceScope scope;
  Tensor x = scope.Input("data", {2, 4}, DType::kFloat32, cpu());
  auto g = scope.Finish({nd::relu(nd::linear(x, w, b))});
  CHECK(g->graph().str() ==
        "%0 = input \"data\" : float32(2, 4)\n"
        "%1 = input \"captured0\" : float32(3, 4)\n"
        "%2 = input \"captured1\" : float32(3,)\n"
        "%3 = matmul(%0, %1) {transpose_a=false, transpose_b=true} : float32(2, 3)\n"
        "%4 = add(%3, %2) : float32(2, 3)\n"
        "%5 = relu(%4) : float32(2, 3)\n"
        "return %5\n");
}

}  // namespace

namespace {

TEST_CASE("hybridize: a bias add and its activation fuse, the bias read by broadcast") {
  // conv-style bias (C, 1, 1) over NCHW and a dense-style bias (N,) over rows.
  Tensor x = nd::random::normal(0, 1, {2, 3, 4, 5}), cb = nd::random::normal(0, 1, {3, 1, 1});
  Tensor y = nd::random::normal(0, 1, {6, 7}), db = nd::random::normal(0, 1, {7});
  auto f = [&](const Tensor& a, const Tensor& b) {
    return std::vector<Tensor>{nd::relu(nd::add(a, cb)), nd::tanh(nd::add(b, db))};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return f(in[0], in[1]); }, {x, y});
  std::vector<Tensor> got = g->Call({x, y}), want = f(x, y);
  CheckClose(got[0], want[0]);
  CheckClose(got[1], want[1]);
#if KILN_WITH_CODEGEN
  CHECK(g->num_fused_groups() == 2);
  CHECK(g->num_fused_ops() == 4);
#endif
}

}  // namespace

namespace {

using Names = std::vector<std::string>;

Names PassNames(const CompileReport::PlanReport& p) {
  Names names;
  for (const passes::PassRecord& r : p.pipeline.passes) names.push_back(r.name);
  return names;
}

Names DefaultPipelineNames() {
  Names names;
  for (const passes::Pass& p : passes::DefaultPipeline()) names.push_back(p.name);
  return names;
}

Names PlanNames(const CompileReport& r) {
  Names names;
  for (const CompileReport::PlanReport& p : r.plans) names.push_back(p.name);
  return names;
}

// tanh, add, relu, mul fuse; the sum after them does not.
Tensor FusableChain(const Tensor& a) { return nd::sum(nd::multiply(nd::relu(nd::add(nd::tanh(a), 1.0)), a)); }

TEST_CASE("compile report: passes, the fused group by op name, fewer kernels and bytes, the arena") {
  Tensor x = nd::random::normal(0, 1, {1024});
  auto g = Trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{FusableChain(in[0])}; }, {x});
  CompileReport r = g->compile_report();
  REQUIRE(PlanNames(r) == Names{"forward"});
  const CompileReport::PlanReport& p = r.plans[0];
  CHECK(p.pipeline_ran);
  CHECK(PassNames(p) == DefaultPipelineNames());
  CHECK(p.kernels_before == 6);  // tanh, full, add, relu, mul, sum
  CHECK(p.arena_bytes <= p.unshared_bytes);
  CHECK(p.total_ms() > 0);
  std::string text = r.str();
  CHECK(Contains(text, "simplify: unchanged, 6 -> 6 nodes"));
  CHECK(Contains(text, "arena"));
#if KILN_WITH_CODEGEN
  CHECK(p.fusion == "1 group of 4 ops");
  REQUIRE(p.groups.size() == 1);
  CHECK(p.groups[0].ops == Names{"tanh", "add", "relu", "mul"});
  CHECK(p.groups[0].num_inputs == 1);
  CHECK(p.groups[0].expr == "mul(relu(add(tanh(in0), 1)), in0)");
  CHECK(p.kernels_after == 2);  // the group (the constant is built into it) and the sum
  CHECK(p.bytes_after < p.bytes_before);
  CHECK(p.arena_bytes == 1024 * sizeof(float));  // the group's result, read by the sum
  REQUIRE(!p.codegen_cache.empty());
  CHECK(p.codegen_cache[0].first == "compiled");
  int64_t lookups = 0;  // compiled now, or found in a cache
  for (const auto& [name, count] : p.codegen_cache) lookups += count;
  CHECK(lookups == 1);
  CHECK(Contains(text, "fusion: 1 group of 4 ops"));
  CHECK(Contains(text, "group 0: tanh, add, relu, mul -> 1 kernel (in0), 4 ops"));
  CHECK(Contains(text, "mul(relu(add(tanh(in0), 1)), in0)"));
  CHECK(Contains(text, "kernels: 6 before fusion, 2 after"));
#else
  CHECK(p.fusion == "unavailable (built without LLVM)");
  CHECK(p.kernels_after == p.kernels_before);
  CHECK(Contains(text, "fusion: unavailable (built without LLVM)"));
#endif
  CheckClose(g->Call({x})[0], FusableChain(x), 1e-4);
}

TEST_CASE("compile report: with KILN_DISABLE_PASS=fusion nothing is fused and nothing moves less") {
  Tensor x = nd::random::normal(0, 1, {1024});
  ScopedEnv env("KILN_DISABLE_PASS", "fusion");
  auto g = Trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{FusableChain(in[0])}; }, {x});
  const CompileReport::PlanReport p = g->compile_report().plans.at(0);
  CHECK(p.groups.empty());
  CHECK(p.kernels_after == p.kernels_before);
  CHECK(p.bytes_after == p.bytes_before);
  CHECK(p.arena_bytes <= p.unshared_bytes);
#if KILN_WITH_CODEGEN
  CHECK(p.fusion == "disabled");
  CHECK(Contains(g->compile_report().str(), "fusion: disabled"));
#endif
  CheckClose(g->Call({x})[0], FusableChain(x), 1e-4);
}

TEST_CASE("compile report: training adds its forward and backward, a backward built on use is added") {
  Tensor x = nd::random::normal(0, 1, {5, 8});
  Mlp net;
  auto inner = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{net(in[0])}; }, {x});
  // Called inside another trace, `inner` is a call_graph node whose gradient is its own backward
  // plan, built the first time the outer graph's training backward runs.
  auto outer = Trace([&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{nd::multiply(inner->Call({in[0]})[0], 2.0)};
  }, {x});
  CHECK(PlanNames(inner->compile_report()) == Names{"forward"});
  net.w1.AttachGrad();
  {
    autograd::RecordScope record;
    nd::sum(outer->Call({x})[0]).Backward();
  }
  net.w1.grad().ToVector<float>();  // waits for the backward
  CHECK(PlanNames(outer->compile_report()) == Names{"forward", "training forward", "training backward"});
  CompileReport r = inner->compile_report();
  REQUIRE(PlanNames(r) == Names{"forward", "backward"});
  CHECK(!r.plans[1].pipeline_ran);
  CHECK(Contains(r.str(), "backward:\n  passes: none (built from the optimized forward)"));
}

TEST_CASE("memory plan: an elementwise chain runs in place, in the arena of one intermediate") {
  // Unfused, the 12 ops of the chain each write over the value they read: one block of 4 KiB
  // (and the scalar constant) instead of two.
  ScopedEnv env("KILN_DISABLE_PASS", "fusion");
  Tensor x = nd::random::normal(0, 1, {1024});
  auto f = [](const Tensor& a) {
    Tensor t = a;
    for (int i = 0; i < 6; ++i) t = nd::add(nd::tanh(t), 1.0);
    return t;
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x});
  const CompileReport::PlanReport p = g->compile_report().plans.at(0);
  CHECK(g->arena_bytes() >= 1024 * sizeof(float));
  CHECK(g->arena_bytes() < 2 * 1024 * sizeof(float));
  CHECK(p.in_place == 10);  // all but the first tanh (it reads the graph input) and the last add (an output)
  CHECK(p.unshared_bytes > 10 * 1024 * sizeof(float));
  CheckClose(g->Call({x})[0], f(x));
  CheckClose(g->Call({x})[0], f(x));  // the arena is reused by the next call

  ScopedEnv off("KILN_DISABLE_PASS", "fusion,inplace");  // two blocks again, same numbers
  auto g2 = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x});
  CHECK(g2->compile_report().plans.at(0).in_place == 0);
  CHECK(g2->arena_bytes() >= 2 * 1024 * sizeof(float));
  CheckClose(g2->Call({x})[0], f(x));
}

TEST_CASE("memory plan: ops that read other elements than they write never run in place") {
  // transpose and matmul of a square matrix whose input dies there: same size and dtype as
  // their output, yet writing over the input would corrupt what they have still to read.
  ScopedEnv env("KILN_DISABLE_PASS", "fusion");
  Tensor x = nd::random::normal(0, 1, {16, 16});
  auto f = [](const Tensor& a) {
    Tensor t = nd::transpose(nd::tanh(a));
    return nd::add(nd::exp(nd::matmul(t, t)), 1.0);
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x});
  CHECK(g->compile_report().plans.at(0).in_place == 1);  // only exp, over the matmul's result
  CheckClose(g->Call({x})[0], f(x), 1e-4);
}

}  // namespace

namespace {

using Traced = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::shared_ptr<CachedGraph> TraceFrozen(const Traced& f, const std::vector<Tensor>& examples) {
  trace::TraceScope scope;
  std::vector<Tensor> in;
  for (size_t i = 0; i < examples.size(); ++i)
    in.push_back(scope.Input("data" + std::to_string(i), examples[i].shape(), examples[i].dtype(), cpu()));
  return scope.Finish(f(in), /*freeze=*/true);
}

TEST_CASE("freeze: parameter expressions are computed once, the graph holds a snapshot") {
  Tensor w = nd::random::normal(0, 0.5, {16, 8}), b = nd::random::normal(0, 0.1, {16});
  Tensor w2 = nd::random::normal(0, 0.5, {4, 16}), b2 = nd::zeros({4});
  Tensor x = nd::random::normal(0, 1, {5, 8});
  // The weight is scaled and transposed in forward: both fold; the matmuls read the result.
  auto f = [&](const Tensor& a) {
    Tensor h = nd::relu(nd::add(nd::matmul(a, nd::transpose(nd::multiply(w, 2.0))), b));
    return nd::log_softmax(nd::linear(h, w2, b2));
  };
  const Traced traced = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; };
  auto live = Trace(traced, {x});
  auto frozen = TraceFrozen(traced, {x});
  CHECK(frozen->frozen());
  CHECK_FALSE(live->frozen());
  CHECK(frozen->graph().nodes().size() == live->graph().nodes().size() - 3);  // no 2.0, mul, transpose
  CHECK(frozen->captured().size() == 4);  // (w * 2)^T, b, w2, b2
  CheckClose(frozen->Call({x})[0], f(x));

  const CompileReport::PlanReport p = frozen->compile_report().plans.at(0);
  REQUIRE(p.freeze);
  CHECK(p.freeze->parameters == 4);
  CHECK(p.freeze->nodes_folded == 2);
  CHECK(p.freeze->constants == 4);
  CHECK(p.freeze->constant_bytes == (8 * 16 + 16 + 4 * 16 + 4) * 4);
  CHECK(PassNames(p).back() == "freeze_fold");
  CHECK(Contains(frozen->compile_report().str(), "frozen: 4 parameters became constants, 2 nodes folded; "
                                                 "the graph reads 4 constants (848 B)"));
  CHECK_FALSE(live->compile_report().plans.at(0).freeze);

  // An update in place reaches the live graph, not the frozen one (not even its weights read as they are).
  Tensor before = frozen->Call({x})[0].To(cpu(), true);
  nd::multiply(w, 3.0).CopyTo(w);
  nd::add(w2, 1.0).CopyTo(w2);
  CheckClose(live->Call({x})[0], f(x));
  CheckClose(frozen->Call({x})[0], before);
  // Tracing again takes the new values.
  auto again = TraceFrozen(traced, {x});
  CheckClose(again->Call({x})[0], f(x));
}

TEST_CASE("freeze: a tensor the graph copies into stays live, the data input still has a gradient") {
  Tensor running = nd::zeros({3}), scale = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  auto g = TraceFrozen([&](const std::vector<Tensor>& in) {
    nd::add(running, in[0]).CopyTo(running);  // as batch norm updates its statistics
    return std::vector<Tensor>{nd::multiply(nd::multiply(in[0], nd::exp(scale)), nd::add(running, 1.0))};
  }, {x});
  REQUIRE(g->captured().size() == 2);
  CHECK(g->captured()[0].SharesStorage(running));   // read and written on every call
  CHECK_FALSE(g->captured()[1].SharesStorage(scale));  // exp(scale), folded
  g->Call({x});
  CHECK(running.ToVector<float>() == std::vector<float>{1, 2, 3});
  Tensor xg = x.To(cpu(), true);
  xg.AttachGrad();
  {
    autograd::RecordScope record;
    nd::sum(g->Call({xg})[0]).Backward();
  }
  // d/dx of x * exp(scale) * (running + 1), running as it was before this call (1, 2, 3).
  CheckClose(xg.grad(), nd::multiply(nd::exp(scale), Tensor::FromVector<float>({2, 3, 4}, {3})));
}

TEST_CASE("freeze: KILN_DISABLE_PASS=freeze_fold compiles the graph as traced, reading live tensors") {
  ScopedEnv env("KILN_DISABLE_PASS", "freeze_fold");
  Tensor w = nd::ones({3});
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  auto g = TraceFrozen([&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{nd::add(in[0], nd::exp(w))};
  }, {x});
  CHECK_FALSE(g->frozen());
  CHECK_FALSE(g->compile_report().plans.at(0).freeze);
  CHECK(g->captured()[0].SharesStorage(w));
  nd::zeros({3}).CopyTo(w);
  CheckClose(g->Call({x})[0], nd::add(x, 1.0));
}

}  // namespace
