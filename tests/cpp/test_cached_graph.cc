// Hybridize's machinery: a traced graph runs compiled with the same results, forward and
// gradients, as eager execution of the same code; captured parameters are read live; in-place
// copies into captured tensors (batch norm statistics) happen on every call; reading a symbolic
// tensor is refused.
#include <doctest/doctest.h>

#include <functional>

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
