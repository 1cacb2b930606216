// GPU kernels of the creation ops arange, random_uniform, random_normal and random_bernoulli:
// hand-written (codegen/cu/creation.cu), every dtype the ops take (float16 and bfloat16 computed
// through float and rounded as the CPU rounds them). The random ones
// draw from the CPU's counter-based stream (runtime/cpu/random.h) at the same (seed, offset), so
// the same seed gives the same numbers on both devices.
#include <string>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/kernel.h"
#include "kiln/codegen/cu_modules.h"
#include "gpu_launch.h"

namespace kiln::codegen {
namespace {


/// The kernel name's dtype suffix.
const char* Suffix(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat64: return "f64";
    case DType::kInt32: return "i32";
    case DType::kInt64: return "i64";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kUInt8: return "u8";
    case DType::kBool: return "b8";
  }
  return "";
}

/// Runs kiln_random_<kind>_<dtype>(out, n, state, seed, offset, a, b) over the output: a
/// counter-based draw, so the launch shape does not change the numbers (one thread per block of 4
/// elements). With a.random_state (a plan captured into a CUDA graph) the seed and the call's base
/// offset are read on the device, and a.offset is the draw's offset from that base.
void Draw(const KernelArgs& a, const char* kind, double x, double y) {
  const TensorView& out = a.out[0];
  int64_t n = out.shape.numel();
  if (n == 0) return;
  KILN_CHECK(a.offset % 4 == 0) << a.op.name << ": the counter offset is a multiple of 4";
  void* fn = CuKernel(a.device, "creation", std::string("kiln_random_") + kind + "_" + Suffix(out.dtype));
  void* ptr = out.data;
  const uint64_t* state = a.random_state;
  uint64_t seed = a.seed, offset = a.offset;
  void* args[] = {&ptr, &n, &state, &seed, &offset, &x, &y};
  LaunchGridStride(fn, (n + 3) / 4, args);
}

void UniformGpu(const KernelArgs& a) { Draw(a, "uniform", a.attrs.Float("low"), a.attrs.Float("high")); }
void NormalGpu(const KernelArgs& a) { Draw(a, "normal", a.attrs.Float("mean"), a.attrs.Float("std")); }
void BernoulliGpu(const KernelArgs& a) {
  const double p = a.attrs.Float("p");
  if (!(p >= 0 && p <= 1)) KILN_THROW(ValueError) << "random_bernoulli: p must be in [0, 1], found " << p;
  Draw(a, "bernoulli", p, 0);
}

void ArangeGpu(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  int64_t n = out.shape.numel();
  if (n == 0) return;
  void* fn = CuKernel(a.device, "creation", std::string("kiln_arange_") + Suffix(out.dtype));
  void* ptr = out.data;
  double start = a.attrs.Float("start"), step = a.attrs.Float("step");
  void* args[] = {&ptr, &n, &start, &step};
  LaunchGridStride(fn, n, args);
}

// exec::RandomStateKernels: a captured plan's random state (creation.cu).
void SetRandomStateGpu(const Device& d, uint64_t* state, uint64_t seed, uint64_t offset) {
  void* fn = CuKernel(d, "creation", "kiln_random_set_state");
  void* args[] = {&state, &seed, &offset};
  LaunchGridStride(fn, 1, args);
}

void AdvanceRandomStateGpu(const Device& d, uint64_t* state, uint64_t draws) {
  void* fn = CuKernel(d, "creation", "kiln_random_advance");
  void* args[] = {&state, &draws};
  LaunchGridStride(fn, 1, args);
}

}  // namespace

void BindGpuCreationKernels(KernelTable& t) {
  if (!FindCuModule("creation")) return;  // built without clang-19: no GPU kernels for these ops
  t.Bind(op::kRandomUniform, DeviceType::kGPU, {UniformGpu});
  t.Bind(op::kRandomNormal, DeviceType::kGPU, {NormalGpu});
  t.Bind(op::kRandomBernoulli, DeviceType::kGPU, {BernoulliGpu});
  t.Bind(op::kArange, DeviceType::kGPU, {ArangeGpu});
  exec::GpuRandomStateKernels() = {SetRandomStateGpu, AdvanceRandomStateGpu};
}

}  // namespace kiln::codegen
