// The optimizers' fused updates on GPUs (include/kiln/codegen/gpu_kernels.h): one launch of the
// hand-written kernel (codegen/cu/optim.cu) per parameter, on the calling engine worker's stream.
#include <string>

#include "kiln/codegen/cu_modules.h"
#include "kiln/codegen/gpu_kernels.h"
#include "kiln/runtime/error.h"
#include "gpu_launch.h"

namespace kiln::codegen {
namespace {

const char* Suffix(DType t) {
  KILN_CHECK(t == DType::kFloat32 || t == DType::kFloat64) << "optimizer updates take float32 or float64";
  return t == DType::kFloat32 ? "f32" : "f64";
}

void RequireModule() {
  if (!FindCuModule("optim"))
    KILN_THROW(DeviceError) << "optimizer updates on GPUs need the hand-written GPU kernels, which this build "
                               "left out (clang-19 was not found when it was configured); install clang-19 "
                               "(scripts/install-deps) and rebuild, or keep the parameters on kiln.cpu()";
}

}  // namespace

bool HaveGpuOptimizerKernels() { return FindCuModule("optim") != nullptr; }

void GpuSgdUpdate(const Device& d, DType dt, std::span<const GpuSgdParam> ps, double rescale, double clip,
                  double momentum) {
  RequireModule();
  void* fn = CuKernel(d, "optim", std::string("kiln_sgd_") + Suffix(dt));
  int clip_on = clip > 0;
  for (const GpuSgdParam& p : ps) {
    if (p.n == 0) continue;
    void *w = p.w, *g = p.g, *mom = p.mom;
    int64_t n = p.n;
    double lr = p.lr, wd = p.wd;
    void* args[] = {&w, &g, &mom, &n, &lr, &wd, &rescale, &clip, &momentum, &clip_on};
    LaunchGridStride(fn, n, args);
  }
}

void GpuAdamUpdate(const Device& d, DType dt, std::span<const GpuAdamParam> ps, const GpuAdamScalars& s) {
  RequireModule();
  void* fn = CuKernel(d, "optim", std::string("kiln_adam_") + Suffix(dt));
  int clip_on = s.clip > 0, decoupled = s.decoupled;
  double rescale = s.rescale, clip = s.clip, b1 = s.beta1, b2 = s.beta2, eps = s.eps, step = s.step_scale,
         bc2 = s.bc2_sqrt;
  for (const GpuAdamParam& p : ps) {
    if (p.n == 0) continue;
    void *w = p.w, *g = p.g, *m = p.m, *v = p.v;
    int64_t n = p.n;
    double lr = p.lr, wd = p.wd;
    void* args[] = {&w, &g, &m, &v, &n, &lr, &wd, &rescale, &clip, &b1, &b2, &eps, &step, &bc2, &clip_on, &decoupled};
    LaunchGridStride(fn, n, args);
  }
}

}  // namespace kiln::codegen
