// Helpers of the doctest files that compile traced functions: trace a function of example
// inputs into a CachedGraph, and compare results elementwise.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/frontend/cached_graph.h"

namespace kiln::testing {

using TraceFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// f traced on symbolic inputs shaped like `examples` ("data0", "data1", ... on the CPU), compiled.
inline std::shared_ptr<CachedGraph> Trace(const TraceFn& f, const std::vector<Tensor>& examples) {
  trace::TraceScope scope;
  std::vector<Tensor> in;
  for (size_t i = 0; i < examples.size(); ++i)
    in.push_back(scope.Input("data" + std::to_string(i), examples[i].shape(), examples[i].dtype(), cpu()));
  return scope.Finish(f(in));
}

/// Elementwise within atol + rtol * |b|; equal infinities and NaN positions must match.
inline void CheckClose(const Tensor& a, const Tensor& b, double rtol = 2e-5, double atol = 2e-6) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bool ok = std::isnan(y[i]) ? std::isnan(x[i])
                               : (x[i] == y[i] || std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]));
    if (!ok && ++bad <= 3) MESSAGE("at " << i << ": got " << x[i] << ", expected " << y[i]);
  }
  CHECK(bad == 0);
}

}  // namespace kiln::testing
