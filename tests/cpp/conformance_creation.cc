// Conformance cases of the creation ops (ir/ops_creation.cc): full and arange against exact
// references in several dtypes (negative steps, empty ranges, rank-0 and empty shapes), and the
// random draws through checkers: dtype, shape, range, and mean and variance within 5 sigma of
// their expected values over 20000 draws. Reproducibility of the stream is tested in
// test_random.cc.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "conformance.h"

namespace kiln::testing {

namespace {

/// Reference of a creation op: `value(i)` for each element of `shape`.
Reference Fill(Shape shape, std::function<double(int64_t)> value) {
  return [shape, value](const std::vector<HostTensor>&, const ir::Attrs&) {
    HostTensor out{shape, std::vector<double>(static_cast<size_t>(shape.numel())), DType::kFloat64};
    for (int64_t i = 0; i < shape.numel(); ++i) out.data[static_cast<size_t>(i)] = value(i);
    return std::vector<HostTensor>{out};
  };
}

OpCase Case(std::string label, const char* op, ir::Attrs attrs) {
  OpCase c;
  c.label = std::move(label);
  c.op = op;
  c.attrs = std::move(attrs);
  c.dtypes = {};  // no inputs: the dtype is an attribute
  c.grad = false;
  return c;
}

void AddFull(std::vector<OpCase>& cs) {
  const std::vector<std::pair<DType, double>> fills = {
      {DType::kFloat32, 1.5}, {DType::kFloat64, -0.1}, {DType::kFloat16, 3.25}, {DType::kBFloat16, -7.5},
      {DType::kInt32, 7},     {DType::kInt64, -3},     {DType::kUInt8, 200},    {DType::kBool, 1},
  };
  for (const auto& [t, v] : fills) {
    OpCase c = Case(std::string("full (2, 3) ") + DTypeName(t), "full",
                    {{"shape", std::vector<int64_t>{2, 3}}, {"value", v}, {"dtype", t}});
    c.reference = Fill({2, 3}, [v](int64_t) { return v; });
    cs.push_back(c);
  }
  OpCase c = Case("full rank-0", "full", {{"shape", std::vector<int64_t>{}}, {"value", 2.0}});
  c.reference = Fill({}, [](int64_t) { return 2.0; });
  cs.push_back(c);
  c = Case("full empty (0, 4)", "full", {{"shape", std::vector<int64_t>{0, 4}}, {"value", 2.0}});
  c.reference = Fill({0, 4}, [](int64_t) { return 2.0; });
  cs.push_back(c);
  c = Case("full default value is 0", "full", {{"shape", std::vector<int64_t>{3}}});
  c.reference = Fill({3}, [](int64_t) { return 0.0; });
  cs.push_back(c);
  c = Case("full int value truncates", "full",
           {{"shape", std::vector<int64_t>{2}}, {"value", -2.7}, {"dtype", DType::kInt32}});
  c.reference = Fill({2}, [](int64_t) { return -2.0; });
  cs.push_back(c);
}

void AddArange(std::vector<OpCase>& cs) {
  struct Spec {
    double start, stop, step;
    DType dtype;
  };
  const std::vector<Spec> specs = {
      {0, 5, 1, DType::kFloat32},     {1.5, 3, 0.25, DType::kFloat64}, {0, 10, 3, DType::kInt32},
      {5, -1, -1.5, DType::kFloat32}, {10, 0, -3, DType::kInt64},      {3, 3, 1, DType::kFloat32},
      {5, 0, 1, DType::kInt64},       {0, 1, 0.1, DType::kFloat64},    {-2, 2, 0.5, DType::kFloat16},
      {0, 8, 1, DType::kBFloat16},    {0.5, 3, 1, DType::kInt32},      {0, 4, 1, DType::kUInt8},
  };
  for (const Spec& s : specs) {
    const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((s.stop - s.start) / s.step)));
    std::ostringstream label;
    label << "arange(" << s.start << ", " << s.stop << ", " << s.step << ") " << DTypeName(s.dtype)
          << (n == 0 ? " empty" : "");
    OpCase c = Case(label.str(), "arange",
                    {{"start", s.start}, {"stop", s.stop}, {"step", s.step}, {"dtype", s.dtype}});
    const bool integral = !IsFloat(s.dtype);
    c.reference = Fill({n}, [s, integral](int64_t i) {
      double v = s.start + s.step * static_cast<double>(i);
      return integral ? std::trunc(v) : v;
    });
    cs.push_back(c);
  }
  OpCase c = Case("arange default start and step", "arange", {{"stop", 4.0}});
  c.reference = Fill({4}, [](int64_t i) { return static_cast<double>(i); });
  cs.push_back(c);
}

// ---- random draws ------------------------------------------------------------------------------

constexpr int64_t kDraws = 20000;

struct Moments {
  double mean = 0, var = 0;
};

Moments MomentsOf(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

/// Checks dtype and shape, then returns the draws.
std::vector<double> Draws(const std::vector<Tensor>& out, const ir::Attrs& a) {
  REQUIRE(out.size() == 1);
  CHECK(out[0].dtype() == a.Type("dtype"));
  CHECK(out[0].shape() == Shape(a.Ints("shape")));
  return out[0].ToVector<double>();
}

/// Sample mean and variance within 5 sigma of `mean` and `var`; `mu4` is the fourth central
/// moment of the distribution (the variance of the sample variance is (mu4 - var^2) / n).
void CheckMoments(const std::vector<double>& v, double mean, double var, double mu4) {
  Moments m = MomentsOf(v);
  const double n = static_cast<double>(v.size());
  CHECK_MESSAGE(std::fabs(m.mean - mean) <= 5 * std::sqrt(var / n) + 1e-12,
                "sample mean " << m.mean << ", expected " << mean);
  CHECK_MESSAGE(std::fabs(m.var - var) <= 5 * std::sqrt((mu4 - var * var) / n) + 1e-12,
                "sample variance " << m.var << ", expected " << var);
}

void AddRandom(std::vector<OpCase>& cs) {
  const std::vector<int64_t> shape = {kDraws / 100, 100};
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    OpCase c = Case(std::string("random_uniform [-1, 3) ") + DTypeName(t), "random_uniform",
                    {{"shape", shape}, {"low", -1.0}, {"high", 3.0}, {"dtype", t}});
    c.check = [](const std::vector<Tensor>& out, const ir::Attrs& a) {
      std::vector<double> v = Draws(out, a);
      const double lo = a.Float("low"), hi = a.Float("high"), w = hi - lo;
      int64_t outside = 0;
      for (double x : v) outside += !(x >= lo && x < hi);
      CHECK_MESSAGE(outside == 0, outside << " draws outside [" << lo << ", " << hi << ")");
      CheckMoments(v, (lo + hi) / 2, w * w / 12, w * w * w * w / 80);
    };
    cs.push_back(c);

    c = Case(std::string("random_normal (2, 0.5) ") + DTypeName(t), "random_normal",
             {{"shape", shape}, {"mean", 2.0}, {"std", 0.5}, {"dtype", t}});
    c.check = [](const std::vector<Tensor>& out, const ir::Attrs& a) {
      std::vector<double> v = Draws(out, a);
      const double mu = a.Float("mean"), s2 = a.Float("std") * a.Float("std");
      int64_t bad = 0;
      for (double x : v) bad += !std::isfinite(x);
      CHECK_MESSAGE(bad == 0, bad << " draws are not finite");
      CheckMoments(v, mu, s2, 3 * s2 * s2);
    };
    cs.push_back(c);
  }
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kBool}) {
    OpCase c = Case(std::string("random_bernoulli p=0.3 ") + DTypeName(t), "random_bernoulli",
                    {{"shape", shape}, {"p", 0.3}, {"dtype", t}});
    c.check = [](const std::vector<Tensor>& out, const ir::Attrs& a) {
      std::vector<double> v = Draws(out, a);
      const double p = a.Float("p"), var = p * (1 - p);
      int64_t other = 0;
      for (double x : v) other += x != 0 && x != 1;
      CHECK_MESSAGE(other == 0, other << " draws are neither 0 nor 1");
      // mu4 of a Bernoulli variable: p(1-p)(1 - 3p(1-p)).
      CheckMoments(v, p, var, var * (1 - 3 * var));
    };
    cs.push_back(c);
  }
  OpCase c = Case("random_uniform defaults [0, 1) float32", "random_uniform", {{"shape", shape}});
  c.check = [](const std::vector<Tensor>& out, const ir::Attrs& a) {
    std::vector<double> v = Draws(out, a);
    CHECK(out[0].dtype() == DType::kFloat32);
    int64_t outside = 0;
    for (double x : v) outside += !(x >= 0 && x < 1);
    CHECK_MESSAGE(outside == 0, outside << " draws outside [0, 1)");
    CheckMoments(v, 0.5, 1.0 / 12, 1.0 / 80);
  };
  cs.push_back(c);
  for (double p : {0.0, 1.0}) {
    c = Case("random_bernoulli p=" + std::to_string(static_cast<int>(p)) + " is constant", "random_bernoulli",
             {{"shape", std::vector<int64_t>{1000}}, {"p", p}});
    c.check = [p](const std::vector<Tensor>& out, const ir::Attrs& a) {
      std::vector<double> v = Draws(out, a);
      int64_t other = 0;
      for (double x : v) other += x != p;
      CHECK_MESSAGE(other == 0, other << " draws differ from " << p);
    };
    cs.push_back(c);
  }
  c = Case("random_normal empty", "random_normal", {{"shape", std::vector<int64_t>{0, 3}}});
  c.check = [](const std::vector<Tensor>& out, const ir::Attrs& a) { CHECK(Draws(out, a).empty()); };
  cs.push_back(c);
}

}  // namespace

KILN_CONFORMANCE_CASES(creation) {
  std::vector<OpCase> cs;
  AddFull(cs);
  AddArange(cs);
  AddRandom(cs);
  return cs;
}

}  // namespace kiln::testing
