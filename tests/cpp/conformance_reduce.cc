// Conformance cases of the reduction ops (ir/ops_reduce.cc): sum, mean, max, min, argmax,
// argmin over axis combinations, keepdims, rank 0, size-1 dims and zero-size dims, against a
// plain double-precision reference written here (independent of the kernels).
#include <cmath>
#include <limits>

#include "conformance.h"

namespace kiln::testing {

namespace {

enum class R { kSum, kMean, kMax, kMin };

std::vector<bool> ReducedMask(int rank, const std::vector<int64_t>& axes) {
  std::vector<bool> m(static_cast<size_t>(rank), axes.empty());
  for (int64_t a : axes)
    if (rank > 0) m[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  return m;
}

Shape OutShape(const Shape& in, const std::vector<bool>& reduced, bool keepdims) {
  Shape out;
  for (int d = 0; d < in.rank(); ++d) {
    if (!reduced[static_cast<size_t>(d)])
      out.push_back(in[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

/// Flat output index of each input element (reduced coordinates dropped).
std::vector<int64_t> OutIndex(const Shape& in, const std::vector<bool>& reduced) {
  std::vector<int64_t> idx(static_cast<size_t>(in.numel()));
  for (int64_t i = 0; i < in.numel(); ++i) {
    int64_t rem = i, o = 0, scale = 1;
    for (int d = in.rank() - 1; d >= 0; --d) {
      int64_t c = rem % in[d];
      rem /= in[d];
      if (!reduced[static_cast<size_t>(d)]) {
        o += c * scale;
        scale *= in[d];
      }
    }
    idx[static_cast<size_t>(i)] = o;
  }
  return idx;
}

Reference ReduceRef(R kind) {
  return [kind](const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
    const HostTensor& x = in[0];
    std::vector<bool> reduced = ReducedMask(x.shape.rank(), attrs.Ints("axes"));
    HostTensor y{OutShape(x.shape, reduced, attrs.Bool("keepdims")), {}, x.dtype};
    const double nan = std::numeric_limits<double>::quiet_NaN();
    double init = kind == R::kMax ? -INFINITY : kind == R::kMin ? INFINITY : 0.0;
    y.data.assign(static_cast<size_t>(y.shape.numel()), init);
    std::vector<double> count(y.data.size(), 0);
    std::vector<int64_t> oi = OutIndex(x.shape, reduced);
    for (size_t i = 0; i < x.data.size(); ++i) {
      double& acc = y.data[static_cast<size_t>(oi[i])];
      double v = x.data[i];
      count[static_cast<size_t>(oi[i])] += 1;
      if (kind == R::kSum || kind == R::kMean)
        acc += v;
      else if (std::isnan(v) || std::isnan(acc))
        acc = nan;
      else if (kind == R::kMax)
        acc = std::max(acc, v);
      else
        acc = std::min(acc, v);
    }
    if (kind == R::kMean)
      for (size_t o = 0; o < y.data.size(); ++o) y.data[o] = count[o] ? y.data[o] / count[o] : nan;
    return std::vector<HostTensor>{y};
  };
}

Reference ArgRef(bool is_max) {
  return [is_max](const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
    const HostTensor& x = in[0];
    int rank = x.shape.rank();
    int64_t axis = attrs.Int("axis");
    std::vector<bool> reduced = ReducedMask(rank, {axis});
    HostTensor y{OutShape(x.shape, reduced, attrs.Bool("keepdims")), {}, DType::kInt64};
    y.data.assign(static_cast<size_t>(y.shape.numel()), -1);
    std::vector<double> best(y.data.size());
    std::vector<int64_t> oi = OutIndex(x.shape, reduced);
    int64_t a = rank == 0 ? 0 : (axis < 0 ? axis + rank : axis);
    int64_t inner = 1;
    for (int d = static_cast<int>(a) + 1; d < rank; ++d) inner *= x.shape[d];
    int64_t len = rank == 0 ? 1 : x.shape[static_cast<int>(a)];
    for (size_t i = 0; i < x.data.size(); ++i) { // elements in order: the axis index grows
      size_t o = static_cast<size_t>(oi[i]);
      double v = x.data[i], b = best[o];
      int64_t pos = static_cast<int64_t>(i) / inner % len;
      bool better = y.data[o] < 0 || (!std::isnan(b) && (std::isnan(v) || (is_max ? v > b : v < b)));
      if (better) {
        best[o] = v;
        y.data[o] = static_cast<double>(pos);
      }
    }
    return std::vector<HostTensor>{y};
  };
}

const char* Name(R k) {
  switch (k) {
  case R::kSum: return "sum";
  case R::kMean: return "mean";
  case R::kMax: return "max";
  case R::kMin: return "min";
  }
  return "?";
}

std::string AxesStr(const std::vector<int64_t>& axes) {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + std::to_string(axes[i]);
  return s + "]";
}

OpCase Case(R kind, HostTensor x, std::vector<int64_t> axes, bool keepdims) {
  OpCase c;
  c.op = Name(kind);
  c.label = c.op + " " + x.shape.str() + " axes=" + AxesStr(axes) + (keepdims ? " keepdims" : "");
  c.inputs = {std::move(x)};
  c.attrs = {{"axes", std::move(axes)}, {"keepdims", keepdims}};
  c.reference = ReduceRef(kind);
  c.dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  return c;
}

OpCase ArgCase(bool is_max, HostTensor x, int64_t axis, bool keepdims, std::string note = "") {
  OpCase c;
  c.op = is_max ? "argmax" : "argmin";
  c.label =
      c.op + " " + x.shape.str() + " axis=" + std::to_string(axis) + (keepdims ? " keepdims" : "") + note;
  c.inputs = {std::move(x)};
  c.attrs = {{"axis", axis}, {"keepdims", keepdims}};
  c.reference = ArgRef(is_max);
  c.dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16};
  return c;
}

} // namespace

KILN_CONFORMANCE_CASES(reduce) {
  std::vector<OpCase> cs;
  uint64_t seed = 100;
  for (R k : {R::kSum, R::kMean, R::kMax, R::kMin}) {
    // Distinct values (Uniform) so that max/min have no ties in the gradient check.
    auto u = [&](const Shape& s) { return Uniform(s, -2, 2, seed++); };
    cs.push_back(Case(k, u({3, 4}), {}, false));
    cs.push_back(Case(k, u({3, 4}), {1}, false));
    cs.push_back(Case(k, u({3, 4}), {0}, true));
    cs.push_back(Case(k, u({2, 3, 4}), {0, 2}, false));
    cs.push_back(Case(k, u({2, 3, 4}), {-1}, true));
    cs.push_back(Case(k, u({2, 3, 4}), {-3, 1}, false));
    cs.push_back(Case(k, u({2, 3, 4}), {}, true));
    cs.push_back(Case(k, u({2, 3, 2, 2}), {1, 3}, false));
    cs.push_back(Case(k, u({}), {}, false));
    cs.push_back(Case(k, u({5}), {0}, false));
    cs.push_back(Case(k, u({1, 5, 1}), {0, 2}, false));
    cs.push_back(Case(k, u({4, 1}), {1}, true));
    cs.push_back(Case(k, u({2, 0, 3}), {2}, false)); // zero-size dim that is not reduced
    // Larger than the kernels' vector width and blocks (no gradient check: too many elements).
    // Positive values: a float32 sum of hundreds of values that cancel is only accurate
    // relative to sum |x|, not to its small result (test_reduce.cc checks that).
    auto pos = [&](const Shape& s) { return Uniform(s, 0.5, 2, seed++); };
    OpCase rows = Case(k, pos({3, 700}), {1}, false);
    OpCase cols = Case(k, pos({700, 3}), {0}, true);
    OpCase full = Case(k, pos({9, 1000}), {}, false);
    OpCase middle = Case(k, pos({4, 150, 20}), {1}, false);
    for (OpCase* c : {&rows, &cols, &full, &middle}) {
      c->grad = false;
      cs.push_back(std::move(*c));
    }
  }
  // Empty reductions: sum is 0, mean is NaN.
  cs.push_back(Case(R::kSum, Uniform({2, 0}, -1, 1, 7), {1}, false));
  cs.push_back(Case(R::kMean, Uniform({2, 0}, -1, 1, 7), {1}, false));
  cs.push_back(Case(R::kSum, Uniform({0, 3}, -1, 1, 7), {}, false));
  // Integers keep their dtype; bool sums to int64. NaN propagates through max and min.
  cs.push_back(Case(R::kSum, Ints({2, 3}, {1, -2, 3, 4, 5, -6}, DType::kInt64), {0}, false));
  cs.push_back(Case(R::kSum, Ints({2, 3}, {1, 2, 3, 4, 5, 6}, DType::kInt32), {}, false));
  cs.push_back(Case(R::kSum, Ints({2, 3}, {1, 0, 1, 1, 1, 0}, DType::kBool), {1}, false));
  cs.push_back(Case(R::kMax, Ints({2, 3}, {1, 7, 3, 9, 5, 6}, DType::kUInt8), {1}, false));
  cs.push_back(Case(R::kMin, Ints({2, 3}, {1, -7, 3, 9, 5, -6}, DType::kInt32), {0}, true));
  cs.push_back(Case(R::kMax, Ints({2, 3}, {0, 0, 1, 0, 0, 0}, DType::kBool), {1}, false));
  for (R k : {R::kMax, R::kMin}) {
    OpCase c = Case(k, Ints({2, 3}, {1, NAN, 3, 4, 5, 6}, DType::kFloat32), {1}, false);
    c.label += " with NaN";
    c.grad = false;
    cs.push_back(std::move(c));
  }

  for (bool mx : {true, false}) {
    cs.push_back(ArgCase(mx, Uniform({3, 4}, -2, 2, 31), 1, false));
    cs.push_back(ArgCase(mx, Uniform({3, 4}, -2, 2, 32), 0, true));
    cs.push_back(ArgCase(mx, Uniform({2, 3, 4}, -2, 2, 33), -2, false));
    cs.push_back(ArgCase(mx, Uniform({2, 3, 4}, -2, 2, 34), 0, false));
    cs.push_back(ArgCase(mx, Uniform({5}, -2, 2, 35), 0, true));
    cs.push_back(ArgCase(mx, Uniform({}, -2, 2, 36), 0, false));
    cs.push_back(ArgCase(mx, Uniform({2, 0}, -2, 2, 37), 0, false)); // empty output
    cs.push_back(ArgCase(mx, Uniform({1, 4, 1}, -2, 2, 38), 1, true));
    cs.push_back(ArgCase(mx, Uniform({600, 3}, -2, 2, 39), 0, false));
    cs.push_back(ArgCase(mx, Ints({2, 4}, {3, 1, 3, 1, 2, 2, 2, 2}, DType::kFloat32), 1, false, " ties"));
    cs.push_back(ArgCase(mx, Ints({4, 2}, {3, 1, 1, 1, 3, 2, 2, 1}, DType::kFloat32), 0, false, " ties"));
    cs.push_back(ArgCase(mx, Ints({2, 4}, {1, NAN, 3, NAN, 5, 6, 7, 8}, DType::kFloat32), 1, false, " NaN"));
    cs.push_back(ArgCase(mx, Ints({4, 2}, {1, 9, NAN, 9, 5, NAN, 7, 8}, DType::kFloat32), 0, false, " NaN"));
    cs.push_back(ArgCase(mx, Ints({2, 3}, {4, -1, 4, 0, 7, 7}, DType::kInt32), 1, false, " int32"));
    cs.push_back(ArgCase(mx, Ints({2, 3}, {0, 1, 1, 0, 0, 0}, DType::kBool), 1, false, " bool"));
  }
  return cs;
}

} // namespace kiln::testing
