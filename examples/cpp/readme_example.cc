// The README's example, verbatim apart from this comment and the includes.
#include <cstdio>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/ops.h"
using namespace kiln;

int main() {
  Tensor x = nd::random::normal(0, 1, {300, 2});              // features
  Tensor y = nd::argmax(x, 1);                                  // labels: which feature is larger
  Tensor w = nd::random::normal(0, 0.01, {2, 2}), b = nd::zeros({2});
  w.AttachGrad();
  b.AttachGrad();
  for (int epoch = 0; epoch < 50; ++epoch) {
    autograd::RecordScope record;                               // autograd.record()
    Tensor loss = nd::mean(nd::softmax_cross_entropy(nd::linear(x, w, b), y));
    loss.Backward();
    (w - 0.5 * w.grad()).CopyTo(w);                             // queued; returns at once
    (b - 0.5 * b.grad()).CopyTo(b);
    if (epoch % 10 == 0) std::printf("loss %.4f\n", loss.Item()); // a sync point
  }
}
