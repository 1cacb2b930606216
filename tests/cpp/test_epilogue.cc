// Epilogue groups (codegen/plan/fuse_epilogue.cc): a conv2d or matmul with its bias add, activation
// and residual add runs as one oneDNN call with post-ops, with the results of the unfused ops, on
// plain, channels-last, hand-written (one input channel) and few-row kernels alike; a value read
// outside the chain ends the group there; KILN_DISABLE_PASS=epilogue turns the step off. The
// fallback loop (host::ApplyEpilogue) is checked against the elementwise kernels directly.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/cpu/onednn.h"
#include "test_util.h"
#include "trace_util.h"

namespace {

using namespace kiln;
using kiln::testing::Contains;
using kiln::testing::ScopedEnv;
using Names = std::vector<std::string>;
using Fn = kiln::testing::TraceFn;
using kiln::testing::Trace;

/// The ops of the forward plan's epilogue groups, in order.
std::vector<Names> EpilogueGroups(const CachedGraph& g) {
  std::vector<Names> r;
  const CompileReport report = g.compile_report();
  for (const CompileReport::Group& group : report.plans.at(0).groups)
    if (group.expr.rfind("oneDNN ", 0) == 0) r.push_back(group.ops);
  return r;
}

/// Within `tol` relative to max(|a|, |b|, scale): `scale` is the size of the terms a result sums
/// (adding a bias before or after the sum rounds differently).
void CheckClose(const Tensor& a, const Tensor& b, double tol = 1e-5, double scale = 1) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == doctest::Approx(y[i]).epsilon(tol).scale(scale))) {
      if (!bad) MESSAGE("first difference at " << i << ": " << x[i] << " vs " << y[i]);
      ++bad;
    }
  CHECK(bad == 0);
}

/// f traced and run compiled against f run eagerly (unfused kernels); returns the graph.
std::shared_ptr<CachedGraph> CheckAgainstEager(const Fn& f, const std::vector<Tensor>& in, double scale = 1) {
  auto g = Trace(f, in);
  std::vector<Tensor> got = g->Call(in), want = f(in);
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) CheckClose(got[k], want[k], 1e-5, scale);
  return g;
}

Tensor Normal(const Shape& s, double sd = 1.0) { return nd::random::normal(0, sd, s); }

struct ConvCase {
  Shape x, w;
  nd::Conv2dOptions o;
};

TEST_CASE("epilogue: conv2d with bias and relu, plus a residual add, equals the unfused ops") {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 5}, {4, 3, 3, 3}, {{1, 1}, {1, 1}}},            // channels-last, odd sizes
      {{1, 1, 9, 11}, {5, 1, 3, 3}, {}},                         // one input channel: the hand-written kernel
      {{3, 1, 12, 12}, {6, 1, 5, 5}, {{1, 1}, {2, 2}}},          // the same, padded
      {{3, 5, 6, 6}, {7, 5, 1, 1}, {{2, 2}, {0, 0}}},            // 1x1, stride 2
      {{2, 4, 9, 9}, {6, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}}, // groups
      {{4, 20, 13, 13}, {50, 20, 5, 5}, {}},                     // LeNet's second layer
  };
  for (const ConvCase& c : cases) {
    CAPTURE(c.x.str());
    CAPTURE(c.w.str());
    Tensor x = Normal(c.x), w = Normal(c.w, 0.3), b = Normal({c.w[0]}, 0.5);
    Tensor probe = nd::conv2d(x, w, Tensor(), c.o);
    Tensor r = Normal(probe.shape());
    const double scale =
        0.3 * std::sqrt(static_cast<double>(c.w[1] * c.w[2] * c.w[3])); // |a sum of products|
    auto bias_relu = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{nd::relu(nd::conv2d(in[0], w, b, c.o))};
    };
    auto g = CheckAgainstEager(bias_relu, {x}, scale);
    CHECK(EpilogueGroups(*g) == std::vector<Names>{{"conv2d", "add", "relu"}});
    auto residual = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{nd::relu(nd::add(nd::conv2d(in[0], w, b, c.o), in[1]))};
    };
    g = CheckAgainstEager(residual, {x, r}, scale);
    CHECK(EpilogueGroups(*g) == std::vector<Names>{{"conv2d", "add", "add", "relu"}});
    // Without a bias: the activation alone, and a per-channel scale (folded batch norm).
    Tensor per_channel = Normal({1, c.w[0], 1, 1});
    auto scaled = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{nd::tanh(nd::multiply(nd::conv2d(in[0], w, Tensor(), c.o), per_channel))};
    };
    g = CheckAgainstEager(scaled, {x}, scale);
    CHECK(EpilogueGroups(*g) == std::vector<Names>{{"conv2d", "mul", "tanh"}});
    // sigmoid: tanh between scalar affine steps (part of them after the primitive, see onednn_epilogue.cc).
    auto sigmoid = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{nd::sigmoid(nd::conv2d(in[0], w, b, c.o))};
    };
    g = CheckAgainstEager(sigmoid, {x}, scale);
    CHECK(EpilogueGroups(*g) == std::vector<Names>{{"conv2d", "add", "mul", "tanh", "mul", "add"}});
  }
}

TEST_CASE("epilogue: matmul with bias, activations and a residual add equals the unfused ops") {
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{1, 7}, {5, 7}, false, true}, // a few rows: the streaming kernel, then the epilogue
      {{3, 7}, {5, 7}, false, true}, // the same over several rows
      {{3, 33}, {33, 9}, false, false},     {{9, 13}, {6, 13}, false, true},   // Dense's layout
      {{17, 5}, {17, 11}, true, false},     {{2, 3, 4}, {4, 5}, false, false}, // batched
      {{64, 512}, {256, 512}, false, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.a.str());
    CAPTURE(c.b.str());
    Tensor a = Normal(c.a), w = Normal(c.b, 0.3);
    Tensor probe = nd::matmul(a, w, c.ta, c.tb);
    const int64_t n = probe.shape()[probe.rank() - 1];
    Tensor bias = Normal({n}, 0.5), r = Normal(probe.shape());
    const int64_t k = c.ta ? c.a[c.a.rank() - 2] : c.a[c.a.rank() - 1];
    const double scale = 0.3 * std::sqrt(static_cast<double>(k));
    auto dense = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{nd::relu(nd::add(nd::matmul(in[0], w, c.ta, c.tb), bias))};
    };
    auto g = CheckAgainstEager(dense, {a}, scale);
    CHECK(EpilogueGroups(*g) == std::vector<Names>{{"matmul", "add", "relu"}});
    // sigmoid is tanh between scalar affine steps; then a residual, subtracted.
    auto chain = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{
          nd::subtract(nd::sigmoid(nd::add(nd::matmul(in[0], w, c.ta, c.tb), bias)), in[1])};
    };
    g = CheckAgainstEager(chain, {a, r}, scale);
    CHECK(EpilogueGroups(*g) == std::vector<Names>{{"matmul", "add", "mul", "tanh", "mul", "add", "sub"}});
  }
}

TEST_CASE("epilogue: a value read outside the chain ends the group, and is written") {
  Tensor x = Normal({6, 10}), w = Normal({8, 10}), b = Normal({8});
  // The pre-activation is an output too (as in training, where the backward reads it).
  auto both = [&](const std::vector<Tensor>& in) {
    Tensor z = nd::add(nd::matmul(in[0], w, false, true), b);
    return std::vector<Tensor>{nd::relu(z), z};
  };
  auto g = CheckAgainstEager(both, {x});
  CHECK(EpilogueGroups(*g) == std::vector<Names>{{"matmul", "add"}});
  // The product is read twice: no group.
  auto twice = [&](const std::vector<Tensor>& in) {
    Tensor y = nd::matmul(in[0], w, false, true);
    return std::vector<Tensor>{nd::relu(nd::add(y, b)), nd::tanh(y)};
  };
  g = CheckAgainstEager(twice, {x});
  CHECK(EpilogueGroups(*g).empty());
  // y * exp(y) after relu: y has two readers, so the group ends at the relu (which writes y).
  auto tree = [&](const std::vector<Tensor>& in) {
    Tensor y = nd::relu(nd::matmul(in[0], w, false, true));
    return std::vector<Tensor>{nd::multiply(y, nd::exp(y))};
  };
  g = CheckAgainstEager(tree, {x});
  CHECK(EpilogueGroups(*g) == std::vector<Names>{{"matmul", "relu"}});
  // A bias that broadcasts along another axis than the channels' is not an epilogue step.
  Tensor rows = Normal({6, 1});
  auto by_row = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{nd::relu(nd::add(nd::matmul(in[0], w, false, true), rows))};
  };
  g = CheckAgainstEager(by_row, {x});
  CHECK(EpilogueGroups(*g).empty());
}

TEST_CASE("epilogue: KILN_DISABLE_PASS=epilogue runs the ops unfused, with the same results") {
  Tensor x = Normal({2, 3, 8, 8}), w = Normal({4, 3, 3, 3}), b = Normal({4});
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{nd::relu(nd::conv2d(in[0], w, b))};
  };
  std::shared_ptr<CachedGraph> off;
  {
    ScopedEnv env("KILN_DISABLE_PASS", "epilogue");
    off = CheckAgainstEager(f, {x});
  }
  CHECK(EpilogueGroups(*off).empty());
  CHECK(!Contains(off->compile_report().str(), "oneDNN"));
  auto on = CheckAgainstEager(f, {x});
  REQUIRE(EpilogueGroups(*on).size() == 1);
  CheckClose(on->Call({x})[0], off->Call({x})[0]);
  const std::string text = on->compile_report().str();
  CHECK(Contains(text, "group 0: conv2d, add, relu -> 1 kernel (in0, in1, in2), 3 ops"));
  CHECK(Contains(text, "oneDNN conv2d(in0, in1) post-ops: bias(in2), relu"));
  CHECK(Contains(text, "(1 on oneDNN post-ops)"));
  ScopedEnv everything("KILN_DISABLE_PASS", "fusion"); // fusion off: epilogues too
  CHECK(EpilogueGroups(*Trace(f, {x})).empty());
}

TEST_CASE("epilogue: the fallback loop computes what the elementwise kernels compute") {
  // y (2, 3, 5): per-channel bias over axis 1 (inner 5), relu, 0.5 * x - 1, then max with r.
  Tensor y = Normal({2, 3, 5}), bias = Normal({3}), r = Normal({2, 3, 5});
  host::Epilogue e;
  e.steps.push_back({host::EpilogueStep::kBinary, UnaryFn::kIdentity, 1, 0, BinaryFn::kAdd, true, 0});
  e.steps.push_back({host::EpilogueStep::kUnary, UnaryFn::kRelu});
  e.steps.push_back({host::EpilogueStep::kLinear, UnaryFn::kIdentity, 0.5f, -1.f});
  e.steps.push_back({host::EpilogueStep::kBinary, UnaryFn::kIdentity, 1, 0, BinaryFn::kMaximum, false, 1});
  Tensor want =
      nd::maximum(nd::subtract(nd::multiply(nd::relu(nd::add(y, nd::reshape(bias, {3, 1}))), 0.5), 1.0), r);
  std::vector<float> v = y.ToVector<float>(), bv = bias.ToVector<float>(), rv = r.ToVector<float>();
  TensorView ops[2];
  ops[0].data = bv.data(), ops[0].shape = Shape{3}, ops[0].strides = Shape{1};
  ops[1].data = rv.data(), ops[1].shape = Shape{2, 3, 5}, ops[1].strides = Shape{15, 5, 1};
  host::ApplyEpilogue(v.data(), 0, 7, 5, 3, e, ops); // in two pieces, the first ending mid-channel
  host::ApplyEpilogue(v.data(), 7, 30, 5, 3, e, ops);
  CheckClose(Tensor::FromVector<float>(v, {2, 3, 5}), want, 1e-6);
}

} // namespace
