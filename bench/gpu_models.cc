// bench_gpu's model training on gpu(0) (a source of bench_gpu, see bench/CMakeLists.txt), float32,
// plain SGD (no momentum) on the mean softmax cross-entropy, built with kiln's C++ API:
//  - gpu_resnet18: d2l's ResNet-18 for 28x28 images (3x3 stem with BatchNorm and relu, four
//    stages of two residual blocks, 64-128-256-512 channels, global average pool, Dense(10)),
//    training at batch 256 on one batch of synthetic images already on the GPU: images per second
//    of kiln hybridized (the network and the loss traced once into a compiled graph; forward,
//    backward and the fused SGD update per step) and of kiln eager. PyTorch's figures and the
//    ratios come from bench/python/gpu_resnet18_torch.py in the same gpu-check run.
//  - gpu_lenet: one epoch of the project's d2l LeNet (examples/python/lenet_fashion_mnist.py:
//    conv 3x3 20 relu, avg-pool 2, conv 5x5 50 relu, avg-pool 2, dense 128 relu, dense 10;
//    N(0, 0.01) weights, lr 0.2) and of d2l's classic LeNet-5 (conv 5x5 6 padded, sigmoid, avg-pool
//    2, conv 5x5 16, sigmoid, avg-pool 2, dense 120 and 84 sigmoid, dense 10; Xavier-normal weights,
//    lr 0.9; "sigmoid" in the case names) at batch 256, hybridized, each batch copied from host
//    memory to the GPU as d2l's loop does. Fashion-MNIST's files are not on the GPU machine, so the 60000
//    images are synthetic (class-dependent blocks plus noise, generated here), which the case
//    names say; the last batch has 96 images (its own traced graph, as Gluon retraces).
//    bench/python/gpu_lenet_torch.py measures PyTorch on the same kind of data.
// Every model is first checked on gpu(0) against the CPU at a small size: a few hybridized
// training steps on one batch from the same initial weights must give the same losses on both
// devices, and the loss must decrease. On simulated GPUs only that check runs. One more step then
// prints its counters (kiln/runtime/step_counters.h: launches, library calls, graph replays, host
// syncs, allocations, copies, tasks outside plans), the same on simulated GPUs as on real ones.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpu_models.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/optim.h"
#include "kiln/frontend/tensor.h"
#include "kiln/frontend/tracer.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/math_mode.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/step_counters.h"

namespace kiln::gpubench {
namespace {

using kiln::bench::Emit;
using kiln::bench::Median;

// Parameters are drawn on the CPU from one seed and copied to the model's device, so the same
// seed gives the same model on every device.
Tensor Draw(double std, const Shape& shape, Device dev) {
  return nd::random::normal(0, std, shape, DType::kFloat32, cpu()).To(dev, true);
}
Tensor Fill(double value, const Shape& shape, Device dev) { return nd::full(shape, value, DType::kFloat32, dev); }

struct Conv {
  Tensor w, b;
  int64_t stride = 1, pad = 0;
  Tensor operator()(const Tensor& x) const {
    nd::Conv2dOptions o;
    o.stride = {stride, stride};
    o.padding = {pad, pad};
    return nd::conv2d(x, w, b, o);
  }
};

struct BatchNorm {
  Tensor gamma, beta, mean, var;
  Tensor operator()(const Tensor& x) const {
    nd::BatchNormOptions o;
    o.training = true;  // batch statistics; the running ones are updated in place
    return nd::batch_norm(x, gamma, beta, mean, var, o);
  }
};

// The parameters SGD updates (each with a gradient buffer) and the forward.
struct Model {
  std::vector<Tensor> trainable;
  std::function<Tensor(const Tensor&)> forward;
};

// He-initialized convolution (bias 0), registered as trainable.
Conv MakeConv(Model& m, int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad, Device dev,
              double std = -1) {
  if (std < 0) std = std::sqrt(2.0 / static_cast<double>(in * k * k));
  Conv c{Draw(std, {out, in, k, k}, dev), Fill(0, {out}, dev), stride, pad};
  m.trainable.push_back(c.w);
  m.trainable.push_back(c.b);
  return c;
}

BatchNorm MakeBatchNorm(Model& m, int64_t channels, Device dev) {
  BatchNorm b{Fill(1, {channels}, dev), Fill(0, {channels}, dev), Fill(0, {channels}, dev), Fill(1, {channels}, dev)};
  m.trainable.push_back(b.gamma);
  m.trainable.push_back(b.beta);
  return b;
}

// d2l's ResNet-18 for 28x28 images (python/kiln/nn/conv_layers.py's Residual, four stages).
Model ResNet18(int64_t width, Device dev) {
  struct Residual {
    Conv c1, c2;
    std::optional<Conv> c3;
    BatchNorm bn1, bn2;
  };
  struct Net {
    Conv stem;
    BatchNorm bn;
    std::vector<Residual> blocks;
    Tensor fc_w, fc_b;
  };
  Model m;
  auto net = std::make_shared<Net>();
  net->stem = MakeConv(m, 1, width, 3, 1, 1, dev);
  net->bn = MakeBatchNorm(m, width, dev);
  int64_t in = width;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t out = width << stage;
    for (int i = 0; i < 2; ++i) {
      const bool down = i == 0 && stage > 0;
      Residual r;
      r.c1 = MakeConv(m, in, out, 3, down ? 2 : 1, 1, dev);
      r.bn1 = MakeBatchNorm(m, out, dev);
      r.c2 = MakeConv(m, out, out, 3, 1, 1, dev);
      r.bn2 = MakeBatchNorm(m, out, dev);
      if (down) r.c3 = MakeConv(m, in, out, 1, 2, 0, dev);
      net->blocks.push_back(std::move(r));
      in = out;
    }
  }
  net->fc_w = Draw(std::sqrt(1.0 / static_cast<double>(in)), {10, in}, dev);
  net->fc_b = Fill(0, {10}, dev);
  m.trainable.push_back(net->fc_w);
  m.trainable.push_back(net->fc_b);
  m.forward = [net](const Tensor& x) {
    Tensor h = nd::relu(net->bn(net->stem(x)));
    for (const Residual& r : net->blocks) {
      Tensor y = r.bn2(r.c2(nd::relu(r.bn1(r.c1(h)))));
      h = nd::relu(nd::add(y, r.c3 ? (*r.c3)(h) : h));
    }
    return nd::linear(nd::flatten(nd::global_avg_pool2d(h)), net->fc_w, net->fc_b);
  };
  return m;
}

// The project's d2l LeNet (examples/python/lenet_fashion_mnist.py), weights N(0, 0.01), biases 0;
// `sigmoid`: d2l's classic LeNet-5 (section 7.6) with Xavier-normal weights instead.
Model LeNet(Device dev, bool sigmoid) {
  struct Net {
    bool sigmoid;
    Conv c1, c2;
    std::vector<Tensor> w, b;  // the dense layers
  };
  Model m;
  auto net = std::make_shared<Net>();
  net->sigmoid = sigmoid;
  auto xavier = [](int64_t in, int64_t out) { return std::sqrt(2.0 / static_cast<double>(in + out)); };
  const std::vector<int64_t> dense = sigmoid ? std::vector<int64_t>{400, 120, 84, 10} : std::vector<int64_t>{800, 128, 10};
  if (sigmoid) {
    net->c1 = MakeConv(m, 1, 6, 5, 1, 2, dev, xavier(25, 150));
    net->c2 = MakeConv(m, 6, 16, 5, 1, 0, dev, xavier(150, 400));
  } else {
    net->c1 = MakeConv(m, 1, 20, 3, 1, 0, dev, 0.01);
    net->c2 = MakeConv(m, 20, 50, 5, 1, 0, dev, 0.01);
  }
  for (size_t l = 0; l + 1 < dense.size(); ++l) {
    net->w.push_back(Draw(sigmoid ? xavier(dense[l], dense[l + 1]) : 0.01, {dense[l + 1], dense[l]}, dev));
    net->b.push_back(Fill(0, {dense[l + 1]}, dev));
    m.trainable.push_back(net->w.back());
    m.trainable.push_back(net->b.back());
  }
  m.forward = [net](const Tensor& x) {
    auto act = [&](const Tensor& t) { return net->sigmoid ? nd::sigmoid(t) : nd::relu(t); };
    Tensor h = nd::avg_pool2d(act(net->c1(x)), {2, 2}, {2, 2});
    h = nd::flatten(nd::avg_pool2d(act(net->c2(h)), {2, 2}, {2, 2}));
    for (size_t l = 0; l < net->w.size(); ++l) {
      h = nd::linear(h, net->w[l], net->b[l]);
      if (l + 1 < net->w.size()) h = act(h);
    }
    return h;
  };
  return m;
}

// SGD steps on a model: eager, or through a graph of the network and the loss traced once per
// batch size (hybridize's cache, keyed by what changes here).
class Trainer {
 public:
  Trainer(Model m, double lr, bool hybridize) : m_(std::move(m)), hybridize_(hybridize) {
    o_.lr = lr;
    for (Tensor& p : m_.trainable) p.AttachGrad();
  }
  /// Queues one step on the batch (x, labels); returns its loss (not waited for).
  Tensor Step(const Tensor& x, const Tensor& labels) {
    auto loss_of = [this](const Tensor& xs, const Tensor& ys) {
      return nd::mean(nd::softmax_cross_entropy(m_.forward(xs), ys));
    };
    Tensor loss;
    if (hybridize_) {
      std::shared_ptr<CachedGraph>& g = graphs_[x.shape()[0]];
      if (!g) {
        trace::TraceScope scope;
        Tensor xs = scope.Input("data", x.shape(), x.dtype(), x.device());
        Tensor ys = scope.Input("label", labels.shape(), labels.dtype(), labels.device());
        g = scope.Finish({loss_of(xs, ys)});
      }
      autograd::RecordScope record;
      loss = g->Call({x, labels})[0];
      loss.Backward();
    } else {
      autograd::RecordScope record;
      loss = loss_of(x, labels);
      loss.Backward();
    }
    std::vector<Tensor> grads;
    for (const Tensor& p : m_.trainable) grads.push_back(p.grad());
    optim::SGDUpdate(m_.trainable, grads, {}, o_);
    return loss;
  }

 private:
  Model m_;
  bool hybridize_;
  optim::SGDOptions o_;
  std::map<int64_t, std::shared_ptr<CachedGraph>> graphs_;
};

// `count` synthetic 1x28x28 images in [0, 1] and their labels (int32): noise plus a bright 7x7
// block whose place depends on the class, so a network can learn them. Deterministic.
void Synthetic(int64_t first, int64_t count, std::vector<float>* images, std::vector<int32_t>* labels) {
  images->assign(static_cast<size_t>(count * 784), 0.f);
  labels->assign(static_cast<size_t>(count), 0);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t s = static_cast<uint64_t>(first + i) * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&s] {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      return s;
    };
    const int32_t label = static_cast<int32_t>(next() % 10);
    (*labels)[static_cast<size_t>(i)] = label;
    float* img = images->data() + i * 784;
    for (int p = 0; p < 784; ++p) img[p] = static_cast<float>(next() % 1000) * 2e-4f;
    const int r0 = 3 + (label / 4) * 7, c0 = 3 + (label % 4) * 5;
    for (int r = r0; r < r0 + 7; ++r)
      for (int c = c0; c < c0 + 7; ++c) img[r * 28 + c] += 0.8f;
  }
}

struct Batch {
  Tensor x, y;
};
Batch MakeBatch(int64_t first, int64_t n, Device dev) {
  std::vector<float> images;
  std::vector<int32_t> labels;
  Synthetic(first, n, &images, &labels);
  return {Tensor::FromVector(images, Shape({n, 1, 28, 28}), dev), Tensor::FromVector(labels, Shape({n}), dev)};
}

// `steps` hybridized steps on one batch, on gpu(0) and on the CPU from the same weights: the
// losses must agree (within relative `tol`) and decrease. `make` builds the model on a device
// from the current seed; `variant` ("" or e.g. "sigmoid_") goes into the case names.
void CheckTraining(const char* bench, const std::string& variant, const std::function<Model(Device)>& make,
                   int64_t batch, int steps, double lr, double tol) {
  // The check is of kiln's numbers, in float32: TF32 convolutions (the default math) on a small
  // batch-normalized net move the losses of a few steps by far more than float32's rounding.
  struct Float32Convs {
    Float32Convs() { gpurt::SetTf32(gpurt::MathOp::kConv, 0); }
    ~Float32Convs() { gpurt::SetTf32(gpurt::MathOp::kConv, -1); }
  } float32_convs;
  std::vector<std::vector<double>> losses;
  for (Device dev : {cpu(), gpu(0)}) {
    nd::random::seed(7);
    Trainer t(make(dev), lr, /*hybridize=*/true);
    Batch b = MakeBatch(0, batch, dev);
    losses.emplace_back();
    for (int i = 0; i < steps; ++i) losses.back().push_back(t.Step(b.x, b.y).Item());
    if (!dev.is_cpu()) {  // what one more step (steady state) does on the GPU, simulated or not
      const StepCounters before = ReadStepCounters();
      t.Step(b.x, b.y);
      const StepCounters step = ReadStepCounters() - before;
      for (const auto& [counter, value] : step.Named())
        Emit(bench, "kiln_" + variant + "hybridized_step_b" + std::to_string(batch), counter,
             static_cast<double>(value), "per step");
    }
    // The last update is still queued: let it finish before its tensors go (and, on simulated
    // GPUs, before the process may exit with a stream still running it).
    engine::Engine::Get().WaitForAll();
  }
  const std::vector<double>& want = losses[0];
  const std::vector<double>& got = losses[1];
  for (int i = 0; i < steps; ++i)
    if (!std::isfinite(got[i]) || std::fabs(got[i] - want[i]) > tol * (1 + std::fabs(want[i]))) {
      std::fprintf(stderr, "%s: the loss of step %d is %g on gpu(0) but %g on the CPU\n", bench, i, got[i], want[i]);
      std::exit(1);
    }
  if (!(got.back() < got.front())) {
    std::fprintf(stderr, "%s: the loss did not decrease over %d steps on one batch: %g -> %g\n", bench, steps,
                 got.front(), got.back());
    std::exit(1);
  }
  const std::string name = "kiln_" + variant + "vs_cpu";
  Emit(bench, name + "_loss_first_step", "loss", got.front(), "nat");
  Emit(bench, name + "_loss_after_" + std::to_string(steps) + "_steps", "loss", got.back(), "nat");
  Emit(bench, name, "correct", 1, "bool");
}

// CheckTraining runs its convolutions in float32 (KILN_CONV_TF32's default lets them use TF32): a
// real GPU's cuDNN algorithms still sum in other orders than the CPU.
double LossTolerance(bool real_gpu) { return real_gpu ? 2e-2 : 2e-3; }

}  // namespace

void ResNet18Bench(bool quick, bool timed) {
  const char* kBench = "gpu_resnet18";
  // Width 4 (channels 4-8-16-32) at batch 8 keeps the simulator's check to seconds.
  CheckTraining(kBench, "", [](Device dev) { return ResNet18(4, dev); }, 8, 4, 0.1, LossTolerance(timed));
  if (!timed) return Skipped(kBench, kSimulatedOnly);
  const int64_t batch = 256;
  const int steps = quick ? 5 : 20, repeats = 3;
  for (bool hybridize : {true, false}) {
    nd::random::seed(1);
    Trainer t(ResNet18(64, gpu(0)), 0.1, hybridize);
    Batch b = MakeBatch(0, batch, gpu(0));
    for (int i = 0; i < 3; ++i) t.Step(b.x, b.y).Item();  // trace, compile, cuDNN's algorithms
    std::vector<double> ips;
    double loss = 0;
    for (int r = 0; r < repeats; ++r) {
      engine::Engine::Get().WaitForAll();
      kiln::bench::Timer timer;
      Tensor l;
      for (int i = 0; i < steps; ++i) l = t.Step(b.x, b.y);
      engine::Engine::Get().WaitForAll();
      loss = l.Item();
      ips.push_back(static_cast<double>(batch * steps) / timer.Seconds());
    }
    if (!std::isfinite(loss)) {
      std::fprintf(stderr, "gpu_resnet18: the loss is %g after training\n", loss);
      std::exit(1);
    }
    Emit(kBench, std::string(hybridize ? "kiln_hybridized" : "kiln_eager") + "_b256", "images_per_s", Median(ips),
         "images/s");
  }
}

void LeNetBench(bool quick, bool timed) {
  const char* kBench = "gpu_lenet";
  for (bool sigmoid : {false, true})
    CheckTraining(kBench, sigmoid ? "sigmoid_" : "", [sigmoid](Device dev) { return LeNet(dev, sigmoid); }, 16, 4,
                  0.2, LossTolerance(timed));  // lr 0.9 overshoots on a single batch of 16
  if (!timed) return Skipped(kBench, kSimulatedOnly);
  // The epoch's batches in host memory (as a data loader hands them over), copied per step.
  const int64_t images = quick ? 12800 : 60000, batch = 256;
  std::vector<Batch> host;
  for (int64_t first = 0; first < images; first += batch)
    host.push_back(MakeBatch(first, std::min(batch, images - first), cpu()));
  for (bool sigmoid : {false, true}) {
    nd::random::seed(1);
    Trainer t(LeNet(gpu(0), sigmoid), sigmoid ? 0.9 : 0.2, /*hybridize=*/true);
    for (const Batch& b : {host.front(), host.back()}) t.Step(b.x.To(gpu(0)), b.y.To(gpu(0))).Item();  // both traces
    engine::Engine::Get().WaitForAll();
    kiln::bench::Timer timer;
    Tensor l;
    for (const Batch& b : host) l = t.Step(b.x.To(gpu(0)), b.y.To(gpu(0)));
    const double loss = l.Item();
    engine::Engine::Get().WaitForAll();
    const double s = timer.Seconds();
    if (!std::isfinite(loss)) {
      std::fprintf(stderr, "gpu_lenet: the loss is %g after the epoch\n", loss);
      std::exit(1);
    }
    const std::string name =
        std::string("kiln_hybridized_") + (sigmoid ? "sigmoid_" : "") + "synthetic_" + std::to_string(images) + "_b256";
    Emit(kBench, name, "seconds_per_epoch", s * 60000.0 / static_cast<double>(images), "s (60000 images)");
    Emit(kBench, name, "images_per_s", static_cast<double>(images) / s, "images/s");
    Emit(kBench, name, "last_loss", loss, "nat");
  }
}

}  // namespace kiln::gpubench
