// Row groups beyond the trailing axes (codegen/plan/fuse_rows.cc, codegen/row.cc): strided rows
// (reductions over leading and trailing axes around a kept block, batch-norm statistics over
// (0, 2, 3)), columns (reductions over leading axes only: (0,), (0, 1)) and cross-entropy's
// one_hot read as labels. Fused results match eager execution and the unfused plan on odd sizes
// and random graphs, NaN spreads over its channel through max, intermediates read elsewhere are
// written or cut the group back, reductions with stretches of 2 to 7 floats stay unfused, and the
// gradients of hybridized batch norm and cross-entropy are the eager ones. Tolerances: sums are
// reassociated (row.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/codegen/row.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "test_util.h"
#include "trace_util.h"

namespace {

using namespace kiln;
using kiln::testing::Contains;
using kiln::testing::ScopedEnv;
using nd::Axes;

using Fn = kiln::testing::TraceFn;
using kiln::testing::Trace;
using kiln::testing::CheckClose;

/// The report's row groups (those with a reduction) and their ops.
std::vector<std::vector<std::string>> RowGroups(const CachedGraph& g, size_t plan = 0) {
  std::vector<std::vector<std::string>> out;
  const CompileReport r = g.compile_report();
  for (const auto& grp : r.plans.at(plan).groups)
    for (const std::string& op : grp.ops)
      if (op == "max" || op == "sum" || op == "mean" || op == "min") {
        out.push_back(grp.ops);
        break;
      }
  return out;
}

std::string FirstExpr(const CachedGraph& g) { return g.compile_report().plans.at(0).groups.at(0).expr; }

/// Batch-norm statistics and normalization over every axis but `axis`, written out.
std::vector<Tensor> Normalize(const Tensor& x, const Axes& axes) {
  Tensor mu = nd::mean(x, axes, true);
  Tensor c = nd::subtract(x, mu);
  Tensor var = nd::mean(nd::square(c), axes, true);
  return {nd::multiply(c, nd::rsqrt(nd::add(var, 1e-5))), nd::reshape(var, {var.numel()})};
}

} // namespace

TEST_CASE("strided rows: batch-norm statistics over (0, 2, 3) and (0, 2) are one kernel on odd sizes") {
  struct Case {
    Shape shape;
    Axes axes;
  };
  for (const Case& c :
       {Case{{7, 5, 3, 11}, {0, 2, 3}}, Case{{5, 3, 9, 9}, {0, 2, 3}}, Case{{1, 4, 3, 5}, {0, 2, 3}},
        Case{{9, 6, 8}, {0, 2}}, Case{{3, 2, 5, 17}, {0, 1, 3}}, Case{{33, 1, 19}, {0, 2}}}) {
    CAPTURE(c.shape.str());
    Tensor x = nd::random::normal(1, 3, c.shape);
    Axes axes = c.axes;
    auto g = Trace([&](const std::vector<Tensor>& in) { return Normalize(in[0], axes); }, {x});
    std::vector<Tensor> got = g->Call({x}), want = Normalize(x, axes);
    CheckClose(got[0], want[0], 2e-5, 2e-5);
    CheckClose(got[1], want[1], 2e-5, 2e-6);
#if KILN_WITH_CODEGEN
    auto groups = RowGroups(*g);
    REQUIRE(groups.size() == 1);
    CHECK(groups[0] ==
          std::vector<std::string>{"mean", "sub", "square", "mean", "add", "rsqrt", "mul", "reshape"});
    CHECK(g->num_fused_groups() == 1);
    // A leading axis of 1 leaves contiguous rows.
    CHECK(Contains(FirstExpr(*g), "strided: ") == (c.shape[0] > 1));
#endif
  }
}

TEST_CASE("strided rows: max and min over (0, 2) spread NaN over their channel like the unfused kernels") {
  Tensor x = nd::random::normal(0, 2, {6, 4, 10});
  std::vector<float> v = x.ToVector<float>();
  v[3 * 40 + 1 * 10 + 7] = NAN; // channel 1: NaN
  for (int n = 0; n < 6; ++n)
    for (int k = 0; k < 10; ++k) v[n * 40 + 2 * 10 + k] = -INFINITY; // channel 2: all -inf
  v[5 * 40 + 3 * 10 + 9] = INFINITY;                                 // channel 3: one +inf
  x = Tensor::FromVector<float>(v, {6, 4, 10});
  auto f = [](const Tensor& a) {
    Tensor m = nd::max(a, {0, 2}, true);
    return std::vector<Tensor>{nd::exp(nd::subtract(a, m)), nd::min(nd::multiply(a, 2.0), {0, -1}), m};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x});
  std::vector<Tensor> got = g->Call({x}), want = f(x);
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CheckClose(got[k], want[k]);
  }
  std::vector<float> m = got[2].ToVector<float>();
  CHECK(std::isnan(m[1]));
  CHECK(m[2] == -INFINITY);
  CHECK(m[3] == INFINITY);
#if KILN_WITH_CODEGEN
  // max -> sub -> exp, and the min of 2x over the same channels (a sibling: one read of x).
  auto groups = RowGroups(*g);
  REQUIRE(groups.size() == 1);
  CHECK(groups[0] == std::vector<std::string>{"max", "sub", "exp", "mul", "min"});
#endif
}

TEST_CASE("column rows: batch-norm statistics over (0,) and (0, 1) are one kernel, across block edges") {
  struct Case {
    Shape shape;
    Axes axes;
  };
  for (const Case& c : {Case{{37, 13}, {0}}, Case{{5, 7, 11}, {0, 1}}, Case{{3, 300}, {0}},
                        Case{{9, 2, 513}, {0, 1}}, Case{{1, 1, 7}, {0, 1}}}) {
    CAPTURE(c.shape.str());
    Tensor x = nd::random::normal(1, 3, c.shape);
    Axes axes = c.axes;
    auto g = Trace([&](const std::vector<Tensor>& in) { return Normalize(in[0], axes); }, {x});
    std::vector<Tensor> got = g->Call({x}), want = Normalize(x, axes);
    CheckClose(got[0], want[0], 2e-5, 2e-5);
    CheckClose(got[1], want[1], 2e-5, 2e-6);
#if KILN_WITH_CODEGEN
    auto groups = RowGroups(*g);
    REQUIRE(groups.size() == 1);
    CHECK(groups[0] ==
          std::vector<std::string>{"mean", "sub", "square", "mean", "add", "rsqrt", "mul", "reshape"});
    int64_t outer = 1;
    for (int64_t a : axes) outer *= c.shape[a];
    CHECK(Contains(FirstExpr(*g), "columns: ") == (outer > 1)); // else rows of 1: contiguous
#endif
  }
}

TEST_CASE("column rows: a sum over (0,) of a value written anyway stays unfused, of a temporary it fuses") {
  Tensor x = nd::random::normal(0, 1, {300, 24}), m = nd::random::normal(0, 1, {300, 24});
  // The bias gradient's pattern: the masked gradient is also an output (the weight gradient's).
  auto written = [](const Tensor& a, const Tensor& b) {
    Tensor p = nd::multiply(a, b);
    return std::vector<Tensor>{nd::sum(p, {0}), p};
  };
  auto temporary = [](const Tensor& a, const Tensor& b) {
    return std::vector<Tensor>{nd::sum(nd::exp(nd::multiply(a, b)), {0})};
  };
  for (bool keep : {true, false}) {
    CAPTURE(keep);
    auto f = keep ? Fn([&](const std::vector<Tensor>& in) { return written(in[0], in[1]); })
                  : Fn([&](const std::vector<Tensor>& in) { return temporary(in[0], in[1]); });
    auto g = Trace(f, {x, m});
    std::vector<Tensor> got = g->Call({x, m}), want = f({x, m});
    for (size_t k = 0; k < want.size(); ++k) CheckClose(got[k], want[k], 2e-5, 2e-5);
#if KILN_WITH_CODEGEN
    CHECK(RowGroups(*g).size() == (keep ? 0u : 1u));
#endif
  }
}

TEST_CASE("strided rows: stretches of 2 to 7 floats and middle axes stay unfused and correct") {
  struct Case {
    Shape shape;
    Axes axes;
  };
  for (const Case& c : {Case{{64, 8, 4}, {0, 2}}, Case{{6, 5, 7}, {0, 2}}, Case{{4, 9, 5}, {1}},
                        Case{{3, 4, 5, 6}, {0, 2}}}) {
    CAPTURE(c.shape.str());
    Tensor x = nd::random::normal(1, 3, c.shape);
    Axes axes = c.axes;
    auto g = Trace([&](const std::vector<Tensor>& in) { return Normalize(in[0], axes); }, {x});
    std::vector<Tensor> got = g->Call({x}), want = Normalize(x, axes);
    CheckClose(got[0], want[0], 2e-5, 2e-5);
    CheckClose(got[1], want[1], 2e-5, 2e-6);
    CHECK(RowGroups(*g).empty());
  }
}

#if KILN_WITH_CODEGEN
TEST_CASE("strided row kernel: sum, mean, max over stretches of 1, 3, 8 and 33 floats, and over columns") {
  using codegen::Expr;
  using codegen::RowProgram;
  RowProgram p;
  p.layout = RowProgram::kStrided;
  p.inputs = {RowProgram::kElement};
  Expr m;
  m.Input(0);
  int v0 = p.AddReduce(RowProgram::kMax, m);
  Expr s;
  s.Mul(s.Input(0), s.Input(0));
  p.AddReduce(RowProgram::kMean, s);
  Expr o;
  o.Sub(o.Input(0), o.Input(v0));
  p.AddOutput(o);
  p.AddRowOutput(0);
  p.AddRowOutput(1);
  CHECK(Contains(p.ToString(), "strided: v0 = max(in0); v1 = mean(mul(in0, in0))"));
  RowProgram columns = p;
  columns.layout = RowProgram::kColumns;
  CHECK(Contains(columns.ToString(), "columns: v0 = max(in0)"));
  auto kernel = codegen::CompileRow(p), column_kernel = codegen::CompileRow(columns);
  // Columns: stretches of 1, in blocks of 256 rows (600 rows: two full blocks and a part).
  for (int64_t inner : {1, 3, 8, 33, 0}) {
    const bool column = inner == 0;
    if (column) inner = 1;
    const int64_t outer = 7, rows = column ? 600 : 5, len = outer * inner;
    CAPTURE(inner);
    CAPTURE(column);
    std::vector<float> x(static_cast<size_t>(outer * rows * inner));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * double(i)) * 4);
    x[static_cast<size_t>(2 * rows * inner + 3 * inner)] = NAN; // row 3: NaN
    std::vector<float> out(x.size(), -1.f), mx(rows, -1.f), ms(rows, -1.f);
    const float* ins[] = {x.data()};
    float* outs[] = {out.data(), mx.data(), ms.data()};
    (column ? column_kernel : kernel)->Run(ins, outs, rows, len, inner);
    for (int64_t r = 0; r < rows; ++r) {
      double want_max = -INFINITY, want_ms = 0;
      for (int64_t a = 0; a < outer; ++a)
        for (int64_t b = 0; b < inner; ++b) {
          float e = x[static_cast<size_t>(a * rows * inner + r * inner + b)];
          want_max = std::isnan(e) || std::isnan(want_max) ? NAN : std::max<double>(want_max, e);
          want_ms += double(e) * e;
        }
      want_ms /= double(len);
      CAPTURE(r);
      CHECK((r == 3 ? std::isnan(mx[r]) : mx[r] == float(want_max)));
      CHECK((r == 3 ? std::isnan(ms[r]) : std::fabs(ms[r] - want_ms) <= 1e-5 * want_ms));
      for (int64_t a = 0; a < outer; ++a)
        for (int64_t b = 0; b < inner; ++b) {
          size_t i = static_cast<size_t>(a * rows * inner + r * inner + b);
          CHECK((r == 3 ? std::isnan(out[i]) : out[i] == x[i] - mx[r]));
        }
    }
  }
  // Bound to an inner extent, the plan's Run(ins, outs, rows, len) runs the same.
  std::vector<float> x(2 * 3 * 8, 1.f), out(x.size()), mx(3), ms(3);
  const float* ins[] = {x.data()};
  float* outs[] = {out.data(), mx.data(), ms.data()};
  kernel->Bind(8)->Run(ins, outs, 3, 16);
  CHECK(ms == std::vector<float>{1.f, 1.f, 1.f});
  // A strided program may not read an array along the row, a column one neither, nor labels.
  p.inputs.push_back(RowProgram::kColumn);
  CHECK_THROWS_AS(p.Validate(), codegen::UnsupportedError);
  columns.inputs.push_back(RowProgram::kOneHot);
  CHECK_THROWS_AS(columns.Validate(), codegen::UnsupportedError);
}
#endif

TEST_CASE("strided rows: an intermediate read before the group's end cuts it back, outputs are written") {
  Tensor x = nd::random::normal(0, 2, {6, 5, 12});
  auto f = [](const Tensor& a) {
    Tensor mu = nd::mean(a, {0, 2}, true);
    Tensor c = nd::subtract(a, mu);
    Tensor t = nd::transpose(c); // not fusable, read before the variance
    Tensor var = nd::mean(nd::square(c), {0, 2}, true);
    return std::vector<Tensor>{nd::multiply(c, nd::rsqrt(nd::add(var, 1e-5))), nd::multiply(t, 3.0), c, mu};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x});
  std::vector<Tensor> got = g->Call({x}), want = f(x);
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CheckClose(got[k], want[k], 2e-5, 2e-5);
  }
#if KILN_WITH_CODEGEN
  // c is read by the transpose before var: the mean's group ends at the sub (writing c and mu);
  // the variance's group reads c.
  auto groups = RowGroups(*g);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0] == std::vector<std::string>{"mean", "sub"});
  CHECK(groups[1] == std::vector<std::string>{"square", "mean", "add", "rsqrt", "mul"});
#endif
}

TEST_CASE("cross-entropy: log-softmax, one_hot, mul, sum and neg are one kernel reading the labels") {
  for (int64_t classes : {1, 7, 10, 1001}) {
    for (DType label_type : {DType::kInt64, DType::kInt32}) {
      CAPTURE(classes);
      const int64_t n = 37;
      std::vector<int64_t> labels(n);
      for (int64_t i = 0; i < n; ++i) labels[i] = (i * 5 + 3) % classes;
      labels[4] = -1, labels[9] = classes; // out of range: one_hot is all off, the loss 0
      Tensor y = Tensor::FromVector<int64_t>(labels, {n}).AsType(label_type);
      Tensor x = nd::random::normal(0, 3, {n, classes});
      // softmax_cross_entropy's graph with MXNet's one_hot (softmax_cross_entropy itself refuses
      // labels out of range, with a one_hot of labels=true that is not fused).
      auto f = [classes](const Tensor& a, const Tensor& l) {
        return nd::negative(nd::sum(nd::multiply(nd::one_hot(l, classes), nd::log_softmax(a, -1)), {-1}));
      };
      auto g =
          Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; }, {x, y});
      CheckClose(g->Call({x, y})[0], f(x, y), 2e-5, 2e-5);
#if KILN_WITH_CODEGEN
      auto groups = RowGroups(*g);
      REQUIRE(groups.size() == 1);
      CHECK(groups[0] == std::vector<std::string>{"max", "stop_gradient", "sub", "exp", "sum", "log", "sub",
                                                  "one_hot", "mul", "sum", "neg"});
      CHECK(g->compile_report().plans.at(0).kernels_after == 1);
      if (classes > 1) // (in rows of 1 the per-row ops are element ops: the text differs)
        CHECK(Contains(FirstExpr(*g), "sum(mul(onehot(in1), sub(sub(in0, v0), v2)))"));
#endif
    }
  }
}

TEST_CASE("cross-entropy: a one_hot also read elsewhere is written by the kernel") {
  Tensor x = nd::random::normal(0, 2, {9, 6});
  Tensor y = Tensor::FromVector<int64_t>({0, 1, 2, 3, 4, 5, 0, 1, 7}, {9});
  auto f = [](const Tensor& a, const Tensor& l) {
    Tensor t = nd::one_hot(l, 6);
    Tensor loss = nd::negative(nd::sum(nd::multiply(t, nd::log_softmax(a, -1)), {-1}));
    return std::vector<Tensor>{loss, nd::multiply(t, 2.0)};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return f(in[0], in[1]); }, {x, y});
  std::vector<Tensor> got = g->Call({x, y}), want = f(x, y);
  CheckClose(got[0], want[0]);
  CheckClose(got[1], want[1]);
}

TEST_CASE("gradients of hybridized batch norm and cross-entropy equal eager gradients") {
  Tensor x = nd::random::normal(0.5, 2, {6, 4, 3, 5});
  Tensor gamma = nd::random::normal(1, 0.2, {4}), beta = nd::random::normal(0, 0.2, {4});
  Tensor w = nd::random::normal(0, 0.5, {7, 60}), b = nd::random::normal(0, 0.1, {7});
  Tensor y = Tensor::FromVector<int64_t>({0, 3, 6, 2, 1, 5}, {6});
  auto net = [&](const Tensor& in, const Tensor& labels) {
    Tensor h = nd::batch_norm(in, gamma, beta, Tensor(), Tensor());
    Tensor logits = nd::linear(nd::reshape(nd::multiply(h, h), {6, 60}), w, b);
    return std::vector<Tensor>{nd::softmax_cross_entropy(logits, labels), h};
  };
  auto g = Trace([&](const std::vector<Tensor>& in) { return net(in[0], in[1]); }, {x, y});
  auto grads = [&](bool compiled) {
    for (Tensor* t : {&x, &gamma, &beta, &w, &b}) t->AttachGrad();
    {
      autograd::RecordScope record;
      std::vector<Tensor> out = compiled ? g->Call({x, y}) : net(x, y);
      Tensor loss = nd::add(nd::mean(out[0]), nd::mean(nd::multiply(out[1], nd::sin(out[1]))));
      loss.Backward();
    }
    std::vector<Tensor> r;
    for (Tensor* t : {&x, &gamma, &beta, &w, &b}) r.push_back(t->grad().To(cpu(), true));
    return r;
  };
  std::vector<Tensor> eager = grads(false), compiled = grads(true);
  for (size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    CheckClose(compiled[i], eager[i], 1e-4, 1e-5);
  }
#if KILN_WITH_CODEGEN
  CHECK(!RowGroups(*g).empty());
#endif
}

TEST_CASE("strided rows: random reductions with producers and consumers match the unfused plan") {
  std::mt19937 rng(20261122);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  int fused = 0;
  const int cases = 160;
  for (int c = 0; c < cases; ++c) {
    const int rank = 2 + pick(3);
    std::vector<int64_t> dims;
    for (int a = 0; a + 1 < rank; ++a) dims.push_back(1 + pick(7));
    dims.push_back(std::vector<int64_t>{1, 5, 8, 9, 16, 23}[static_cast<size_t>(pick(6))]);
    const int p = pick(rank), q = p + 1 + pick(rank - p); // kept axes [p, q), reduced the others
    Axes axes, kept_shape;
    for (int a = 0; a < rank; ++a) {
      if (a < p || a >= q) axes.push_back(a);
      kept_shape.push_back(a < p || a >= q ? 1 : dims[static_cast<size_t>(a)]);
    }
    if (axes.empty()) continue;
    const int kind = pick(4), producer = pick(4), consumer = pick(3);
    const bool keepdims = pick(3) != 0, chained = pick(2) == 0, nan = pick(4) == 0;
    std::string what = "dims";
    for (int64_t d : dims) what += " " + std::to_string(d);
    what += ", kept [" + std::to_string(p) + ", " + std::to_string(q) + "), reduce " + std::to_string(kind) +
            ", producer " + std::to_string(producer) + ", consumer " + std::to_string(consumer) +
            (keepdims ? ", keepdims" : "") + (chained ? ", chained" : "") + (nan ? ", NaN" : "");
    CAPTURE(what);
    Tensor x = nd::random::normal(0, 2, Shape(dims));
    if (nan) {
      std::vector<float> v = x.ToVector<float>();
      v[static_cast<size_t>(pick(static_cast<int>(v.size())))] = NAN;
      x = Tensor::FromVector<float>(v, Shape(dims));
    }
    Tensor bias = nd::random::normal(0, 1, Shape(kept_shape));
    auto f = [&](const Tensor& in) {
      Tensor y = producer == 0   ? nd::exp(nd::minimum(in, 3.0))
                 : producer == 1 ? nd::multiply(nd::abs(in), 2.0)
                 : producer == 2 ? nd::add(in, bias)
                                 : nd::square(in);
      Tensor r = kind == 0   ? nd::sum(y, axes, keepdims)
                 : kind == 1 ? nd::mean(y, axes, keepdims)
                 : kind == 2 ? nd::max(y, axes, keepdims)
                             : nd::min(y, axes, keepdims);
      std::vector<Tensor> out{nd::add(nd::multiply(r, 0.5), 1.0)};
      if (keepdims) {
        Tensor z = consumer == 0   ? nd::subtract(y, r)
                   : consumer == 1 ? nd::divide(y, nd::add(nd::abs(r), 1.0))
                                   : nd::multiply(nd::subtract(y, r), bias);
        out.push_back(z);
        if (chained) out.push_back(nd::sum(nd::multiply(z, z), axes, true));
      }
      return out;
    };
    auto trace = [&] { return Trace([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x}); };
    std::shared_ptr<CachedGraph> unfused;
    {
      ScopedEnv off("KILN_DISABLE_PASS", "fusion");
      unfused = trace();
    }
    std::shared_ptr<CachedGraph> g = trace();
    std::vector<Tensor> got = g->Call({x}), want = unfused->Call({x});
    // Sums are reassociated: about len * 2^-24 of the sum of magnitudes, which the values bound.
    double len = static_cast<double>(x.numel()), big = 1;
    for (int64_t a : kept_shape) len /= static_cast<double>(a);
    for (const Tensor& t : want)
      for (double v : t.ToVector<double>())
        if (std::isfinite(v)) big = std::max(big, std::fabs(v));
    for (size_t k = 0; k < want.size(); ++k) {
      CAPTURE(k);
      CheckClose(got[k], want[k], 2e-5, 4 * len * big * 0x1p-24);
    }
#if KILN_WITH_CODEGEN
    fused += !RowGroups(*g).empty();
#endif
  }
#if KILN_WITH_CODEGEN
  MESSAGE(fused << " of " << cases << " random graphs formed a row group");
  CHECK(fused > cases / 3);
#endif
}
