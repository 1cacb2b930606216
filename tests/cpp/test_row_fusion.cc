// Row groups of the fusion step (codegen/plan/fuse_rows.cc): softmax, log-softmax and x - logsumexp(x)
// over the last axis compile to one row kernel and match eager execution on odd row lengths and
// on NaN and -inf; an intermediate that is also an output is written by the kernel; a value read
// outside the group before its end, a reduction over another axis and KILN_DISABLE_PASS=fusion
// leave the ops unfused with the same results; gradients of the hybridized training path are
// the eager ones. Tolerances: the fused sums are reassociated in float lanes (row.h).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "test_util.h"
#include "trace_util.h"

namespace {

using namespace kiln;
using kiln::testing::Contains;
using kiln::testing::ScopedEnv;

using Fn = kiln::testing::TraceFn;
using kiln::testing::Trace;
using kiln::testing::CheckClose;

Tensor LogSumExpShift(const Tensor& x) { // x - logsumexp(x) over the last axis, written out
  Tensor m = nd::stop_gradient(nd::max(x, {-1}, true));
  return nd::subtract(x, nd::add(nd::log(nd::sum(nd::exp(nd::subtract(x, m)), {-1}, true)), m));
}

const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>>& RowFunctions() {
  static const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> fns = {
      {"softmax", [](const Tensor& x) { return nd::softmax(x, -1); }},
      {"log_softmax", [](const Tensor& x) { return nd::log_softmax(x, -1); }},
      {"x - logsumexp(x)", LogSumExpShift},
  };
  return fns;
}

/// The report's groups that contain a reduction (row groups).
int RowGroups(const CachedGraph& g) {
  int n = 0;
  const CompileReport r = g.compile_report();
  for (const auto& grp : r.plans.at(0).groups)
    for (const std::string& op : grp.ops)
      if (op == "max" || op == "sum" || op == "mean" || op == "min") {
        ++n;
        break;
      }
  return n;
}

} // namespace

TEST_CASE("row fusion: softmax, log-softmax and x - logsumexp over the last axis are one kernel") {
  for (const auto& [name, f] : RowFunctions()) {
    for (int64_t len : {1, 3, 10, 1000, 1001}) {
      for (const std::vector<int64_t>& lead : {std::vector<int64_t>{37}, std::vector<int64_t>{3, 5}}) {
        std::vector<int64_t> shape = lead;
        shape.push_back(len);
        CAPTURE(name);
        CAPTURE(len);
        CAPTURE(shape.size());
        Tensor x = nd::random::normal(0, 4, Shape(shape));
        auto fn = f;
        auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; }, {x});
        CheckClose(g->Call({x})[0], f(x));
#if KILN_WITH_CODEGEN
        CHECK(g->num_fused_groups() == 1);
        CHECK(RowGroups(*g) == 1);
        const CompileReport r = g->compile_report();
        CHECK(r.plans.at(0).kernels_after == 1);
        // softmax's exp(x - max) is computed once: the sum's pass stashes it in the output.
        if (std::string(name) == "softmax")
          CHECK(Contains(r.plans.at(0).groups.at(0).expr, "-> out0; out0 = div(out0, v1)"));
#endif
      }
    }
  }
}

TEST_CASE("row fusion: NaN spreads over its row, -inf is a value, +inf gives NaN as eagerly") {
  std::vector<float> v(4 * 9);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(double(i))) * 3;
  v[0 * 9 + 4] = NAN;
  for (int j = 0; j < 9; ++j) v[1 * 9 + j] = -INFINITY;
  v[2 * 9 + 8] = -INFINITY;
  v[3 * 9 + 1] = INFINITY;
  Tensor x = Tensor::FromVector<float>(v, {4, 9});
  for (const auto& [name, f] : RowFunctions()) {
    CAPTURE(name);
    auto fn = f;
    auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; }, {x});
    CheckClose(g->Call({x})[0], f(x));
  }
}

TEST_CASE("row fusion: an intermediate that is also an output is written by the kernel") {
  Tensor x = nd::random::normal(0, 2, {33, 129});
  auto f = [](const Tensor& a) {
    Tensor m = nd::max(a, {-1}, true);
    Tensor e = nd::exp(nd::subtract(a, m));
    Tensor s = nd::sum(e, {-1}, true);
    return std::vector<Tensor>{nd::divide(e, s), e, m, nd::mean(nd::multiply(e, 2.0), {-1}, true)};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x});
  std::vector<Tensor> got = g->Call({x}), want = f(x);
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CheckClose(got[k], want[k]);
  }
#if KILN_WITH_CODEGEN
  CHECK(g->num_fused_groups() == 1);
  CompileReport r = g->compile_report();
  const auto& grp = r.plans.at(0).groups.at(0);
  CHECK(grp.ops == std::vector<std::string>{"max", "sub", "exp", "sum", "div", "mul", "mean"});
  CHECK(Contains(r.str(), "group 0: max, sub, exp, sum, div, mul, mean -> 1 kernel (in0), 7 ops"));
  CHECK(Contains(grp.expr, "v0 = max(in0); v1 = sum(exp(sub(in0, v0)))"));
#endif
}

TEST_CASE("row fusion: a value read outside the group before its end cuts the group back") {
  Tensor x = nd::random::normal(0, 2, {8, 50});
  auto f = [](const Tensor& a) {
    Tensor m = nd::max(a, {-1}, true);
    Tensor flat = nd::transpose(m); // not fusable, traced before the rest reads m
    Tensor e = nd::exp(nd::subtract(a, m));
    return std::vector<Tensor>{nd::divide(e, nd::sum(e, {-1}, true)), nd::multiply(flat, 2.0)};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x});
  std::vector<Tensor> got = g->Call({x}), want = f(x);
  CheckClose(got[0], want[0]);
  CheckClose(got[1], want[1]);
#if KILN_WITH_CODEGEN
  // max alone is left; the sum's group (sub, exp, sum, div) reads its value.
  const CompileReport r = g->compile_report();
  REQUIRE(RowGroups(*g) == 1);
  CHECK(r.plans.at(0).groups.at(0).ops == std::vector<std::string>{"sub", "exp", "sum", "div"});
#endif
}

TEST_CASE(
    "row fusion: a reduction over a middle axis stays unfused, over columns or without keepdims it fuses") {
  Tensor x = nd::random::normal(0, 2, {40, 30}), x3 = nd::random::normal(0, 2, {6, 30, 20});
  for (const Tensor& t : {x, x3}) { // axis 0 of a matrix: columns; axis 1 of 3: a middle axis
    const int axis = t.rank() == 2 ? 0 : 1;
    auto g = Trace(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{nd::softmax(in[0], axis)}; }, {t});
    CheckClose(g->Call({t})[0], nd::softmax(t, axis));
#if KILN_WITH_CODEGEN
    CHECK(RowGroups(*g) == (axis == 0 ? 1 : 0));
#endif
  }
  auto sum_exp = [](const Tensor& a) { return nd::sum(nd::exp(a), {-1}); }; // keepdims false
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum_exp(in[0])}; }, {x});
  CheckClose(g->Call({x})[0], sum_exp(x));
#if KILN_WITH_CODEGEN
  CHECK(RowGroups(*g) == 1);
#endif
}

TEST_CASE("row fusion: a bias along the row and a per-row operand are read in the kernel") {
  Tensor x = nd::random::normal(0, 1, {17, 65}), bias = nd::random::normal(0, 1, {65}),
         t = nd::random::normal(1, 0.1, {17, 1});
  auto f = [&](const Tensor& a, const Tensor& temp) {
    return nd::log_softmax(nd::divide(nd::add(a, bias), temp), -1);
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; }, {x, t});
  CheckClose(g->Call({x, t})[0], f(x, t));
#if KILN_WITH_CODEGEN
  CHECK(g->num_fused_groups() == 1);
  const CompileReport r = g->compile_report();
  CHECK(r.plans.at(0).groups.at(0).num_inputs == 3);
#endif
}

TEST_CASE("row fusion: KILN_DISABLE_PASS=fusion runs softmax unfused with the same result") {
  Tensor x = nd::random::normal(0, 3, {64, 100});
  auto trace = [&] {
    return Trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{nd::softmax(in[0], -1)}; },
                 {x});
  };
  std::shared_ptr<CachedGraph> unfused;
  {
    ScopedEnv env("KILN_DISABLE_PASS", "fusion");
    unfused = trace();
  }
  CHECK(unfused->num_fused_groups() == 0);
  CheckClose(unfused->Call({x})[0], trace()->Call({x})[0]);
}

TEST_CASE("row fusion: gradients through a hybridized log-softmax head equal eager gradients") {
  Tensor w = nd::random::normal(0, 0.5, {10, 12}), b = nd::random::normal(0, 0.1, {10});
  Tensor x = nd::random::normal(0, 1, {9, 12});
  Tensor y = Tensor::FromVector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8}, {9});
  auto net = [&](const Tensor& in) {
    Tensor logits = nd::linear(in, w, b);
    return std::vector<Tensor>{nd::log_softmax(logits, -1), nd::softmax(nd::multiply(logits, 0.5), -1)};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return net(in[0]); }, {x});
  auto grads = [&](bool compiled) {
    w.AttachGrad();
    b.AttachGrad();
    {
      autograd::RecordScope record;
      std::vector<Tensor> out = compiled ? g->Call({x}) : net(x);
      Tensor loss = nd::add(nd::mean(nd::negative(nd::sum(nd::multiply(out[0], nd::one_hot(y, 10)), {1}))),
                            nd::sum(nd::multiply(out[1], out[1])));
      loss.Backward();
    }
    return std::vector<Tensor>{w.grad().To(cpu(), true), b.grad().To(cpu(), true)};
  };
  std::vector<Tensor> eager = grads(false), compiled = grads(true);
  for (size_t i = 0; i < eager.size(); ++i) CheckClose(compiled[i], eager[i], 1e-4, 1e-6);
}
