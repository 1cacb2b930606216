#include <doctest/doctest.h>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"

using namespace kiln;

TEST_CASE("smoke: add and exp through the engine") {
  Tensor a = Tensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::FromVector<float>({10, 20}, {2});
  Tensor c = Invoke1("add", {a, b});
  CHECK(c.ToVector<float>() == std::vector<float>{11, 22, 13, 24});
  Tensor e = Invoke1("exp", {Tensor::FromVector<float>({0}, {1})});
  CHECK(e.Item() == doctest::Approx(1.0));
}
