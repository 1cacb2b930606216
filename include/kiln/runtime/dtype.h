// Element types: the enum, sizes, names, promotion, and the two 16-bit float storage types.
// Arithmetic on float16/bfloat16 converts to float; these types only store.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kiln/runtime/error.h"

#include "kiln/runtime/float16_bits.h"

namespace kiln {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool };
inline constexpr int kNumDTypes = 8;

/// IEEE binary16 storage.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f);  // NOLINT: implicit like a float
  operator float() const;
};

/// bfloat16 storage: the upper half of a float32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(f16::FloatToBFloat16Bits(f)) {}  // NOLINT
  operator float() const { return f16::BFloat16BitsToFloat(bits); }
};

size_t DTypeSize(DType t);
const char* DTypeName(DType t);
/// Parses "float32", "int64", ... Throws DTypeError listing the valid names otherwise.
DType ParseDType(std::string_view name);
bool IsFloat(DType t);
bool IsInteger(DType t);  // int32, int64, uint8 (not bool)
/// NumPy-style promotion of two dtypes (float beats int, wider beats narrower; bool is lowest).
DType PromoteTypes(DType a, DType b);

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };

/// Type used for arithmetic on T: float for the 16-bit floats, T otherwise.
template <class T> struct ComputeType { using type = T; };
template <> struct ComputeType<Half> { using type = float; };
template <> struct ComputeType<BFloat16> { using type = float; };
template <class T> using compute_t = typename ComputeType<T>::type;

}  // namespace kiln

/// Runs the statement with `scalar_t` bound to the C++ type of `dtype`, for all 8 dtypes.
#define KILN_DISPATCH_ALL(dtype, ...)                                                      \
  switch (dtype) {                                                                          \
    case ::kiln::DType::kFloat32: { using scalar_t = float; __VA_ARGS__; break; }            \
    case ::kiln::DType::kFloat64: { using scalar_t = double; __VA_ARGS__; break; }           \
    case ::kiln::DType::kFloat16: { using scalar_t = ::kiln::Half; __VA_ARGS__; break; }     \
    case ::kiln::DType::kBFloat16: { using scalar_t = ::kiln::BFloat16; __VA_ARGS__; break; } \
    case ::kiln::DType::kInt32: { using scalar_t = int32_t; __VA_ARGS__; break; }            \
    case ::kiln::DType::kInt64: { using scalar_t = int64_t; __VA_ARGS__; break; }            \
    case ::kiln::DType::kUInt8: { using scalar_t = uint8_t; __VA_ARGS__; break; }            \
    case ::kiln::DType::kBool: { using scalar_t = bool; __VA_ARGS__; break; }                \
  }

/// Same as KILN_DISPATCH_ALL for the four floating dtypes; others throw DTypeError.
#define KILN_DISPATCH_FLOAT(dtype, opname, ...)                                            \
  switch (dtype) {                                                                          \
    case ::kiln::DType::kFloat32: { using scalar_t = float; __VA_ARGS__; break; }            \
    case ::kiln::DType::kFloat64: { using scalar_t = double; __VA_ARGS__; break; }           \
    case ::kiln::DType::kFloat16: { using scalar_t = ::kiln::Half; __VA_ARGS__; break; }     \
    case ::kiln::DType::kBFloat16: { using scalar_t = ::kiln::BFloat16; __VA_ARGS__; break; } \
    default:                                                                                \
      KILN_THROW(DTypeError) << opname << ": expected a floating dtype, found "             \
                             << ::kiln::DTypeName(dtype) << "; cast the input first";       \
  }
