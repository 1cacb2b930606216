// The scalar functions of elementwise ops: one enum each for unary and binary functions.
// The op table names the function of each elementwise op; CPU kernels (and later generated code)
// implement exactly these.
#pragma once

#include <cstdint>

namespace kiln {

enum class UnaryFn : uint8_t {
  kNeg, kAbs, kSign, kSquare, kSqrt, kRsqrt, kReciprocal, kExp, kLog, kLog1p, kExpm1,
  kSin, kCos, kTanh, kErf, kRelu, kFloor, kCeil, kRound, kLogicalNot, kIdentity,
};

enum class BinaryFn : uint8_t {
  kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum,
  kEqual, kNotEqual, kLess, kLessEqual, kGreater, kGreaterEqual,
};

/// True for functions whose result is bool (comparisons, logical_not).
constexpr bool ReturnsBool(BinaryFn f) { return f >= BinaryFn::kEqual; }
constexpr bool ReturnsBool(UnaryFn f) { return f == UnaryFn::kLogicalNot; }

enum class ReduceFn : uint8_t { kSum, kMean, kMax, kMin, kArgMax, kArgMin };

}  // namespace kiln
