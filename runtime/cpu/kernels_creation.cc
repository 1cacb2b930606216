// CPU kernels of the creation ops (the ops of ir/ops_creation.cc).
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/random.h"

namespace kiln {

namespace {
void Full(const KernelArgs& a) { host::Fill(a.out[0], a.attrs.Float("value")); }

void Arange(const KernelArgs& a) {
  double start = a.attrs.Float("start"), step = a.attrs.Float("step");
  const TensorView& o = a.out[0];
  KILN_DISPATCH_ALL(o.dtype, {
    scalar_t* y = o.ptr<scalar_t>();
    host::ParallelFor(o.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(start + step * i));
    });
  });
}

void Uniform(const KernelArgs& a) {
  host::RandomUniform(a.out[0], a.attrs.Float("low"), a.attrs.Float("high"), a.seed, a.offset);
}
void Normal(const KernelArgs& a) {
  host::RandomNormal(a.out[0], a.attrs.Float("mean"), a.attrs.Float("std"), a.seed, a.offset);
}
void Bernoulli(const KernelArgs& a) {
  double p = a.attrs.Float("p");
  if (!(p >= 0 && p <= 1)) KILN_THROW(ValueError) << "random_bernoulli: p must be in [0, 1], found " << p;
  host::RandomBernoulli(a.out[0], p, a.seed, a.offset);
}
}  // namespace

void BindCreationKernels(KernelTable& t) {
  t.Bind(op::kFull, DeviceType::kCPU, {Full});
  t.Bind(op::kArange, DeviceType::kCPU, {Arange});
  t.Bind(op::kRandomUniform, DeviceType::kCPU, {Uniform});
  t.Bind(op::kRandomNormal, DeviceType::kCPU, {Normal});
  t.Bind(op::kRandomBernoulli, DeviceType::kCPU, {Bernoulli});
}

}  // namespace kiln
