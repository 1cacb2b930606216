// The scalar functions of elementwise ops, one per unary and binary op of op_list.h. The CPU
// kernels (runtime/cpu/elementwise.cc) and generated code (codegen/lower.cc) implement exactly
// these. Composite scalar functions are written once here (ExpandUnary) in terms of the others;
// both implementations expand them, so such an op needs no kernel code of its own.
#pragma once

#include <cstdint>

#include "kiln/runtime/op_list.h"

namespace kiln {

enum class UnaryFn : uint8_t {
#define KILN_X(Id, name, nd_name, domain, doc) Id,
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
  kIdentity,  ///< copy and stop_gradient (ops of their own, not in KILN_UNARY_OPS)
};

enum class BinaryFn : uint8_t {
#define KILN_X(Id, name, nd_name, doc) Id,
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
};

/// Which dtypes a unary function takes.
enum class UnaryDomain : uint8_t { kFloatOnly, kNumeric, kAny };

constexpr UnaryDomain DomainOf(UnaryFn f) {
  switch (f) {
#define KILN_X(Id, name, nd_name, domain, doc) \
  case UnaryFn::Id: return UnaryDomain::k##domain;
    KILN_UNARY_OPS(KILN_X)
#undef KILN_X
    case UnaryFn::kIdentity: return UnaryDomain::kAny;
  }
  return UnaryDomain::kAny;
}

/// True for functions whose result is bool (comparisons, logical_not).
constexpr bool ReturnsBool(BinaryFn f) { return f >= BinaryFn::kEqual; }
constexpr bool ReturnsBool(UnaryFn f) { return f == UnaryFn::kLogicalNot; }

enum class ReduceFn : uint8_t { kSum, kMean, kMax, kMin, kArgMax, kArgMin };

/// True for unary functions defined by ExpandUnary rather than by each backend.
constexpr bool IsComposite(UnaryFn f) {
  switch (f) {
    case UnaryFn::kSoftplus:
    case UnaryFn::kMish: return true;
    default: return false;
  }
}

/// The composite unary function `f` of `x`, built with an algebra `a` that provides
/// `V a.Unary(UnaryFn, V)`, `V a.Binary(BinaryFn, V, V)` and `V a.Const(double)`: plain numbers
/// on the CPU, LLVM values in codegen. Only called when IsComposite(f).
template <class A, class V>
V ExpandUnary(A& a, UnaryFn f, V x) {
  using U = UnaryFn;
  switch (f) {
    // max(x, 0) + log1p(e^-|x|): no overflow for large x, no cancellation for very negative x.
    case U::kSoftplus:
      return a.Binary(BinaryFn::kAdd, a.Unary(U::kRelu, x),
                      a.Unary(U::kLog1p, a.Unary(U::kExp, a.Unary(U::kNeg, a.Unary(U::kAbs, x)))));
    case U::kMish: return a.Binary(BinaryFn::kMul, x, a.Unary(U::kTanh, a.Unary(U::kSoftplus, x)));
    default: return x;
  }
}

}  // namespace kiln
