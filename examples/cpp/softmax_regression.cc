// 1. Make a toy data set: three Gaussian blobs in 2-D, 3 classes.
// 2. Train a softmax-regression classifier eagerly with autograd and plain SGD.
// 3. Print the loss as it falls and the final accuracy (exit status 1 if it did not learn).
// Every op is queued on the engine and returns at once; `Item()` is the only sync point.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/ops.h"

using namespace kiln;

int main(int argc, char** argv) {
  int epochs = argc > 1 && std::strcmp(argv[1], "--small") == 0 ? 20 : 100;
  const int n = 300;
  nd::random::seed(42);

  // 1. Data: blob k is centred at (3 cos(2 pi k / 3), 3 sin(2 pi k / 3)).
  std::vector<int64_t> label_values(n);
  std::vector<float> centres(n * 2);
  for (int i = 0; i < n; ++i) {
    int k = i % 3;
    label_values[i] = k;
    centres[2 * i] = 3.0f * std::cos(2.0944f * k);
    centres[2 * i + 1] = 3.0f * std::sin(2.0944f * k);
  }
  Tensor x = Tensor::FromVector(centres, {n, 2}) + nd::random::normal(0, 1, {n, 2});
  Tensor y = Tensor::FromVector(label_values, {n});

  // 2. Parameters and training loop.
  Tensor w = nd::random::normal(0, 0.01, {3, 2}), b = nd::zeros({3});
  w.AttachGrad();
  b.AttachGrad();
  const double lr = 0.5;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    Tensor loss;
    {
      autograd::RecordScope record;
      loss = nd::mean(nd::softmax_cross_entropy(nd::linear(x, w, b), y));
      loss.Backward();
    }
    (w - lr * w.grad()).CopyTo(w);
    (b - lr * b.grad()).CopyTo(b);
    if (epoch % 10 == 0) std::printf("epoch %3d  loss %.4f\n", epoch, loss.Item());
  }

  // 3. Accuracy.
  Tensor pred = nd::argmax(nd::linear(x, w, b), 1);
  double acc = nd::mean(nd::equal(pred, y).AsType(DType::kFloat32)).Item();
  std::printf("train accuracy %.3f\n", acc);
  return acc > 0.85 ? 0 : 1;
}
