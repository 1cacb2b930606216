// The conformance harness (DESIGN.md section 11, after PyTorch's OpInfo and ggml's
// test-backend-ops): one table of cases drives the test of every op on every available device
// against a reference computed in double precision, with contiguous and non-contiguous inputs,
// several dtypes, and every differentiable op's gradient against central finite differences.
//
// Each group of ops registers its cases from its own file:
//
//   KILN_CONFORMANCE_CASES(reduce) {
//     std::vector<OpCase> cs;
//     cs.push_back(OpCase{...});
//     return cs;
//   }
//
// The runner (conformance.cc) also checks that every op of the op table has at least one case.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/attrs.h"

namespace kiln::testing {

/// Host data in double precision plus the dtype the tensor is created with.
struct HostTensor {
  Shape shape;
  std::vector<double> data;  ///< row-major, shape.numel() values
  DType dtype = DType::kFloat32;
};

/// Values 0.1, 0.2, ... scaled and shifted, or deterministic pseudo-random in [lo, hi).
HostTensor Arange(const Shape& shape, double start = 0.1, double step = 0.1, DType dtype = DType::kFloat32);
HostTensor Uniform(const Shape& shape, double lo, double hi, uint64_t seed, DType dtype = DType::kFloat32);
HostTensor Ints(const Shape& shape, std::vector<double> values, DType dtype = DType::kInt64);

using Reference = std::function<std::vector<HostTensor>(const std::vector<HostTensor>& in, const ir::Attrs& attrs)>;
/// For ops without an exact reference (random draws): checks the outputs itself (doctest CHECKs).
using Checker = std::function<void(const std::vector<Tensor>& outputs, const ir::Attrs& attrs)>;

struct OpCase {
  std::string label;                 ///< shown on failure, e.g. "add broadcast (2,3)+(3,)"
  std::string op;                    ///< op table name
  std::vector<HostTensor> inputs;
  ir::Attrs attrs;
  Reference reference;               ///< double-precision outputs (their dtype field is ignored)
  Checker check;                     ///< used when `reference` is empty
  /// Floating inputs are run in each of these dtypes (integer/bool inputs keep theirs); a case
  /// without floating inputs (integer-only, creation) runs once, whatever this says.
  std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat64};
  /// float32 tolerance. float64 uses 1e-9/1e-12, or these where they are loosened above the
  /// defaults (an approximate reference); 16-bit floats 2e-2/2e-2, or these where looser.
  double rtol = 1e-5, atol = 1e-6;
  bool grad = true;                  ///< finite-difference check of float inputs (when differentiable)
  std::vector<int> grad_inputs;      ///< inputs to check; empty: every floating input
  double grad_tol = 1e-5;            ///< relative tolerance of the float64 gradient check
  bool noncontiguous = true;         ///< also run with each input a strided (non-contiguous) view
};

void RegisterCases(const char* group, std::vector<OpCase> (*make)());

struct Registrar {
  Registrar(const char* group, std::vector<OpCase> (*make)()) { RegisterCases(group, make); }
};

}  // namespace kiln::testing

#define KILN_CONFORMANCE_CASES(group)                                                 \
  static std::vector<::kiln::testing::OpCase> kiln_cases_##group();                   \
  static ::kiln::testing::Registrar kiln_registrar_##group(#group, kiln_cases_##group); \
  static std::vector<::kiln::testing::OpCase> kiln_cases_##group()
