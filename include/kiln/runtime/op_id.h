// Op ids: compile-time constants for every op of op_list.h (kiln::op::kAdd, kiln::op::kOneHot,
// ...), their names, and the scalar function of each elementwise op. Code that means one
// particular op names its constant; only text and file formats look ops up by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/runtime/op_list.h"
#include "kiln/runtime/scalar_fn.h"

namespace kiln {

using OpId = uint16_t;

namespace op {
enum : OpId {
#define KILN_X4(Id, name, nd_name, doc) Id,
#define KILN_X5(Id, name, nd_name, domain, doc) Id,
#define KILN_X2(Id, name) Id,
  KILN_UNARY_OPS(KILN_X5) KILN_BINARY_OPS(KILN_X4) KILN_OTHER_OPS(KILN_X2)
#undef KILN_X2
#undef KILN_X4
#undef KILN_X5
  kNumOps  ///< not an op: the number of ops
};

inline constexpr std::string_view kNames[kNumOps] = {
#define KILN_X4(Id, name, nd_name, doc) #name,
#define KILN_X5(Id, name, nd_name, domain, doc) #name,
#define KILN_X2(Id, name) #name,
    KILN_UNARY_OPS(KILN_X5) KILN_BINARY_OPS(KILN_X4) KILN_OTHER_OPS(KILN_X2)
#undef KILN_X2
#undef KILN_X4
#undef KILN_X5
};

inline constexpr OpId kFirstUnary = kNeg;
inline constexpr OpId kFirstBinary = kAdd;
inline constexpr OpId kFirstOther = kWhere;
}  // namespace op

/// The name of op `id` ("add"); "?" for an id that is no op.
constexpr std::string_view OpName(OpId id) { return id < op::kNumOps ? op::kNames[id] : "?"; }

/// The op named `name`, if there is one.
std::optional<OpId> OpIdOf(std::string_view name);

/// The scalar function of a unary elementwise op of KILN_UNARY_OPS (copy and stop_gradient,
/// which copy their input, have UnaryFn::kIdentity).
constexpr std::optional<UnaryFn> UnaryFnOf(OpId id) {
  if (id >= op::kFirstUnary && id < op::kFirstBinary) return static_cast<UnaryFn>(id - op::kFirstUnary);
  if (id == op::kCopy || id == op::kStopGradient) return UnaryFn::kIdentity;
  return std::nullopt;
}

/// The scalar function of a binary elementwise op of KILN_BINARY_OPS.
constexpr std::optional<BinaryFn> BinaryFnOf(OpId id) {
  if (id >= op::kFirstBinary && id < op::kFirstOther) return static_cast<BinaryFn>(id - op::kFirstBinary);
  return std::nullopt;
}

static_assert(UnaryFnOf(op::kNeg) == UnaryFn::kNeg && UnaryFnOf(op::kLogicalNot) == UnaryFn::kLogicalNot);
static_assert(BinaryFnOf(op::kGreaterEqual) == BinaryFn::kGreaterEqual && !BinaryFnOf(op::kWhere));
static_assert(op::kFirstBinary - op::kFirstUnary == static_cast<int>(UnaryFn::kIdentity));

}  // namespace kiln
