// Writes through views: overlap detection (MemoryOverlaps) and copies whose source overlaps the
// destination (x[:] = x[::-1]), and in-place writes recorded by autograd (autograd::RecordWrite).
#include <doctest/doctest.h>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/ops.h"

using namespace kiln;

namespace {
std::vector<double> D(const Tensor& t) { return t.ToVector<double>(); }
Tensor Reversed(const Tensor& x) { return nd::slice(x, {x.shape()[0] - 1}, {-x.shape()[0] - 1}, {-1}); }
}  // namespace

TEST_CASE("overlap: a view and its reverse overlap, halves of one storage do not") {
  Tensor x = nd::arange(0, 6);
  CHECK(MemoryOverlaps(x, Reversed(x)));
  CHECK(MemoryOverlaps(x, x));
  Tensor lo = nd::slice(x, {0}, {3}), hi = nd::slice(x, {3}, {6});
  CHECK_FALSE(MemoryOverlaps(lo, hi));
  CHECK(MemoryOverlaps(nd::slice(x, {0}, {4}), hi));   // elements 3 shared
  CHECK_FALSE(MemoryOverlaps(x, nd::arange(0, 6)));    // another storage
  CHECK_FALSE(MemoryOverlaps(nd::slice(x, {2}, {2}), x));  // empty views overlap nothing
}

TEST_CASE("overlap: a square matrix and its transpose overlap, rows of it do not") {
  Tensor z = nd::reshape(nd::arange(0, 9), {3, 3});
  CHECK(MemoryOverlaps(z, nd::transpose(z)));
  CHECK_FALSE(MemoryOverlaps(nd::slice(z, {0}, {1}), nd::slice(z, {2}, {3})));
}

TEST_CASE("overlap: copying a reversed view into itself goes through a temporary") {
  Tensor x = nd::arange(0, 6);
  Reversed(x).CopyTo(x);
  CHECK(D(x) == std::vector<double>{5, 4, 3, 2, 1, 0});
  Tensor y = nd::arange(0, 6);
  nd::slice(y, {0}, {5}).CopyTo(nd::slice(y, {1}, {6}));  // shift right by one
  CHECK(D(y) == std::vector<double>{0, 0, 1, 2, 3, 4});
}

TEST_CASE("overlap: z copied from its transpose is transposed") {
  Tensor z = nd::reshape(nd::arange(0, 9), {3, 3});
  nd::transpose(z).CopyTo(z);
  CHECK(D(z) == std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8});
}

TEST_CASE("overlap: disjoint halves of one storage copy directly") {
  Tensor x = nd::arange(0, 6);
  nd::slice(x, {0}, {3}).CopyTo(nd::slice(x, {3}, {6}));
  CHECK(D(x) == std::vector<double>{0, 1, 2, 0, 1, 2});
}

TEST_CASE("autograd in place: a written element gets no gradient") {
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  x.AttachGrad();
  {
    autograd::RecordScope rec;
    Tensor y = x * 2.0;
    nd::full({1}, 10.0).CopyTo(nd::slice(y, {0}, {1}));
    Tensor s = nd::sum(y);
    CHECK(D(y) == std::vector<double>{10, 4, 6});
    s.Backward();
  }
  CHECK(D(x.grad()) == std::vector<double>{0, 2, 2});
}

TEST_CASE("autograd in place: a value saved for backward keeps its old contents") {
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  x.AttachGrad();
  {
    autograd::RecordScope rec;
    Tensor y = x * 2.0;
    Tensor z = y * y;  // backward reads y as it was here
    nd::full({3}, 0.0).CopyTo(y);
    nd::sum(z).Backward();
  }
  CHECK(D(x.grad()) == std::vector<double>{8, 16, 24});
}

TEST_CASE("autograd in place: a step on a used leaf inside the scope keeps the gradient at the old value") {
  Tensor w = Tensor::FromVector<float>({1, 2, 3}, {3});
  w.AttachGrad();
  {
    autograd::RecordScope rec;
    Tensor loss = nd::sum(w * w);
    (w - 0.5 * w).CopyTo(w);  // an update before backward: backward still reads w = 1, 2, 3
    loss.Backward();
  }
  CHECK(D(w) == std::vector<double>{0.5, 1, 1.5});
  CHECK(D(w.grad()) == std::vector<double>{2, 4, 6});
}
