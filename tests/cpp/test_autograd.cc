// Eager autograd: record/pause scopes, grad_req write/add/null, head gradients, retain_graph,
// gradients through composites and broadcasting, and its errors.
#include <doctest/doctest.h>

#include <cmath>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/ops.h"

using namespace kiln;

namespace {
std::vector<double> D(const Tensor& t) { return t.ToVector<double>(); }
}  // namespace

TEST_CASE("autograd: d/dx of sum(x * x + 3x) is 2x + 3") {
  Tensor x = Tensor::FromVector<float>({1, -2, 3}, {3});
  x.AttachGrad();
  {
    autograd::RecordScope rec;
    Tensor y = nd::sum(x * x + 3.0 * x);
    y.Backward();
  }
  CHECK(D(x.grad()) == std::vector<double>{5, -1, 9});
}

TEST_CASE("autograd: head gradient, broadcasting and grad_req add") {
  Tensor a = Tensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::FromVector<double>({10, 20, 30}, {3});
  a.AttachGrad();
  b.AttachGrad(GradReq::kAdd);
  Tensor head = Tensor::FromVector<double>({1, 1, 1, 2, 2, 2}, {2, 3});
  for (int round = 0; round < 2; ++round) {
    autograd::RecordScope rec;
    Tensor y = a * b;  // b broadcast over rows
    y.Backward(head);
  }
  CHECK(D(a.grad()) == std::vector<double>{10, 20, 30, 20, 40, 60});        // write: last round only
  CHECK(D(b.grad()) == std::vector<double>{2 * (1 + 8), 2 * (2 + 10), 2 * (3 + 12)});  // add: both rounds
}

TEST_CASE("autograd: pause stops recording, and training flags follow the scopes") {
  Tensor x = Tensor::FromVector<float>({2}, {1});
  x.AttachGrad();
  CHECK_FALSE(autograd::IsRecording());
  autograd::RecordScope rec;
  CHECK(autograd::IsRecording());
  CHECK(autograd::IsTraining());
  Tensor y = x * x;
  Tensor z;
  {
    autograd::PauseScope pause;
    CHECK_FALSE(autograd::IsRecording());
    CHECK_FALSE(autograd::IsTraining());
    z = y * 10.0;  // not recorded: a constant for what follows
  }
  Tensor w = y + z;
  w.Backward();
  CHECK(x.grad().Item() == doctest::Approx(4.0));  // d(x^2)/dx only
}

TEST_CASE("autograd: retain_graph allows a second backward, and without it a clear StateError") {
  Tensor x = Tensor::FromVector<float>({3}, {1});
  x.AttachGrad();
  autograd::RecordScope rec;
  Tensor y = nd::exp(x);
  y.Backward(Tensor(), /*retain_graph=*/true);
  CHECK(x.grad().Item() == doctest::Approx(std::exp(3.0)).epsilon(1e-6));
  y.Backward();
  CHECK(x.grad().Item() == doctest::Approx(std::exp(3.0)).epsilon(1e-6));
  try {
    y.Backward();
    FAIL("expected StateError");
  } catch (const StateError& e) {
    CHECK(std::string(e.what()).find("retain_graph") != std::string::npos);
  }
}

TEST_CASE("autograd: backward of an unrecorded tensor says what to do") {
  Tensor x = Tensor::FromVector<float>({1, 2}, {2});
  Tensor y = x * 2.0;
  try {
    y.Backward();
    FAIL("expected StateError");
  } catch (const StateError& e) {
    CHECK(std::string(e.what()).find("attach_grad") != std::string::npos);
  }
}

TEST_CASE("autograd: Grad returns gradients without touching .grad") {
  Tensor x = Tensor::FromVector<double>({0.5, -1.0}, {2});
  x.AttachGrad();
  autograd::RecordScope rec;
  Tensor y = nd::sum(nd::sigmoid(x));
  std::vector<Tensor> g = autograd::Grad({y}, {x});
  std::vector<double> gv = D(g[0]);
  for (int i = 0; i < 2; ++i) {
    double xv = i == 0 ? 0.5 : -1.0;
    double s = 1 / (1 + std::exp(-xv));
    CHECK(gv[i] == doctest::Approx(s * (1 - s)).epsilon(1e-9));
  }
  CHECK(D(x.grad()) == std::vector<double>{0, 0});
}

TEST_CASE("autograd: softmax cross-entropy gradient is softmax minus one-hot") {
  Tensor logits = Tensor::FromVector<double>({1, 2, 3, 1, 1, 1}, {2, 3});
  Tensor labels = Tensor::FromVector<int64_t>({2, 0}, {2});
  logits.AttachGrad();
  {
    autograd::RecordScope rec;
    nd::sum(nd::softmax_cross_entropy(logits, labels)).Backward();
  }
  std::vector<double> p = D(nd::softmax(logits));
  std::vector<double> g = D(logits.grad());
  std::vector<double> onehot = {0, 0, 1, 1, 0, 0};
  for (int i = 0; i < 6; ++i) CHECK(g[i] == doctest::Approx(p[i] - onehot[i]).epsilon(1e-9));
}

TEST_CASE("autograd: sigmoid gradient does not overflow at large negative inputs") {
  Tensor x = Tensor::FromVector<float>({-100, 100, 0}, {3});
  x.AttachGrad();
  {
    autograd::RecordScope rec;
    nd::sum(nd::sigmoid(x)).Backward();
  }
  std::vector<double> g = D(x.grad());
  CHECK(g[0] == doctest::Approx(0.0));
  CHECK(g[1] == doctest::Approx(0.0));
  CHECK(g[2] == doctest::Approx(0.25));
}

TEST_CASE("autograd: batch norm training normalizes and updates running statistics") {
  Tensor x = Tensor::FromVector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  Tensor gamma = nd::ones({2}, DType::kFloat64), beta = nd::zeros({2}, DType::kFloat64);
  Tensor rm = nd::zeros({2}, DType::kFloat64), rv = nd::ones({2}, DType::kFloat64);
  Tensor y = nd::batch_norm(x, gamma, beta, rm, rv, {.axis = 1, .eps = 0, .momentum = 0.9, .training = true});
  std::vector<double> m = D(nd::mean(y, {0}));
  CHECK(m[0] == doctest::Approx(0.0));
  CHECK(m[1] == doctest::Approx(0.0));
  std::vector<double> var = D(nd::mean(nd::square(y), {0}));
  CHECK(var[0] == doctest::Approx(1.0));
  // batch mean of column 0 is 4, unbiased variance 20/3
  CHECK(D(rm)[0] == doctest::Approx(0.1 * 4));
  CHECK(D(rv)[0] == doctest::Approx(0.9 + 0.1 * 20.0 / 3.0));
}

TEST_CASE("autograd: dropout is the identity outside training and scales inside") {
  Tensor x = nd::ones({1000});
  CHECK(nd::sum(nd::dropout(x, 0.5, false)).Item() == doctest::Approx(1000));
  Tensor y = nd::dropout(x, 0.5, true);
  std::vector<float> v = y.ToVector<float>();
  int zeros = 0;
  for (float f : v) {
    CHECK((f == 0.0f || f == 2.0f));
    zeros += f == 0.0f;
  }
  CHECK(zeros > 400);
  CHECK(zeros < 600);
  CHECK_THROWS_AS(nd::dropout(x, 1.0, true), ValueError);
}

TEST_CASE("autograd: two forward and backward passes inside one open record scope") {
  Tensor x = Tensor::FromVector<double>({2}, {1});
  x.AttachGrad();
  autograd::RecordScope rec;
  (x * x).Backward();
  CHECK(x.grad().Item() == doctest::Approx(4.0));
  (x * x * x).Backward();  // the first backward freed its tape; recording continued in a new one
  CHECK(x.grad().Item() == doctest::Approx(12.0));
}

TEST_CASE("autograd: a failed backward leaves the tape usable") {
  Tensor x = Tensor::FromVector<double>({1, 2}, {2});
  x.AttachGrad();
  autograd::RecordScope rec;
  Tensor y = x * 3.0;
  CHECK_THROWS_AS(y.Backward(nd::ones({3}, DType::kFloat64)), ShapeError);  // wrong head shape
  y.Backward();
  CHECK(x.grad().ToVector<double>() == std::vector<double>{3, 3});
}

TEST_CASE("autograd: a leaf used in two record scopes gets the gradient of the one backpropagated") {
  Tensor w = Tensor::FromVector<double>({3}, {1});
  w.AttachGrad();
  Tensor l1, l2;
  {
    autograd::RecordScope rec;
    l1 = w * w;
  }
  {
    autograd::RecordScope rec;
    l2 = w * 10.0;
  }
  l1.Backward();
  CHECK(w.grad().Item() == doctest::Approx(6.0));
  l2.Backward();
  CHECK(w.grad().Item() == doctest::Approx(10.0));
}
