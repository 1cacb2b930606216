// Creation ops: full, arange, and random draws. They take no inputs; the device comes from the
// caller. Random ops read the generator (seed, counter offset) that dispatch assigns them.
#include <cmath>

#include "infer_util.h"

namespace kiln::ir {

namespace {
Shape ShapeAttr(const OpDef& op, const Attrs& a) {
  const auto& dims = a.Ints("shape");
  for (int64_t d : dims)
    if (d < 0)
      KILN_THROW(ShapeError) << op.name << ": shape has a negative dimension " << d << "; sizes must be >= 0";
  return Shape(dims);
}

/// The parameters of a random draw: finite, low <= high, std >= 0 (NumPy and MXNet
/// refuse the same; a kernel would silently draw from a degenerate range).
void CheckRandomParams(const OpDef& op, const Attrs& a) {
  if (op.id == op::kRandomUniform) {
    double lo = a.Float("low"), hi = a.Float("high");
    if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
      KILN_THROW(ValueError) << op.name << ": expected finite bounds with low <= high, found low=" << lo
                             << ", high=" << hi << "; swap them if they are reversed";
  } else if (op.id == op::kRandomNormal) {
    double mean = a.Float("mean"), std = a.Float("std");
    if (!std::isfinite(mean) || !std::isfinite(std) || std < 0)
      KILN_THROW(ValueError) << op.name << ": expected a finite mean and a finite scale (std) >= 0, found mean="
                             << mean << ", std=" << std;
  }  // random_bernoulli's p is checked by its kernels (test_errors.py: a task error at the sync point)
}

void DeclareSource(OpTable& t, OpId id, std::vector<AttrSpec> attrs, bool random, const char* doc) {
  OpDef d(id);
  d.num_inputs = 0;
  d.fusion = random ? FusionKind::kOpaque : FusionKind::kElementwise;
  d.attrs = std::move(attrs);
  d.random = random;
  d.differentiable = false;
  d.doc = doc;
  d.infer = [random](const OpDef& op, std::span<const TensorType>, const Attrs& a) {
    DType t = a.Type("dtype");
    if (random && !IsFloat(t) && op.id != op::kRandomBernoulli)
      KILN_THROW(DTypeError) << op.name << ": expected a floating dtype, found " << DTypeName(t);
    if (random) CheckRandomParams(op, a);
    return One({ShapeAttr(op, a), t});
  };
  t.Add(std::move(d));
}
}  // namespace

void RegisterCreationOps(OpTable& t) {
  using K = AttrKind;
  const AttrSpec shape{"shape", K::kInts, std::nullopt};
  const AttrSpec f32{"dtype", K::kDType, DType::kFloat32};
  DeclareSource(t, op::kFull, {shape, {"value", K::kFloat, 0.0}, f32}, false, "a tensor filled with one value");
  DeclareSource(t, op::kRandomUniform, {shape, {"low", K::kFloat, 0.0}, {"high", K::kFloat, 1.0}, f32}, true,
                "uniform draws in [low, high)");
  DeclareSource(t, op::kRandomNormal, {shape, {"mean", K::kFloat, 0.0}, {"std", K::kFloat, 1.0}, f32}, true,
                "normal draws");
  DeclareSource(t, op::kRandomBernoulli, {shape, {"p", K::kFloat, 0.5}, f32}, true,
                "1 with probability p, else 0");

  OpDef d(op::kArange);
  d.num_inputs = 0;
  d.fusion = FusionKind::kElementwise;
  d.attrs = {{"start", K::kFloat, 0.0}, {"stop", K::kFloat, std::nullopt}, {"step", K::kFloat, 1.0}, f32};
  d.differentiable = false;
  d.doc = "start, start+step, ... below stop";
  d.infer = [](const OpDef& op, std::span<const TensorType>, const Attrs& a) {
    double start = a.Float("start"), stop = a.Float("stop"), step = a.Float("step");
    if (step == 0 || !std::isfinite(step) || !std::isfinite(start) || !std::isfinite(stop))
      KILN_THROW(ValueError) << "arange: step must be finite and non-zero and the bounds finite, found start="
                             << start << " stop=" << stop << " step=" << step;
    double count = std::ceil((stop - start) / step);
    if (!(count < 0x1p62))  // also NaN; converting a larger double to int64 is undefined
      KILN_THROW(ShapeError) << "arange: start=" << start << " stop=" << stop << " step=" << step
                             << " gives " << count << " elements; expected fewer than 2^62";
    int64_t n = std::max<int64_t>(0, static_cast<int64_t>(count));
    return One({Shape{n}, a.Type("dtype")});
  };
  t.Add(std::move(d));
}

}  // namespace kiln::ir
