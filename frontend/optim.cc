// Fused multi-tensor SGD and Adam updates (see include/kiln/frontend/optim.h).
//
// The arguments are checked on the calling thread (errors name the parameter's index); then one
// engine task reads every gradient and writes every weight and state. On a GPU the task launches
// the hand-written update kernel (codegen/cu/optim.cu) once per parameter. On the CPU the
// parameters' elements form one flat range [0, total) that ParallelFor splits into chunks; a
// chunk may span several parameters, so many small parameters (biases) still share threads
// well. The per-element loops take raw pointers and loop-invariant options as template
// parameters, so the compiler vectorizes them.
#include "kiln/frontend/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#if KILN_WITH_CODEGEN
#include "kiln/codegen/gpu_kernels.h"
#endif
#include "kiln/frontend/call_site.h"
#include "kiln/frontend/deferred.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"

namespace kiln::optim {

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per chunk, at least

// ---- argument checks ---------------------------------------------------------------------------

// One list of tensors that must match the weights one for one.
struct Operand {
  const char* what;  // "gradient", "momentum", "mean", "variance"
  std::span<const Tensor> list;
};

std::vector<double> Mults(const char* op, const char* what, const std::vector<double>& given, size_t n) {
  if (given.empty()) return std::vector<double>(n, 1.0);
  if (given.size() != n)
    KILN_THROW(ValueError) << op << ": " << given.size() << " " << what << " values for " << n
                           << " parameters; pass one per parameter or none";
  return given;
}

// Whether this build updates parameters on GPUs (codegen/cu/optim.cu).
bool GpuUpdates() {
#if KILN_WITH_CODEGEN
  return codegen::HaveGpuOptimizerKernels();
#else
  return false;
#endif
}

// Checks that every operand matches its weight and that all live on one device; returns the
// common dtype (unused when there are no parameters).
DType Check(const char* op, std::span<const Tensor> weights, std::initializer_list<Operand> operands) {
  size_t n = weights.size();
  for (const Operand& o : operands)
    if (o.list.size() != n)
      KILN_THROW(ValueError) << op << ": " << n << " weights but " << o.list.size() << " " << o.what
                             << " arrays; pass one per weight";
  if (n == 0) return DType::kFloat32;
  for (size_t i = 0; i < n; ++i) {
    if (!weights[i].defined()) KILN_THROW(ValueError) << op << ": weight " << i << " is an undefined tensor";
    for (const Operand& o : operands)
      if (!o.list[i].defined())
        KILN_THROW(ValueError) << op << ": the " << o.what << " of parameter " << i
                               << " is an undefined tensor";
  }
  Device dev = weights[0].device();
  DType dt = weights[0].dtype();
  for (size_t i = 0; i < n; ++i) {
    const Tensor& w = weights[i];
    auto check_one = [&](const Tensor& t, const char* what) {
      if (t.device().is_gpu() && !GpuUpdates())
        KILN_THROW(DeviceError) << op << ": the " << what << " of parameter " << i << " is on "
                                << t.device().str() << "; this build has no GPU kernels for optimizer updates "
                                << "(built without LLVM or clang-19); keep the parameters on kiln.cpu()";
      if (!(t.device() == dev))
        KILN_THROW(DeviceError) << op << ": the " << what << " of parameter " << i << " is on "
                                << t.device().str() << " but weight 0 is on " << dev.str()
                                << "; make one call per device";
      if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat64)
        KILN_THROW(DTypeError) << op << ": the " << what << " of parameter " << i << " has dtype "
                               << DTypeName(t.dtype())
                               << "; expected float32 or float64 (cast it with astype)";
      if (t.dtype() != dt)
        KILN_THROW(DTypeError) << op << ": the " << what << " of parameter " << i << " has dtype "
                               << DTypeName(t.dtype()) << " but weight 0 has dtype " << DTypeName(dt)
                               << "; weights, gradients and states of one call must share a dtype";
      if (t.shape() != w.shape())
        KILN_THROW(ShapeError) << op << ": the " << what << " of parameter " << i << " has shape "
                               << t.shape().str() << " but its weight has shape " << w.shape().str();
      if (!t.is_contiguous())
        KILN_THROW(ValueError) << op << ": the " << what << " of parameter " << i
                               << " is not contiguous; pass a contiguous array (.copy())";
    };
    check_one(w, "weight");
    for (const Operand& o : operands) check_one(o.list[i], o.what);
  }
  // The same weight twice would be updated twice, by two threads at once.
  std::vector<std::pair<const void*, size_t>> ptrs;
  for (size_t i = 0; i < n; ++i) ptrs.emplace_back(weights[i].View().data, i);
  std::sort(ptrs.begin(), ptrs.end());
  for (size_t k = 1; k < n; ++k)
    if (ptrs[k].first == ptrs[k - 1].first && weights[ptrs[k].second].numel() > 0)
      KILN_THROW(ValueError) << op << ": parameters " << std::min(ptrs[k - 1].second, ptrs[k].second)
                             << " and "
                             << std::max(ptrs[k - 1].second, ptrs[k].second)
                             << " are the same array; pass each weight once";
  return dt;
}

// ---- the task ----------------------------------------------------------------------------------

// Runs seg(i, begin, end) over the flat element range of the parameters, in parallel; `prefix`
// holds each parameter's first flat index, and the total at the end.
template <class F>
void ForEachSegment(const std::vector<int64_t>& prefix, F&& seg) {
  host::ParallelFor(prefix.back(), kGrain, [&](int64_t b, int64_t e) {
    size_t i = std::upper_bound(prefix.begin(), prefix.end(), b) - prefix.begin() - 1;
    for (; b < e; ++i) {
      int64_t end = std::min(e, prefix[i + 1]);
      if (end > b) seg(i, b - prefix[i], end - prefix[i]);
      b = std::max(b, end);
    }
  });
}

// Pushes one task running body() that reads `reads` and writes the tensors of `writes`; the
// storages stay alive until it has run.
template <class Body>
void PushTask(const char* name, Device device, std::span<const Tensor> reads,
              std::initializer_list<std::span<const Tensor>> writes, Body body) {
  std::vector<engine::Var*> r, w;
  std::vector<StoragePtr> keep;
  for (const Tensor& t : reads) r.push_back(t.storage()->var()), keep.push_back(t.storage());
  for (std::span<const Tensor> list : writes)
    for (const Tensor& t : list) w.push_back(t.storage()->var()), keep.push_back(t.storage());
  engine::TaskOptions opts;
  opts.device = device;
  opts.name = name;
  opts.call_site = CurrentCallSite();
  auto task = std::make_shared<std::pair<Body, std::vector<StoragePtr>>>(std::move(body), std::move(keep));
  engine::Engine::Get().Push([task] { task->first(); }, r, w, opts);
}

std::vector<int64_t> Prefix(std::span<const Tensor> weights) {
  std::vector<int64_t> p(weights.size() + 1, 0);
  for (size_t i = 0; i < weights.size(); ++i) p[i + 1] = p[i] + weights[i].numel();
  return p;
}

template <class T>
T* Ptr(const Tensor& t) {
  return t.View().template ptr<T>();
}

// ---- SGD ---------------------------------------------------------------------------------------

template <class T>
struct SGDParam {
  T* w;
  const T* g;
  T* mom;  // null without momentum
  T lr, wd;
};

template <class T, bool kMom, bool kClip>
void SGDKernel(const SGDParam<T>& p, int64_t b, int64_t e, T rescale, T clip, T momentum) {
  T* w = p.w;
  const T* g = p.g;
  T* m = p.mom;
  const T lr = p.lr, wd = p.wd;
  for (int64_t k = b; k < e; ++k) {
    T gk = rescale * g[k];
    if constexpr (kClip) gk = std::min(std::max(gk, -clip), clip);
    gk += wd * w[k];
    if constexpr (kMom) {
      m[k] = momentum * m[k] - lr * gk;
      w[k] += m[k];
    } else {
      w[k] -= lr * gk;
    }
  }
}

template <class T>
void PushSGD(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> moms,
             const SGDOptions& o, bool mom) {
  std::vector<double> lr = Mults("sgd_update", "lr_mult", o.lr_mult, weights.size());
  std::vector<double> wd = Mults("sgd_update", "wd_mult", o.wd_mult, weights.size());
  std::vector<SGDParam<T>> ps(weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    ps[i] = {Ptr<T>(weights[i]), Ptr<T>(grads[i]), mom ? Ptr<T>(moms[i]) : nullptr, T(o.lr * lr[i]),
             T(o.wd * wd[i])};
#if KILN_WITH_CODEGEN
  if (weights[0].device().is_gpu()) {  // one launch per parameter on the device's stream
    std::vector<codegen::GpuSgdParam> gp(weights.size());
    for (size_t i = 0; i < weights.size(); ++i)
      gp[i] = {ps[i].w, const_cast<T*>(ps[i].g), ps[i].mom, weights[i].numel(), double(ps[i].lr), double(ps[i].wd)};
    const Device dev = weights[0].device();
    const DType dt = DTypeOf<T>::value;
    PushTask("sgd_update", dev, grads, {weights, mom ? moms : std::span<const Tensor>()},
             [gp = std::move(gp), dev, dt, o] {
               codegen::GpuSgdUpdate(dev, dt, gp, o.rescale_grad, o.clip_gradient, o.momentum);
             });
    return;
  }
#endif
  bool clip = o.clip_gradient > 0;
  T rescale = T(o.rescale_grad), c = T(o.clip_gradient), momentum = T(o.momentum);
  auto run = [ps = std::move(ps), prefix = Prefix(weights), mom, clip, rescale, c, momentum] {
    auto kernel = mom ? (clip ? SGDKernel<T, true, true> : SGDKernel<T, true, false>)
                      : (clip ? SGDKernel<T, false, true> : SGDKernel<T, false, false>);
    ForEachSegment(prefix,
                   [&](size_t i, int64_t b, int64_t e) { kernel(ps[i], b, e, rescale, c, momentum); });
  };
  PushTask("sgd_update", weights[0].device(), grads, {weights, mom ? moms : std::span<const Tensor>()},
           std::move(run));
}

// ---- Adam --------------------------------------------------------------------------------------

template <class T>
struct AdamParam {
  T *w;
  const T* g;
  T *m, *v;
  T lr, wd;
};

struct AdamScalars {
  double rescale, clip, beta1, beta2, eps, step_scale /*1/(1-beta1^t)*/, bc2_sqrt /*sqrt(1-beta2^t)*/;
};

// GCC keeps this loop scalar: with -fmath-errno (kiln's default) sqrt may set errno. The update
// is memory bound (7 loads and stores per element), so that costs little on large parameters.
template <class T, bool kClip, bool kDecoupled>
void AdamKernel(const AdamParam<T>& p, int64_t b, int64_t e, const AdamScalars& s) {
  T* w = p.w;
  const T* g = p.g;
  T *m = p.m, *v = p.v;
  const T rescale = T(s.rescale), clip = T(s.clip), b1 = T(s.beta1), b2 = T(s.beta2), eps = T(s.eps);
  const T c1 = T(1) - b1, c2 = T(1) - b2, inv_bc2 = T(1 / s.bc2_sqrt);
  const T step = T(p.lr * s.step_scale), decay = p.lr * p.wd, wd = p.wd;
  for (int64_t k = b; k < e; ++k) {
    T gk = rescale * g[k];
    if constexpr (!kDecoupled) gk += wd * w[k];
    if constexpr (kClip) gk = std::min(std::max(gk, -clip), clip);
    T mk = b1 * m[k] + c1 * gk;
    T vk = b2 * v[k] + c2 * gk * gk;
    m[k] = mk, v[k] = vk;
    T wk = w[k];
    if constexpr (kDecoupled) wk -= decay * wk;
    w[k] = wk - step * mk / (std::sqrt(vk) * inv_bc2 + eps);
  }
}

template <class T>
void PushAdam(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> means,
              std::span<const Tensor> vars, const AdamOptions& o) {
  const char* name = o.decoupled ? "adamw_update" : "adam_update";
  std::vector<double> lr = Mults(name, "lr_mult", o.lr_mult, weights.size());
  std::vector<double> wd = Mults(name, "wd_mult", o.wd_mult, weights.size());
  std::vector<AdamParam<T>> ps(weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    ps[i] = {Ptr<T>(weights[i]), Ptr<T>(grads[i]), Ptr<T>(means[i]), Ptr<T>(vars[i]), T(o.lr * lr[i]),
             T(o.wd * wd[i])};
  double t = static_cast<double>(o.t);
  AdamScalars s{o.rescale_grad, o.clip_gradient, o.beta1, o.beta2, o.epsilon,
                1 / (1 - std::pow(o.beta1, t)), std::sqrt(1 - std::pow(o.beta2, t))};
#if KILN_WITH_CODEGEN
  if (weights[0].device().is_gpu()) {  // one launch per parameter on the device's stream
    std::vector<codegen::GpuAdamParam> gp(weights.size());
    for (size_t i = 0; i < weights.size(); ++i)
      gp[i] = {ps[i].w, const_cast<T*>(ps[i].g), ps[i].m, ps[i].v, weights[i].numel(), double(ps[i].lr),
               double(ps[i].wd)};
    const Device dev = weights[0].device();
    const DType dt = DTypeOf<T>::value;
    codegen::GpuAdamScalars gs{s.rescale, s.clip, s.beta1, s.beta2, s.eps, s.step_scale, s.bc2_sqrt, o.decoupled};
    PushTask(name, dev, grads, {weights, means, vars},
             [gp = std::move(gp), dev, dt, gs] { codegen::GpuAdamUpdate(dev, dt, gp, gs); });
    return;
  }
#endif
  bool clip = o.clip_gradient > 0, dec = o.decoupled;
  auto run = [ps = std::move(ps), prefix = Prefix(weights), s, clip, dec] {
    auto kernel = clip ? (dec ? AdamKernel<T, true, true> : AdamKernel<T, true, false>)
                       : (dec ? AdamKernel<T, false, true> : AdamKernel<T, false, false>);
    ForEachSegment(prefix, [&](size_t i, int64_t b, int64_t e) { kernel(ps[i], b, e, s); });
  };
  PushTask(name, weights[0].device(), grads, {weights, means, vars}, std::move(run));
}

// ---- joined with the step ----------------------------------------------------------------------
//
// When the gradients are still being computed by a held training step (deferred.h), the update
// runs as graph ops joined into the step's plan, so that the whole step is one plan (one CUDA
// graph replay) with nothing outside it. The learning rate and rescale_grad (1 / batch size,
// which changes with the batch, or the token count) are inputs (0-d tensors on the device), so
// a schedule or another batch size replays the same plan; momentum, wd, clip_gradient and the
// multipliers are constants of the graph (the cache key names them). A rate with lr_mult != 1 is
// lr * lr_mult in the weights' dtype, where the fused task rounds the product once from double:
// they may differ by one unit in the last place.

constexpr int64_t kMaxJoinedUpdateBytes = int64_t{128} << 20;  // ResNet-18's weights and momenta fit

// `value` as a 0-d tensor of `dt` on `device` (`what`: "lr", "rescale_grad"). A new value is
// written into the same tensor (one small task, no allocation; its address, which a captured
// CUDA graph reads, stays), after the plans that read the old one (the engine orders the write).
Tensor ScalarInput(const char* what, Device device, DType dt, double value) {
  static std::mutex mu;
  static auto* held = new std::map<std::string, std::pair<double, Tensor>>();  // leaked: read at exit
  // One per thread: a value is written, then the update that reads it is pushed, in this
  // thread's order (another thread's write could come in between).
  std::ostringstream key;
  key << what << ' ' << device.str() << DTypeName(dt) << ' ' << std::this_thread::get_id();
  Tensor t;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = held->find(key.str());
    if (it != held->end()) {
      if (it->second.first == value) return it->second.second;
      t = it->second.second;
    }
  }
  // Written outside the lock: a push may wait for room in the engine's queue, letting go of the GIL.
  if (t.defined()) {
    Tensor outs[1] = {t};
    InvokeInto(op::kFull, {}, {{"shape", std::vector<int64_t>{}}, {"value", value}, {"dtype", dt}}, outs);
  } else {
    t = nd::full(Shape{}, value, dt, device);
  }
  std::lock_guard<std::mutex> lock(mu);
  (*held)[key.str()] = {value, t};
  return t;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Each weight's shape, lr_mult and wd_mult, for a joined update's cache key.
void AddShapes(std::string& key, std::span<const Tensor> weights, const std::vector<double>& lr,
               const std::vector<double>& wd) {
  for (size_t i = 0; i < weights.size(); ++i) {
    key += ' ';
    key += weights[i].shape().str();
    key += '*';
    key += Num(lr[i]);
    key += ',';
    key += Num(wd[i]);
  }
}

// "w3": input names. (Not `"w" + std::to_string(i)`, which g++ 12 warns about wrongly, -Wrestrict.)
std::string InputName(char what, size_t i) {
  std::string name(1, what);
  name += std::to_string(i);
  return name;
}

// The SGD update of SGDKernel as graph ops: inputs the weights, the gradients, the momenta (with
// momentum), the rate and rescale_grad; outputs the new weights, then the new momenta.
std::unique_ptr<ir::Graph> SGDGraph(std::span<const Tensor> weights, const SGDOptions& o, bool mom, DType dt,
                                    const std::vector<double>& lr_mult, const std::vector<double>& wd_mult) {
  auto g = std::make_unique<ir::Graph>();
  ir::Builder b(*g);
  const size_t n = weights.size();
  std::vector<ir::Value*> w(n), gr(n), m(n), outs;
  for (size_t i = 0; i < n; ++i) w[i] = g->AddInput(InputName('w', i), {weights[i].shape(), dt});
  for (size_t i = 0; i < n; ++i) gr[i] = g->AddInput(InputName('g', i), {weights[i].shape(), dt});
  if (mom)
    for (size_t i = 0; i < n; ++i) m[i] = g->AddInput(InputName('m', i), {weights[i].shape(), dt});
  ir::Value* lr = g->AddInput("lr", {Shape{}, dt});
  ir::Value* rescale = g->AddInput("rescale_grad", {Shape{}, dt});
  std::vector<ir::Value*> new_m;
  for (size_t i = 0; i < n; ++i) {
    ir::Value* gk = b.Mul(rescale, gr[i]);
    if (o.clip_gradient > 0)
      gk = b.Op(op::kMinimum, {b.Op(op::kMaximum, {gk, b.Scalar(-o.clip_gradient, dt)}), b.Scalar(o.clip_gradient, dt)});
    const double wd = o.wd * wd_mult[i];
    if (wd != 0) gk = b.Add(gk, b.Mul(b.Scalar(wd, dt), w[i]));
    ir::Value* rate = lr_mult[i] == 1 ? lr : b.Mul(lr, b.Scalar(lr_mult[i], dt));
    if (mom) {
      ir::Value* mk = b.Sub(b.Mul(b.Scalar(o.momentum, dt), m[i]), b.Mul(rate, gk));
      new_m.push_back(mk);
      outs.push_back(b.Add(w[i], mk));
    } else {
      outs.push_back(b.Sub(w[i], b.Mul(rate, gk)));
    }
  }
  outs.insert(outs.end(), new_m.begin(), new_m.end());
  g->SetOutputs(std::move(outs));
  return g;
}

// The update joined with the held step whose gradients it reads; false when none is held (the
// caller pushes its task).
bool JoinSGD(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> moms,
             const SGDOptions& o, bool mom, DType dt) {
  const Device device = weights[0].device();
  if (!deferred::HoldsStep(device)) return false;  // (the scalar inputs would be tasks for nothing)
  // Joined, the new weights and momenta are late outputs: in the plan's arena until it ends, a
  // second copy where the planner cannot reuse the activations' memory for them (a model whose
  // parameters outweigh its activations). A larger update runs in place after the step.
  int64_t late_bytes = 0;
  for (const Tensor& w : weights) late_bytes += w.numel() * static_cast<int64_t>(DTypeSize(dt)) * (mom ? 2 : 1);
  if (late_bytes > kMaxJoinedUpdateBytes) return false;
  std::vector<double> lr = Mults("sgd_update", "lr_mult", o.lr_mult, weights.size());
  std::vector<double> wd = Mults("sgd_update", "wd_mult", o.wd_mult, weights.size());
  std::string key = "sgd_update " + std::string(DTypeName(dt)) + " momentum " + Num(o.momentum) + " wd " +
                    Num(o.wd) + " clip " + Num(o.clip_gradient);
  AddShapes(key, weights, lr, wd);
  std::vector<Tensor> in(weights.begin(), weights.end()), out(weights.begin(), weights.end());
  in.insert(in.end(), grads.begin(), grads.end());
  if (mom) {
    in.insert(in.end(), moms.begin(), moms.end());
    out.insert(out.end(), moms.begin(), moms.end());
  }
  in.push_back(ScalarInput("lr", device, dt, o.lr));
  in.push_back(ScalarInput("rescale_grad", device, dt, o.rescale_grad));
  return deferred::RunUpdate(key, device, in, out, [&] { return SGDGraph(weights, o, mom, dt, lr, wd); });
}

// Adam's step count t on the device (a 0-d float64 tensor) per device and parameter set: the
// joined update computes its bias corrections from it and writes t + 1 back, so a step passes no
// new value from the host. `held` is the count it holds once the updates queued so far have run.
// A joined update that fails fails the weights' task too: what reads them next (the next step
// included) raises, so the count never drifts from the weights (and a failed count is replaced,
// StepCountBefore).
struct StepCount {
  int64_t held = 0;
  Tensor t;
};

std::mutex g_counts_mu;
std::map<std::string, StepCount>& StepCounts() {
  static auto* counts = new std::map<std::string, StepCount>();  // leaked: read at exit
  return *counts;
}

std::string StepCountKey(std::span<const Tensor> weights) {
  std::string key = weights[0].device().str();
  key += ' ';
  key += std::to_string(reinterpret_cast<uintptr_t>(weights[0].storage().get()));
  key += ' ';
  key += std::to_string(weights.size());
  return key;
}

// The step count tensor holding t - 1 for the update of step `t` of `weights`: the one the last
// joined update of these weights advanced, or a new one (a task) where it holds another count
// (the first joined step, a step run apart, a count the caller set).
Tensor StepCountBefore(std::span<const Tensor> weights, int64_t t) {
  const std::string key = StepCountKey(weights);
  {
    std::lock_guard<std::mutex> lock(g_counts_mu);
    auto it = StepCounts().find(key);
    // A count whose update failed carries the failure (an error on its variable) into every
    // plan that reads it: a fresh one lets training go on once the user restored the weights.
    if (it != StepCounts().end() && it->second.held == t - 1 &&
        !engine::Engine::Get().VarError(it->second.t.storage()->var()))
      return it->second.t;
  }
  // Made outside the lock: a push may wait for room in the engine's queue, letting go of the GIL.
  Tensor fresh = nd::full(Shape{}, static_cast<double>(t - 1), DType::kFloat64, weights[0].device());
  std::lock_guard<std::mutex> lock(g_counts_mu);
  StepCounts()[key] = {t - 1, fresh};
  return fresh;
}

// Once the update of step `t` joined: `count` will hold t.
void Advanced(std::span<const Tensor> weights, const Tensor& count, int64_t t) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  StepCounts()[StepCountKey(weights)] = {t, count};
}

// The Adam update of AdamKernel as graph ops, in its order and its roundings (up to the fused
// multiply-adds either compiler may form, and the device's pow on a GPU): inputs the weights,
// gradients, means and variances, then the rate (float64), rescale_grad and the step count before
// this step (float64); outputs the new weights, means, variances and step count.
std::unique_ptr<ir::Graph> AdamGraph(std::span<const Tensor> weights, const AdamOptions& o, DType dt,
                                     const std::vector<double>& lr_mult, const std::vector<double>& wd_mult) {
  auto g = std::make_unique<ir::Graph>();
  ir::Builder b(*g);
  const DType f64 = DType::kFloat64;
  const size_t n = weights.size();
  std::vector<ir::Value*> w(n), gr(n), m(n), v(n), new_w, new_m, new_v;
  for (size_t i = 0; i < n; ++i) w[i] = g->AddInput(InputName('w', i), {weights[i].shape(), dt});
  for (size_t i = 0; i < n; ++i) gr[i] = g->AddInput(InputName('g', i), {weights[i].shape(), dt});
  for (size_t i = 0; i < n; ++i) m[i] = g->AddInput(InputName('m', i), {weights[i].shape(), dt});
  for (size_t i = 0; i < n; ++i) v[i] = g->AddInput(InputName('v', i), {weights[i].shape(), dt});
  ir::Value* lr = g->AddInput("lr", {Shape{}, f64});
  ir::Value* rescale = g->AddInput("rescale_grad", {Shape{}, dt});
  ir::Value* t_before = g->AddInput("t", {Shape{}, f64});
  // The bias corrections, in double as PushAdam computes them on the host.
  ir::Value* t = b.Add(t_before, b.Scalar(1, f64));
  ir::Value* one = b.Scalar(1, f64);
  ir::Value* step_scale = b.Div(one, b.Sub(one, b.Op(op::kPow, {b.Scalar(o.beta1, f64), t})));
  ir::Value* bc2_sqrt = b.Op(op::kSqrt, {b.Sub(one, b.Op(op::kPow, {b.Scalar(o.beta2, f64), t}))});
  ir::Value* inv_bc2 = b.Cast(b.Div(one, bc2_sqrt), dt);
  // The constants in the weights' dtype, as AdamKernel rounds them.
  auto in_dt = [&](double x) { return dt == DType::kFloat32 ? static_cast<double>(static_cast<float>(x)) : x; };
  const double b1 = in_dt(o.beta1), b2 = in_dt(o.beta2);
  const double c1 = in_dt(in_dt(1) - b1), c2 = in_dt(in_dt(1) - b2);
  for (size_t i = 0; i < n; ++i) {
    ir::Value* rate = b.Cast(b.Mul(lr, b.Scalar(lr_mult[i], f64)), dt);  // T(lr * lr_mult)
    ir::Value* step = b.Cast(b.Mul(b.Cast(rate, f64), step_scale), dt);  // T(p.lr * step_scale)
    const double wd = in_dt(o.wd * wd_mult[i]);
    ir::Value* gk = b.Mul(rescale, gr[i]);
    if (!o.decoupled && wd != 0) gk = b.Add(gk, b.Mul(b.Scalar(wd, dt), w[i]));
    if (o.clip_gradient > 0)
      gk = b.Op(op::kMinimum, {b.Op(op::kMaximum, {gk, b.Scalar(-o.clip_gradient, dt)}), b.Scalar(o.clip_gradient, dt)});
    ir::Value* mk = b.Add(b.Mul(b.Scalar(b1, dt), m[i]), b.Mul(b.Scalar(c1, dt), gk));
    ir::Value* vk = b.Add(b.Mul(b.Scalar(b2, dt), v[i]), b.Mul(b.Mul(b.Scalar(c2, dt), gk), gk));
    ir::Value* wk = w[i];
    if (o.decoupled && wd != 0) wk = b.Sub(wk, b.Mul(b.Mul(rate, b.Scalar(wd, dt)), wk));
    ir::Value* denom = b.Add(b.Mul(b.Op(op::kSqrt, {vk}), inv_bc2), b.Scalar(o.epsilon, dt));
    new_w.push_back(b.Sub(wk, b.Div(b.Mul(step, mk), denom)));
    new_m.push_back(mk);
    new_v.push_back(vk);
  }
  std::vector<ir::Value*> outs = new_w;
  outs.insert(outs.end(), new_m.begin(), new_m.end());
  outs.insert(outs.end(), new_v.begin(), new_v.end());
  outs.push_back(t);
  g->SetOutputs(std::move(outs));
  return g;
}

// The Adam update joined with the held step whose gradients it reads (as JoinSGD).
bool JoinAdam(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> means,
              std::span<const Tensor> vars, const AdamOptions& o, DType dt) {
  const Device device = weights[0].device();
  if (!deferred::HoldsStep(device)) return false;
  int64_t late_bytes = 0;
  for (const Tensor& w : weights) late_bytes += w.numel() * static_cast<int64_t>(DTypeSize(dt)) * 3;
  if (late_bytes > kMaxJoinedUpdateBytes) return false;
  const char* name = o.decoupled ? "adamw_update" : "adam_update";
  std::vector<double> lr = Mults(name, "lr_mult", o.lr_mult, weights.size());
  std::vector<double> wd = Mults(name, "wd_mult", o.wd_mult, weights.size());
  std::string key = std::string(name) + " " + DTypeName(dt) + " beta1 " + Num(o.beta1) + " beta2 " + Num(o.beta2) +
                    " eps " + Num(o.epsilon) + " wd " + Num(o.wd) + " clip " + Num(o.clip_gradient);
  AddShapes(key, weights, lr, wd);
  Tensor count = StepCountBefore(weights, o.t);
  std::vector<Tensor> in(weights.begin(), weights.end()), out(weights.begin(), weights.end());
  for (auto group : {grads, means, vars}) in.insert(in.end(), group.begin(), group.end());
  for (auto group : {means, vars}) out.insert(out.end(), group.begin(), group.end());
  in.push_back(ScalarInput("adam lr", device, DType::kFloat64, o.lr));
  in.push_back(ScalarInput("rescale_grad", device, dt, o.rescale_grad));
  in.push_back(count);
  out.push_back(count);
  if (!deferred::RunUpdate(key, device, in, out, [&] { return AdamGraph(weights, o, dt, lr, wd); })) return false;
  Advanced(weights, count, o.t);
  return true;
}

}  // namespace

void SGDUpdate(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> moms,
               const SGDOptions& o) {
  bool mom = o.momentum != 0;
  if (mom && moms.empty() && !weights.empty())
    KILN_THROW(ValueError) << "sgd_update: momentum is " << o.momentum
                           << " but no momentum arrays were given; pass one per weight (zeros at first)";
  DType dt = mom ? Check("sgd_update", weights, {{"gradient", grads}, {"momentum", moms}})
                 : Check("sgd_update", weights, {{"gradient", grads}});
  if (weights.empty()) return;
  if (JoinSGD(weights, grads, moms, o, mom, dt)) return;
  if (dt == DType::kFloat32) PushSGD<float>(weights, grads, moms, o, mom);
  else PushSGD<double>(weights, grads, moms, o, mom);
}

void AdamUpdate(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> means,
                std::span<const Tensor> vars, const AdamOptions& o) {
  const char* name = o.decoupled ? "adamw_update" : "adam_update";
  if (o.t < 1) KILN_THROW(ValueError) << name << ": step t is " << o.t << "; steps count from 1";
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    KILN_THROW(ValueError) << name << ": beta1 and beta2 must lie in [0, 1), got " << o.beta1 << " and "
                           << o.beta2;
  DType dt = Check(name, weights, {{"gradient", grads}, {"mean", means}, {"variance", vars}});
  if (weights.empty()) return;
  if (JoinAdam(weights, grads, means, vars, o, dt)) return;
  if (dt == DType::kFloat32) PushAdam<float>(weights, grads, means, vars, o);
  else PushAdam<double>(weights, grads, means, vars, o);
}

}  // namespace kiln::optim
