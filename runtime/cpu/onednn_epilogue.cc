// Matmul and conv2d with an elementwise epilogue as oneDNN post-ops (a first per-channel add as
// the primitive's bias), and which functions oneDNN has post-op algorithms for. Steps oneDNN
// cannot take run after the primitive (nn_dispatch.cc).
#include <cstring>
#include <optional>

#include "onednn_prim.h"

namespace kiln::host {

bool EpilogueSupports(UnaryFn f) {
  switch (f) {
  case UnaryFn::kRelu: case UnaryFn::kTanh: case UnaryFn::kNeg: case UnaryFn::kAbs: case UnaryFn::kSquare:
  case UnaryFn::kSqrt: case UnaryFn::kExp: case UnaryFn::kLog: return true;
  default: return false;
  }
}

bool EpilogueSupports(BinaryFn f) {
  switch (f) {
  case BinaryFn::kAdd: case BinaryFn::kSub: case BinaryFn::kMul: case BinaryFn::kDiv: case BinaryFn::kMaximum:
  case BinaryFn::kMinimum: return true;
  default: return false;
  }
}

namespace onednn {

namespace {

/// A first per-channel add is the primitive's bias argument.
bool BiasStep(const Epilogue& e) {
  return !e.steps.empty() && e.steps[0].kind == EpilogueStep::kBinary && e.steps[0].binary == BinaryFn::kAdd &&
         e.steps[0].per_channel;
}

alg EltwiseAlg(UnaryFn f, float* alpha) {
  *alpha = 0.f;
  switch (f) {
  case UnaryFn::kRelu: return alg::eltwise_relu;
  case UnaryFn::kTanh: return alg::eltwise_tanh;
  case UnaryFn::kNeg: *alpha = -1.f; return alg::eltwise_linear;
  case UnaryFn::kAbs: return alg::eltwise_abs;
  case UnaryFn::kSquare: return alg::eltwise_square;
  case UnaryFn::kSqrt: return alg::eltwise_sqrt;
  case UnaryFn::kExp: return alg::eltwise_exp;
  case UnaryFn::kLog: return alg::eltwise_log;
  default: KILN_CHECK(false) << "epilogue: unsupported unary function " << static_cast<int>(f); return alg::undef;
  }
}

alg BinaryAlg(BinaryFn f) {
  switch (f) {
  case BinaryFn::kAdd: return alg::binary_add;
  case BinaryFn::kSub: return alg::binary_sub;
  case BinaryFn::kMul: return alg::binary_mul;
  case BinaryFn::kDiv: return alg::binary_div;
  case BinaryFn::kMaximum: return alg::binary_max;
  case BinaryFn::kMinimum: return alg::binary_min;
  default: KILN_CHECK(false) << "epilogue: unsupported binary function " << static_cast<int>(f); return alg::undef;
  }
}

memory::desc Contiguous(const Shape& s, dt t) { return memory::desc(Dims(s), t, Dims(s.ContiguousStrides())); }

/// The epilogue as oneDNN attributes: the bias descriptor (when the first step is one), the
/// post-ops, and the binary post-ops' arguments (id, the primitive's layout, the caller's).
struct PostOps {
  dnnl::primitive_attr attr = UserScratchpad();
  std::optional<memory::desc> bias;
  ArgDescs binaries;
  size_t steps = 0;  ///< the epilogue's first `steps` steps are these; the others run after the primitive
};

/// `conv`: bias of shape (C); else (matmul) of out's rank. `channels_last`: the primitive's
/// output is NHWC, and so are its full-shape binary operands (reordered on each call).
PostOps MakePostOps(const Epilogue& e, const Shape& out, int channel_axis, bool conv, bool channels_last) {
  PostOps r;
  const int64_t channels = out[channel_axis];
  Shape per_channel;
  for (int d = 0; d < out.rank(); ++d) per_channel.push_back(d == channel_axis ? channels : 1);
  size_t first = 0;
  if (BiasStep(e)) {
    r.bias = conv ? memory::desc({channels}, dt::f32, tag::a) : Contiguous(per_channel, dt::f32);
    first = 1;
  }
  dnnl::post_ops po;
  // oneDNN 2.6's x64 kernels give every eltwise post-op of one algorithm the first one's alpha and
  // beta (sigmoid's 0.5 * x, tanh, 0.5 * x + 0.5 came out without the last + 0.5): an algorithm
  // seen before with other parameters ends the post-ops there, and a run of linear steps is one,
  // a1 * (a0 * x + b0) + b1, within an ulp or two of the steps one by one.
  std::vector<std::tuple<alg, float, float>> eltwise;
  auto append_eltwise = [&](alg a, float alpha, float beta) {
    for (const auto& [a0, alpha0, beta0] : eltwise)
      if (a0 == a && (alpha0 != alpha || beta0 != beta)) return false;
    eltwise.emplace_back(a, alpha, beta);
    po.append_eltwise(1.f, a, alpha, beta);
    return true;
  };
  size_t k = first;
  for (bool ok = true; ok && k < e.steps.size(); k += ok) {
    const EpilogueStep& s = e.steps[k];
    switch (s.kind) {
    case EpilogueStep::kUnary: {
      float alpha;
      alg a = EltwiseAlg(s.unary, &alpha);
      ok = append_eltwise(a, alpha, 0.f);
      break;
    }
    case EpilogueStep::kLinear: {
      float alpha = s.alpha, beta = s.beta;
      size_t last = k;
      for (; last + 1 < e.steps.size() && e.steps[last + 1].kind == EpilogueStep::kLinear; ++last) {
        const EpilogueStep& next = e.steps[last + 1];
        alpha *= next.alpha;
        beta = next.alpha * beta + next.beta;
      }
      ok = append_eltwise(alg::eltwise_linear, alpha, beta);
      if (ok) k = last;
      break;
    }
    case EpilogueStep::kBinary: {
      memory::desc user = Contiguous(s.per_channel ? per_channel : out, dt::f32);
      memory::desc mine = channels_last && !s.per_channel ? memory::desc(Dims(out), dt::f32, tag::nhwc) : user;
      r.binaries.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1, mine, user);
      po.append_binary(BinaryAlg(s.binary), mine);
      break;
    }
    }
  }
  r.steps = k;
  r.attr.set_post_ops(po);
  return r;
}

void AppendEpilogue(Key& k, const Epilogue& e) {
  k.push_back(-1);  // after the shapes: no key without an epilogue ends this way
  for (const EpilogueStep& s : e.steps) {
    uint32_t alpha, beta;
    std::memcpy(&alpha, &s.alpha, 4);
    std::memcpy(&beta, &s.beta, 4);
    k.insert(k.end(), {s.kind, static_cast<int64_t>(s.unary), static_cast<int64_t>(s.binary), s.per_channel,
                       static_cast<int64_t>(alpha), static_cast<int64_t>(beta)});
  }
}

/// The buffers of the primitive's arguments after (src, weights, dst): bias, then binary operands
/// of the steps it applies.
void AppendOperands(std::vector<void*>& ptrs, const Prim& prim, const Epilogue& e,
                    std::span<const TensorView> operands) {
  for (size_t k = 0; k < prim.epilogue_steps; ++k)
    if (e.steps[k].kind == EpilogueStep::kBinary) {
      const TensorView& o = operands[static_cast<size_t>(e.steps[k].operand)];
      KILN_CHECK(o.dtype == DType::kFloat32 && o.is_contiguous()) << "epilogue operands are contiguous float32";
      ptrs.push_back(o.data);
    }
}

}  // namespace

int MatmulEpilogue(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p,
                   const Epilogue& e, std::span<const TensorView> operands) {
  const int r = out.rank();
  Key k{static_cast<int64_t>(Kind::kMatmul), static_cast<int64_t>(dt::f32), p.transpose_a, p.transpose_b};
  Append(k, a.shape);
  Append(k, b.shape);
  AppendEpilogue(k, e);
  std::shared_ptr<Prim> prim = Cache().Get(k, [&] {
    return TryMake([&] {
      memory::desc am = MatmulOperand(a.shape, r, p.transpose_a, dt::f32);
      memory::desc bm = MatmulOperand(b.shape, r, p.transpose_b, dt::f32);
      memory::desc cm = MatmulOperand(out.shape, r, false, dt::f32);
      PostOps po = MakePostOps(e, out.shape, r - 1, false, false);
      auto d = po.bias ? dnnl::matmul::desc(am, bm, *po.bias, cm) : dnnl::matmul::desc(am, bm, cm);
      dnnl::matmul::primitive_desc pd(d, po.attr, Engine());
      std::vector<std::pair<int, memory::desc>> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
      if (po.bias) args.emplace_back(DNNL_ARG_BIAS, *po.bias);
      for (const auto& [arg, md, user] : po.binaries) args.emplace_back(arg, md);
      auto prim = MakePrim<dnnl::matmul>(pd, std::move(args));
      prim->epilogue_steps = po.steps;
      return prim;
    });
  });
  if (!prim) return -1;
  std::vector<void*> ptrs{a.data, b.data, out.data};
  AppendOperands(ptrs, *prim, e, operands);
  Execute(*prim, ptrs, out.shape.numel() * a.shape[a.rank() - (p.transpose_a ? 2 : 1)]);
  return static_cast<int>(prim->epilogue_steps);
}

int Conv2dEpilogue(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p,
                   const Epilogue& e, std::span<const TensorView> operands) {
  Key key = ConvKey(Kind::kConv, dt::f32, x.shape, w.shape, y.shape, p);
  AppendEpilogue(key, e);
  std::shared_ptr<Prim> prim = Cache().Get(key, [&] {
    return TryMake([&] {
      return ChooseConv(ConvOp::kForward, w.shape, [&](ConvLayout l) {
        PostOps po = MakePostOps(e, y.shape, 1, true, l == ConvLayout::kChannelsLast);
        auto pd = ConvForwardPD(x.shape, w.shape, y.shape, p, dt::f32, prop::forward_inference, l,
                                po.bias ? &*po.bias : nullptr, &po.attr);
        ConvDescs user(x.shape, w.shape, y.shape, p, dt::f32, ConvLayout::kPlain);
        ArgDescs args{{DNNL_ARG_SRC, pd.src_desc(), user.x},
                      {DNNL_ARG_WEIGHTS, pd.weights_desc(), user.w},
                      {DNNL_ARG_DST, pd.dst_desc(), user.y}};
        if (po.bias) args.emplace_back(DNNL_ARG_BIAS, *po.bias, *po.bias);
        args.insert(args.end(), po.binaries.begin(), po.binaries.end());
        auto prim = ConvPrim<dnnl::convolution_forward>(pd, l, args);
        if (prim) prim->epilogue_steps = po.steps;
        return prim;
      });
    });
  });
  if (!prim) return -1;
  std::vector<void*> ptrs{x.data, w.data, y.data};
  AppendOperands(ptrs, *prim, e, operands);
  Execute(*prim, ptrs);
  return static_cast<int>(prim->epilogue_steps);
}

}  // namespace onednn
}  // namespace kiln::host
