// The oneDNN primitive of each neural-network op (see onednn_prim.h): each builds (once, through
// the primitive cache) and runs the primitive for the call, or returns false where oneDNN has no
// kernel for the dtype or the case. Which kernel runs a call is nn_dispatch.cc's decision.
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cpu/copy.h"
#include "onednn_prim.h"

namespace kiln::host::onednn {

bool Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(out.dtype, &t)) {
    Key k{static_cast<int64_t>(Kind::kMatmul), static_cast<int64_t>(t), p.transpose_a, p.transpose_b};
    Append(k, a.shape);
    Append(k, b.shape);
    prim = Cache().Get(k, [&] {
      return TryMake([&] {
        int r = out.rank();
        memory::desc am = MatmulOperand(a.shape, r, p.transpose_a, t);
        memory::desc bm = MatmulOperand(b.shape, r, p.transpose_b, t);
        memory::desc cm = MatmulOperand(out.shape, r, false, t);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(am, bm, cm), UserScratchpad(), Engine());
        return MakePrim<dnnl::matmul>(pd, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      });
    });
  }
  if (!prim) return false;
  int64_t k = a.shape[a.rank() - (p.transpose_a ? 2 : 1)];
  Execute(*prim, {a.data, b.data, out.data}, out.shape.numel() * k);
  return true;
}

bool Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(y.dtype, &t))
    prim = Cache().Get(ConvKey(Kind::kConv, t, x.shape, w.shape, y.shape, p), [&] {
      return TryMake([&] {
        return ChooseConv(ConvOp::kForward, w.shape, [&](ConvLayout l) {
          auto pd = ConvForwardPD(x.shape, w.shape, y.shape, p, t, prop::forward_inference, l);
          ConvDescs user(x.shape, w.shape, y.shape, p, t, ConvLayout::kPlain);
          return ConvPrim<dnnl::convolution_forward>(pd, l,
                                                     {{DNNL_ARG_SRC, pd.src_desc(), user.x},
                                                      {DNNL_ARG_WEIGHTS, pd.weights_desc(), user.w},
                                                      {DNNL_ARG_DST, pd.dst_desc(), user.y}});
        });
      });
    });
  if (!prim) return false;
  Execute(*prim, {x.data, w.data, y.data});
  return true;
}

bool Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dx.dtype, &t))
    prim = Cache().Get(ConvKey(Kind::kConvData, t, dx.shape, w.shape, dy.shape, p), [&] {
      return TryMake([&] {
        return ChooseConv(ConvOp::kData, w.shape, [&](ConvLayout l) {
          auto hint = ConvForwardPD(dx.shape, w.shape, dy.shape, p, t, prop::forward_training, l);
          ConvGeometry g(p);
          ConvDescs m(dx.shape, w.shape, dy.shape, p, t, l);
          ConvDescs user(dx.shape, w.shape, dy.shape, p, t, ConvLayout::kPlain);
          dnnl::convolution_backward_data::desc d(alg::convolution_direct, m.x, m.w, m.y, g.strides,
                                                  g.dilates, g.pad_l, g.pad_r);
          dnnl::convolution_backward_data::primitive_desc pd(d, UserScratchpad(), Engine(), hint);
          return ConvPrim<dnnl::convolution_backward_data>(pd, l,
                                                           {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), user.y},
                                                            {DNNL_ARG_WEIGHTS, pd.weights_desc(), user.w},
                                                            {DNNL_ARG_DIFF_SRC, pd.diff_src_desc(), user.x}});
        });
      });
    });
  if (!prim) return false;
  Execute(*prim, {dy.data, w.data, dx.data});
  return true;
}

namespace {

// oneDNN 2.6 (Debian 12's libdnnl) computes the weight gradient of a strided 1x1 convolution,
// on AVX-512, by first gathering the strided input into per-thread scratchpad buffers; with more
// than 8 OpenMP threads those buffers run past the end of the scratchpad it asked for (by up to
// several KiB, depending on the shape and the threads: 8x4x28x28 -> 8 channels, stride 2, 16
// threads: 3-4.7 KiB; 64 threads: up to 8.5 KiB), corrupting the heap. Measured on the primitive alone, the other convolutions (strided 3x3, 1x1
// stride 1, the data gradient, the forward) stay inside theirs. So the weight gradient of a
// strided, unpadded 1x1 convolution is computed as that of a stride-1 one over the input
// subsampled by the strides, which is the same sum: kiln gathers the strided pixels itself.
bool StridedOneByOne(const Shape& w, const Conv2dParams& p) {
  return w[2] == 1 && w[3] == 1 && (p.stride[0] > 1 || p.stride[1] > 1) && p.padding[0] == 0 && p.padding[1] == 0;
}

bool Conv2dGradWeightPrim(const TensorView& dy, const TensorView& x, const TensorView& dw, const Conv2dParams& p);

bool Conv2dGradWeightSubsampled(const TensorView& dy, const TensorView& x, const TensorView& dw,
                                const Conv2dParams& p) {
  const Shape& ys = dy.shape;
  TensorView strided = x;  // x's pixels (oh * stride_h, ow * stride_w): the ones a 1x1 kernel reads
  strided.shape = Shape{x.shape[0], x.shape[1], ys[2], ys[3]};
  strided.strides[2] *= p.stride[0];
  strided.strides[3] *= p.stride[1];
  TensorView sub = strided;
  sub.strides = sub.shape.ContiguousStrides();
  const size_t bytes = static_cast<size_t>(sub.numel()) * DTypeSize(sub.dtype);
  Allocator& pool = GetAllocator(cpu());
  sub.data = bytes ? pool.Allocate(bytes) : nullptr;
  struct Release {
    Allocator& pool;
    void* p;
    size_t n;
    ~Release() {
      if (p) pool.Free(p, n);
    }
  } release{pool, sub.data, bytes};
  CopyConvert(strided, sub);
  Conv2dParams unit = p;
  unit.stride[0] = unit.stride[1] = 1;
  return Conv2dGradWeightPrim(dy, sub, dw, unit);
}

}  // namespace

bool Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                      const Conv2dParams& p) {
  dt t;
  if (OneDnnType(dw.dtype, &t) && StridedOneByOne(dw.shape, p) && x.numel() > 0)
    return Conv2dGradWeightSubsampled(dy, x, dw, p);
  return Conv2dGradWeightPrim(dy, x, dw, p);
}

namespace {

bool Conv2dGradWeightPrim(const TensorView& dy, const TensorView& x, const TensorView& dw,
                          const Conv2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dw.dtype, &t))
    prim = Cache().Get(ConvKey(Kind::kConvWeight, t, x.shape, dw.shape, dy.shape, p), [&] {
      return TryMake([&] {
        return ChooseConv(ConvOp::kWeight, dw.shape, [&](ConvLayout l) {
          auto hint = ConvForwardPD(x.shape, dw.shape, dy.shape, p, t, prop::forward_training, l);
          ConvGeometry g(p);
          ConvDescs m(x.shape, dw.shape, dy.shape, p, t, l);
          ConvDescs user(x.shape, dw.shape, dy.shape, p, t, ConvLayout::kPlain);
          dnnl::convolution_backward_weights::desc d(alg::convolution_direct, m.x, m.w, m.y, g.strides,
                                                     g.dilates, g.pad_l, g.pad_r);
          dnnl::convolution_backward_weights::primitive_desc pd(d, UserScratchpad(), Engine(), hint);
          return ConvPrim<dnnl::convolution_backward_weights>(
              pd, l,
              {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), user.y},
               {DNNL_ARG_SRC, pd.src_desc(), user.x},
               {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc(), user.w}});
        });
      });
    });
  if (!prim) return false;
  Execute(*prim, {dy.data, x.data, dw.data});
  return true;
}

}  // namespace

bool MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(y.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kMaxPool, t, x.shape, y.shape, p), [&] {
      return TryMake([&] {
        auto pd = PoolForwardPD(x.shape, y.shape, p, alg::pooling_max, t, prop::forward_inference);
        return MakePrim<dnnl::pooling_forward>(
            pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_DST, pd.dst_desc()}});
      });
    });
  if (!prim) return false;
  Execute(*prim, {x.data, y.data});
  return true;
}

bool MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dx.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kMaxPoolGrad, t, x.shape, dy.shape, p), [&] {
      return TryMake([&] {
        // oneDNN's max-pool backward reads the forward pass's workspace (where each max was), so
        // the gradient reruns the forward pass in training mode into a temporary first.
        auto fwd = PoolForwardPD(x.shape, dy.shape, p, alg::pooling_max, t, prop::forward_training);
        PoolGeometry g(p);
        dnnl::pooling_backward::desc d(alg::pooling_max, Plain(x.shape, t), Plain(dy.shape, t), g.strides,
                                       g.kernel, g.pad_l, g.pad_r);
        dnnl::pooling_backward::primitive_desc pd(d, UserScratchpad(), Engine(), fwd);
        auto bwd = MakePrim<dnnl::pooling_backward>(
            pd, {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc()}, {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()}});
        bwd->forward = MakePrim<dnnl::pooling_forward>(
            fwd, {{DNNL_ARG_SRC, fwd.src_desc()}, {DNNL_ARG_DST, fwd.dst_desc()}});
        return bwd;
      });
    });
  if (!prim) return false;
  Execute(*prim->forward, {x.data, Buffer(kTemp, prim->forward->args[1].second.get_size())});
  Execute(*prim, {dy.data, dx.data});
  return true;
}

bool AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(y.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kAvgPool, t, x.shape, y.shape, p), [&] {
      return TryMake([&] {
        auto pd = PoolForwardPD(x.shape, y.shape, p, AvgAlgorithm(p), t, prop::forward_inference);
        return MakePrim<dnnl::pooling_forward>(
            pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_DST, pd.dst_desc()}});
      });
    });
  if (!prim) return false;
  Execute(*prim, {x.data, y.data});
  return true;
}

bool AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p) {
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dx.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kAvgPoolGrad, t, dx.shape, dy.shape, p), [&] {
      return TryMake([&] {
        auto fwd = PoolForwardPD(dx.shape, dy.shape, p, AvgAlgorithm(p), t, prop::forward_training);
        PoolGeometry g(p);
        dnnl::pooling_backward::desc d(AvgAlgorithm(p), Plain(dx.shape, t), Plain(dy.shape, t), g.strides,
                                       g.kernel, g.pad_l, g.pad_r);
        dnnl::pooling_backward::primitive_desc pd(d, UserScratchpad(), Engine(), fwd);
        return MakePrim<dnnl::pooling_backward>(
            pd, {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc()}, {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()}});
      });
    });
  if (!prim) return false;
  Execute(*prim, {dy.data, dx.data});
  return true;
}

}  // namespace kiln::host::onednn
