// Conformance cases of the neural-network ops (ir/ops_nn.cc): matmul, conv2d, max/avg pooling and
// their gradient ops, each against a naive double-precision loop written here (independent of
// runtime/cpu/reference_nn.cc). Inputs stay at a few dozen elements because the harness checks
// gradients by finite differences in float64.
#include <algorithm>
#include <functional>
#include <limits>

#include "conformance.h"

namespace kiln::testing {
namespace {

using V = std::vector<int64_t>;

// ---- attribute readers (cases pass attributes unresolved, so defaults are filled here) --------

V IntsOr(const ir::Attrs& a, const char* name, V fallback) { return a.Has(name) ? a.Ints(name) : fallback; }
bool BoolOr(const ir::Attrs& a, const char* name, bool fallback) {
  return a.Has(name) ? a.Bool(name) : fallback;
}
V Pair(const V& v) { return v.size() == 1 ? V{v[0], v[0]} : v; }

HostTensor Zeros(const Shape& s) { return HostTensor{s, std::vector<double>(s.numel(), 0.0)}; }

// ---- matmul ----------------------------------------------------------------------------------

std::vector<HostTensor> MatmulRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  const HostTensor &a = in[0], &b = in[1];
  bool ta = BoolOr(attrs, "transpose_a", false), tb = BoolOr(attrs, "transpose_b", false);
  int ra = a.shape.rank(), rb = b.shape.rank(), r = std::max(ra, rb);
  int64_t M = ta ? a.shape[ra - 1] : a.shape[ra - 2], K = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  int64_t N = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  Shape batch, out;
  for (int i = 0; i < r - 2; ++i) {
    int ia = i - (r - ra), ib = i - (r - rb);
    batch.push_back(std::max(ia >= 0 ? a.shape[ia] : 1, ib >= 0 ? b.shape[ib] : 1));
  }
  out = batch;
  out.push_back(M);
  out.push_back(N);
  HostTensor c = Zeros(out);
  // Offset of batch index `bi` in an operand of shape s (size-1 and missing dims broadcast).
  auto offset = [&](const Shape& s, int64_t bi) {
    int64_t off = 0, stride = s[s.rank() - 1] * s[s.rank() - 2];
    for (int d = batch.rank() - 1; d >= 0; --d) {
      int64_t idx = bi % batch[d];
      bi /= batch[d];
      int j = d - (r - s.rank());
      if (j < 0) continue;
      if (s[j] != 1) off += idx * stride;
      stride *= s[j];
    }
    return off;
  };
  for (int64_t bi = 0; bi < batch.numel(); ++bi)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a.data[offset(a.shape, bi) + (ta ? k * M + i : i * K + k)] *
               b.data[offset(b.shape, bi) + (tb ? j * K + k : k * N + j)];
        c.data[(bi * M + i) * N + j] = s;
      }
  return {c};
}

OpCase Matmul(std::string label, Shape a, Shape b, bool ta, bool tb, uint64_t seed) {
  OpCase c;
  c.label = "matmul " + label;
  c.op = "matmul";
  c.inputs = {Uniform(a, -1, 1, seed), Uniform(b, -1, 1, seed + 1)};
  c.attrs = {{"transpose_a", ta}, {"transpose_b", tb}};
  c.reference = MatmulRef;
  c.rtol = 1e-4;
  c.atol = 1e-5;
  return c;
}

// ---- conv2d ----------------------------------------------------------------------------------

struct ConvAttrs {
  V stride, padding, dilation;
  int64_t groups;
  explicit ConvAttrs(const ir::Attrs& a)
      : stride(Pair(IntsOr(a, "stride", {1, 1}))), padding(Pair(IntsOr(a, "padding", {0, 0}))),
        dilation(Pair(IntsOr(a, "dilation", {1, 1}))), groups(a.Has("groups") ? a.Int("groups") : 1) {}
};

Shape ConvOut(const Shape& x, const Shape& w, const ConvAttrs& c) {
  Shape y{x[0], w[0], 0, 0};
  for (int i = 0; i < 2; ++i)
    y[2 + i] = (x[2 + i] + 2 * c.padding[i] - c.dilation[i] * (w[2 + i] - 1) - 1) / c.stride[i] + 1;
  return y;
}

/// Calls f(x index, w index, y index) for every multiply of the convolution.
void ForEachTap(const Shape& x, const Shape& w, const Shape& y, const ConvAttrs& c,
                const std::function<void(int64_t, int64_t, int64_t)>& f) {
  int64_t og = w[0] / c.groups, ig = w[1];
  for (int64_t n = 0; n < x[0]; ++n)
    for (int64_t o = 0; o < w[0]; ++o)
      for (int64_t oh = 0; oh < y[2]; ++oh)
        for (int64_t ow = 0; ow < y[3]; ++ow)
          for (int64_t i = 0; i < ig; ++i)
            for (int64_t kh = 0; kh < w[2]; ++kh)
              for (int64_t kw = 0; kw < w[3]; ++kw) {
                int64_t ih = oh * c.stride[0] - c.padding[0] + kh * c.dilation[0];
                int64_t iw = ow * c.stride[1] - c.padding[1] + kw * c.dilation[1];
                if (ih < 0 || ih >= x[2] || iw < 0 || iw >= x[3]) continue;
                int64_t ch = (o / og) * ig + i;
                f(((n * x[1] + ch) * x[2] + ih) * x[3] + iw, ((o * ig + i) * w[2] + kh) * w[3] + kw,
                  ((n * w[0] + o) * y[2] + oh) * y[3] + ow);
              }
}

std::vector<HostTensor> ConvRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  ConvAttrs c(attrs);
  const HostTensor &x = in[0], &w = in[1];
  HostTensor y = Zeros(ConvOut(x.shape, w.shape, c));
  ForEachTap(x.shape, w.shape, y.shape, c,
             [&](int64_t xi, int64_t wi, int64_t yi) { y.data[yi] += x.data[xi] * w.data[wi]; });
  return {y};
}

std::vector<HostTensor> ConvGradDataRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  ConvAttrs c(attrs);
  const HostTensor &dy = in[0], &w = in[1];
  HostTensor dx = Zeros(Shape(attrs.Ints("input_shape")));
  ForEachTap(dx.shape, w.shape, dy.shape, c,
             [&](int64_t xi, int64_t wi, int64_t yi) { dx.data[xi] += dy.data[yi] * w.data[wi]; });
  return {dx};
}

std::vector<HostTensor> ConvGradWeightRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  ConvAttrs c(attrs);
  const HostTensor &dy = in[0], &x = in[1];
  HostTensor dw = Zeros(Shape(attrs.Ints("weight_shape")));
  ForEachTap(x.shape, dw.shape, dy.shape, c,
             [&](int64_t xi, int64_t wi, int64_t yi) { dw.data[wi] += dy.data[yi] * x.data[xi]; });
  return {dw};
}

ir::Attrs ConvAttrList(V stride, V padding, V dilation, int64_t groups) {
  return {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
}

/// conv2d plus one case each of its two gradient ops at the same geometry.
void AddConv(std::vector<OpCase>& cs, std::string label, Shape x, Shape w, ir::Attrs attrs, uint64_t seed) {
  OpCase c;
  c.label = "conv2d " + label;
  c.op = "conv2d";
  c.inputs = {Uniform(x, -1, 1, seed), Uniform(w, -1, 1, seed + 1)};
  c.attrs = attrs;
  c.reference = ConvRef;
  c.rtol = 1e-4;
  c.atol = 1e-5;
  cs.push_back(c);

  Shape y = ConvOut(x, w, ConvAttrs(attrs));
  OpCase d = c;
  d.label = "conv2d_grad_data " + label;
  d.op = "conv2d_grad_data";
  d.inputs = {Uniform(y, -1, 1, seed + 2), Uniform(w, -1, 1, seed + 1)};
  d.attrs.items().emplace_back("input_shape", x.vec());
  d.reference = ConvGradDataRef;
  d.grad = false;
  cs.push_back(d);

  OpCase g = c;
  g.label = "conv2d_grad_weight " + label;
  g.op = "conv2d_grad_weight";
  g.inputs = {Uniform(y, -1, 1, seed + 2), Uniform(x, -1, 1, seed)};
  g.attrs.items().emplace_back("weight_shape", w.vec());
  g.reference = ConvGradWeightRef;
  g.grad = false;
  cs.push_back(g);
}

// ---- pooling ---------------------------------------------------------------------------------

struct PoolAttrs {
  V kernel, stride, padding;
  bool include_pad;
  explicit PoolAttrs(const ir::Attrs& a)
      : kernel(Pair(a.Ints("kernel"))),
        stride(Pair(IntsOr(a, "stride", {}).empty() ? kernel : IntsOr(a, "stride", {}))),
        padding(Pair(IntsOr(a, "padding", {0, 0}))), include_pad(BoolOr(a, "count_include_pad", true)) {}
};

Shape PoolOut(const Shape& x, const PoolAttrs& p) {
  return {x[0], x[1], (x[2] + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1,
          (x[3] + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1};
}

/// Calls f(y index, x indices of the window inside the input in row-major order, divisor).
void ForEachWindow(const Shape& x, const PoolAttrs& p,
                   const std::function<void(int64_t, const std::vector<int64_t>&, double)>& f) {
  Shape y = PoolOut(x, p);
  for (int64_t nc = 0; nc < x[0] * x[1]; ++nc)
    for (int64_t oh = 0; oh < y[2]; ++oh)
      for (int64_t ow = 0; ow < y[3]; ++ow) {
        std::vector<int64_t> idx;
        for (int64_t kh = 0; kh < p.kernel[0]; ++kh)
          for (int64_t kw = 0; kw < p.kernel[1]; ++kw) {
            int64_t ih = oh * p.stride[0] - p.padding[0] + kh, iw = ow * p.stride[1] - p.padding[1] + kw;
            if (ih >= 0 && ih < x[2] && iw >= 0 && iw < x[3]) idx.push_back((nc * x[2] + ih) * x[3] + iw);
          }
        double divisor = p.include_pad ? static_cast<double>(p.kernel[0] * p.kernel[1]) : idx.size();
        f((nc * y[2] + oh) * y[3] + ow, idx, divisor);
      }
}

int64_t FirstMax(const HostTensor& x, const std::vector<int64_t>& idx) {
  int64_t best = idx[0];
  for (int64_t i : idx)
    if (x.data[i] > x.data[best]) best = i;
  return best;
}

std::vector<HostTensor> MaxPoolRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  PoolAttrs p(attrs);
  HostTensor y = Zeros(PoolOut(in[0].shape, p));
  ForEachWindow(in[0].shape, p, [&](int64_t yi, const std::vector<int64_t>& idx, double) {
    y.data[yi] = in[0].data[FirstMax(in[0], idx)];
  });
  return {y};
}

std::vector<HostTensor> MaxPoolGradRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  PoolAttrs p(attrs);
  const HostTensor &dy = in[0], &x = in[1];
  HostTensor dx = Zeros(x.shape);
  ForEachWindow(x.shape, p, [&](int64_t yi, const std::vector<int64_t>& idx, double) {
    dx.data[FirstMax(x, idx)] += dy.data[yi];
  });
  return {dx};
}

std::vector<HostTensor> AvgPoolRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  PoolAttrs p(attrs);
  HostTensor y = Zeros(PoolOut(in[0].shape, p));
  ForEachWindow(in[0].shape, p, [&](int64_t yi, const std::vector<int64_t>& idx, double divisor) {
    for (int64_t i : idx) y.data[yi] += in[0].data[i] / divisor;
  });
  return {y};
}

std::vector<HostTensor> AvgPoolGradRef(const std::vector<HostTensor>& in, const ir::Attrs& attrs) {
  PoolAttrs p(attrs);
  HostTensor dx = Zeros(Shape(attrs.Ints("input_shape")));
  ForEachWindow(dx.shape, p, [&](int64_t yi, const std::vector<int64_t>& idx, double divisor) {
    for (int64_t i : idx) dx.data[i] += in[0].data[yi] / divisor;
  });
  return {dx};
}

/// A pooling op plus one case of its gradient op at the same geometry.
void AddPool(std::vector<OpCase>& cs, bool avg, std::string label, Shape x, ir::Attrs attrs, uint64_t seed) {
  std::string op = avg ? "avg_pool2d" : "max_pool2d";
  OpCase c;
  c.label = op + " " + label;
  c.op = op;
  c.inputs = {Uniform(x, -1, 1, seed)};
  c.attrs = attrs;
  c.reference = avg ? AvgPoolRef : MaxPoolRef;
  c.rtol = 1e-4;
  cs.push_back(c);

  Shape y = PoolOut(x, PoolAttrs(attrs));
  OpCase g = c;
  g.label = op + "_grad " + label;
  g.op = op + "_grad";
  g.grad = false;
  if (avg) {
    g.inputs = {Uniform(y, -1, 1, seed + 1)};
    g.attrs.items().emplace_back("input_shape", x.vec());
    g.reference = AvgPoolGradRef;
  } else {
    g.inputs = {Uniform(y, -1, 1, seed + 1), Uniform(x, -1, 1, seed)};
    g.reference = MaxPoolGradRef;
  }
  cs.push_back(g);
}

} // namespace
} // namespace kiln::testing

KILN_CONFORMANCE_CASES(nn) {
  using namespace kiln;
  using namespace kiln::testing;
  std::vector<OpCase> cs;
  cs.push_back(Matmul("2-D (3,4)@(4,5)", {3, 4}, {4, 5}, false, false, 1));
  cs.push_back(Matmul("batched (2,3,4)@(2,4,5)", {2, 3, 4}, {2, 4, 5}, false, false, 3));
  cs.push_back(Matmul("broadcast (2,3,4)@(4,5)", {2, 3, 4}, {4, 5}, false, false, 5));
  cs.push_back(Matmul("broadcast (3,4)@(2,4,2)", {3, 4}, {2, 4, 2}, false, false, 7));
  cs.push_back(Matmul("broadcast (2,1,3,4)@(3,4,2)", {2, 1, 3, 4}, {3, 4, 2}, false, false, 9));
  cs.push_back(Matmul("transpose_a (4,3)^T@(4,5)", {4, 3}, {4, 5}, true, false, 11));
  cs.push_back(Matmul("transpose_b (3,4)@(5,4)^T", {3, 4}, {5, 4}, false, true, 13));
  cs.push_back(Matmul("both transposed (4,3)^T@(5,4)^T", {4, 3}, {5, 4}, true, true, 15));
  cs.push_back(
      Matmul("batched broadcast both transposed (2,4,3)^T@(1,5,4)^T", {2, 4, 3}, {1, 5, 4}, true, true, 17));
  cs.push_back(Matmul("broadcast transpose_a (1,4,3)^T@(2,4,2)", {1, 4, 3}, {2, 4, 2}, true, false, 19));

  AddConv(cs, "(2,3,5,5)*(4,3,3,3)", {2, 3, 5, 5}, {4, 3, 3, 3}, ConvAttrList({1, 1}, {0, 0}, {1, 1}, 1), 21);
  AddConv(cs, "stride 2 padding 1", {1, 2, 6, 5}, {3, 2, 3, 3}, ConvAttrList({2, 2}, {1, 1}, {1, 1}, 1), 24);
  AddConv(cs, "dilation 2 padding (1,2)", {1, 2, 7, 7}, {2, 2, 3, 3}, ConvAttrList({1, 1}, {1, 2}, {2, 2}, 1),
          27);
  AddConv(cs, "groups 2 stride (2,1) padding (1,0)", {1, 4, 5, 5}, {6, 2, 3, 3},
          ConvAttrList({2, 1}, {1, 0}, {1, 1}, 2), 30);
  AddConv(cs, "depthwise groups 3 kernel 2x2", {2, 3, 4, 4}, {3, 1, 2, 2},
          ConvAttrList({1, 1}, {0, 0}, {1, 1}, 3), 33);
  AddConv(cs, "one input channel padding 1 (hand-written kernels)", {2, 1, 6, 7}, {3, 1, 3, 3},
          ConvAttrList({1, 1}, {1, 1}, {1, 1}, 1), 36);
  AddConv(cs, "4 input channels padding (1,0) (channels-last oneDNN)", {1, 4, 5, 6}, {3, 4, 3, 3},
          ConvAttrList({1, 1}, {1, 0}, {1, 1}, 1), 39);

  using V = std::vector<int64_t>;
  AddPool(cs, false, "kernel 2", {2, 2, 4, 4}, {{"kernel", V{2, 2}}}, 41);
  AddPool(cs, false, "kernel 3 stride 2 padding 1", {1, 2, 5, 6},
          {{"kernel", V{3, 3}}, {"stride", V{2, 2}}, {"padding", V{1, 1}}}, 43);
  AddPool(cs, false, "kernel (2,3) stride 1 (overlapping)", {1, 2, 4, 5},
          {{"kernel", V{2, 3}}, {"stride", V{1, 1}}}, 45);
  AddPool(cs, true, "kernel 2 floor mode", {2, 2, 4, 5}, {{"kernel", V{2, 2}}}, 47);
  AddPool(cs, true, "kernel 3 stride 2 padding 1 count_include_pad", {1, 2, 5, 6},
          {{"kernel", V{3, 3}}, {"stride", V{2, 2}}, {"padding", V{1, 1}}, {"count_include_pad", true}}, 49);
  AddPool(cs, true, "kernel 3 stride 2 padding 1 exclude pad", {1, 2, 5, 6},
          {{"kernel", V{3, 3}}, {"stride", V{2, 2}}, {"padding", V{1, 1}}, {"count_include_pad", false}}, 51);
  return cs;
}
