// CPU elementwise kernels. Scalar functions are written once (ApplyUnary / ApplyBinary) and
// instantiated per dtype; 16-bit floats compute in float. Contiguous, same-shape operands take a
// flat loop the compiler vectorizes; everything else goes through StridedFor.
#include "kiln/runtime/cpu/elementwise.h"

#include <cmath>
#include <type_traits>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"

namespace kiln::host {

namespace {

constexpr int64_t kGrain = 1 << 15;

// Integers wrap around on overflow, as NumPy's and the GPU kernels' do: + - * and negation run on
// an unsigned type (at least as wide as int, so that no promotion brings back a signed type),
// where overflow is defined; on int32 and int64 it would be undefined behaviour.
template <class T>
constexpr bool kWraps = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <class T, bool Small = (sizeof(T) < sizeof(unsigned))>
struct WrapTypeOf {
  using type = unsigned;
};
template <class T>
struct WrapTypeOf<T, false> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using WrapType = typename WrapTypeOf<T>::type;
template <class T>
inline T WrapAdd(T a, T b) { return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b)); }
template <class T>
inline T WrapSub(T a, T b) { return static_cast<T>(static_cast<WrapType<T>>(a) - static_cast<WrapType<T>>(b)); }
template <class T>
inline T WrapMul(T a, T b) { return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b)); }

template <class T>
inline T ApplyUnary(UnaryFn f, T x);
template <class T>
inline T ApplyBinary(BinaryFn f, T a, T b);

/// Plain numbers of type T, for expanding composite scalar functions (scalar_fn.h).
template <class T>
struct ScalarAlgebra {
  T Unary(UnaryFn f, T x) { return ApplyUnary<T>(f, x); }
  T Binary(BinaryFn f, T a, T b) { return ApplyBinary<T>(f, a, b); }
  T Const(double v) { return static_cast<T>(v); }
};

// Always inlined: called with a constant `f` (UnaryTyped), the switch folds away and the loop
// vectorizes; GCC left it a call per element (a tenth of the speed of the binary kernels).
template <class T>
[[gnu::always_inline]] inline T ApplyUnary(UnaryFn f, T x) {
  using std::abs;
  switch (f) {
    case UnaryFn::kNeg:
      if constexpr (kWraps<T>) return WrapSub(T(0), x);
      else return -x;
    case UnaryFn::kAbs:
      if constexpr (std::is_unsigned_v<T>) return x;
      else if constexpr (std::is_floating_point_v<T>) return std::fabs(x);  // abs(-0.0) is +0.0
      else return x < T(0) ? WrapSub(T(0), x) : x;                          // abs(INT_MIN) is INT_MIN
    case UnaryFn::kSign:  // NaN -> 0; selects on floats, so that the loop vectorizes
      if constexpr (std::is_floating_point_v<T>) return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
      else return static_cast<T>((T(0) < x) - (x < T(0)));
    case UnaryFn::kSquare:
      if constexpr (kWraps<T>) return WrapMul(x, x);
      else return x * x;
    case UnaryFn::kRelu: return x > T(0) ? x : T(0);
    case UnaryFn::kIdentity: return x;
    case UnaryFn::kLogicalNot: return static_cast<T>(x == T(0));
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (f) {
      case UnaryFn::kSqrt: return std::sqrt(x);
      case UnaryFn::kRsqrt: return T(1) / std::sqrt(x);
      case UnaryFn::kReciprocal: return T(1) / x;
      case UnaryFn::kExp: return std::exp(x);
      case UnaryFn::kLog: return std::log(x);
      case UnaryFn::kLog1p: return std::log1p(x);
      case UnaryFn::kExpm1: return std::expm1(x);
      case UnaryFn::kSin: return std::sin(x);
      case UnaryFn::kCos: return std::cos(x);
      case UnaryFn::kTanh: return std::tanh(x);
      case UnaryFn::kErf: return std::erf(x);
      case UnaryFn::kFloor: return std::floor(x);
      case UnaryFn::kCeil: return std::ceil(x);
      case UnaryFn::kRound: return std::round(x);
      default: break;
    }
    if (IsComposite(f)) {
      ScalarAlgebra<T> a;
      return ExpandUnary(a, f, x);
    }
  } else {
    switch (f) {  // integer inputs: rounding is the identity
      case UnaryFn::kFloor:
      case UnaryFn::kCeil:
      case UnaryFn::kRound: return x;
      default: break;
    }
  }
  KILN_CHECK(false) << "unary function " << static_cast<int>(f) << " is not defined for this dtype";
  return x;
}

template <class T>
inline T ApplyBinary(BinaryFn f, T a, T b) {
  switch (f) {
    case BinaryFn::kAdd:
      if constexpr (kWraps<T>) return WrapAdd(a, b);
      else return a + b;
    case BinaryFn::kSub:
      if constexpr (kWraps<T>) return WrapSub(a, b);
      else return a - b;
    case BinaryFn::kMul:
      if constexpr (kWraps<T>) return WrapMul(a, b);
      else return a * b;
    case BinaryFn::kDiv:
      if constexpr (std::is_integral_v<T>) {
        if (b == T(0)) throw ValueError("div: integer division by zero");
      }
      if constexpr (kWraps<T> && std::is_signed_v<T>) {
        if (b == T(-1)) return WrapSub(T(0), a);  // INT_MIN / -1 wraps to INT_MIN instead of trapping
      }
      return a / b;
    case BinaryFn::kPow:
      if constexpr (std::is_integral_v<T>) {
        if constexpr (std::is_signed_v<T>) {
          if (b < 0) return a == 1 ? T(1) : a == -1 ? (b % 2 ? T(-1) : T(1)) : T(0);
        }
        T r = 1, base = a;
        for (auto e = b; e > 0; e >>= 1, base = WrapMul(base, base))
          if (e & 1) r = WrapMul(r, base);
        return r;
      } else {
        return std::pow(a, b);
      }
    case BinaryFn::kMaximum: return (a != a || a > b) ? a : b;  // NaN propagates
    case BinaryFn::kMinimum: return (a != a || a < b) ? a : b;
    case BinaryFn::kEqual: return a == b;
    case BinaryFn::kNotEqual: return a != b;
    case BinaryFn::kLess: return a < b;
    case BinaryFn::kLessEqual: return a <= b;
    case BinaryFn::kGreater: return a > b;
    case BinaryFn::kGreaterEqual: return a >= b;
  }
  return a;
}

// `F` is a compile-time function so that the flat loop has no switch inside.
template <class T, UnaryFn F>
void UnaryTyped(const TensorView& in, const TensorView& out) {
  using C = compute_t<T>;
  using O = std::conditional_t<ReturnsBool(F), bool, T>;
  const T* x = in.ptr<T>();
  O* y = out.ptr<O>();
  if (in.is_contiguous()) {
    ParallelFor(in.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = static_cast<O>(ApplyUnary<C>(F, static_cast<C>(x[i])));
    });
  } else {
    StridedFor<2>(in.shape, {in.strides, out.strides}, [&](const std::array<int64_t, 2>& o) {
      y[o[1]] = static_cast<O>(ApplyUnary<C>(F, static_cast<C>(x[o[0]])));
    });
  }
}

template <class T, BinaryFn F>
void BinaryTyped(const TensorView& a, const TensorView& b, const TensorView& out) {
  using C = compute_t<T>;
  using O = std::conditional_t<ReturnsBool(F), bool, T>;
  const T* pa = a.ptr<T>();
  const T* pb = b.ptr<T>();
  O* y = out.ptr<O>();
  int64_t n = out.numel();
  auto apply = [](T u, T v) { return static_cast<O>(ApplyBinary<C>(F, static_cast<C>(u), static_cast<C>(v))); };
  bool ca = a.is_contiguous(), cb = b.is_contiguous();
  if (ca && cb && a.numel() == n && b.numel() == n) {
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = apply(pa[i], pb[i]);
    });
  } else if (ca && a.numel() == n && b.numel() == 1) {
    T v = pb[0];
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = apply(pa[i], v);
    });
  } else if (cb && b.numel() == n && a.numel() == 1) {
    T v = pa[0];
    ParallelFor(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = apply(v, pb[i]);
    });
  } else {
    Strides sa = BroadcastStrides(a.shape, a.strides, out.shape);
    Strides sb = BroadcastStrides(b.shape, b.strides, out.shape);
    StridedFor<3>(out.shape, {sa, sb, out.strides}, [&](const std::array<int64_t, 3>& o) {
      y[o[2]] = apply(pa[o[0]], pb[o[1]]);
    });
  }
}

// Every function of the op list, instantiated for the dtypes of its domain only.
template <class T>
void UnaryDispatch(UnaryFn f, const TensorView& in, const TensorView& out) {
  constexpr bool kFloat = std::is_floating_point_v<compute_t<T>>;
  switch (f) {
#define KILN_X(Id, name, nd_name, domain, doc)                                    \
  case UnaryFn::Id:                                                               \
    if constexpr (kFloat || DomainOf(UnaryFn::Id) != UnaryDomain::kFloatOnly)     \
      return UnaryTyped<T, UnaryFn::Id>(in, out);                                 \
    break;
    KILN_UNARY_OPS(KILN_X)
#undef KILN_X
    case UnaryFn::kIdentity: return UnaryTyped<T, UnaryFn::kIdentity>(in, out);
  }
  KILN_THROW(DTypeError) << "unary function " << static_cast<int>(f) << " is not defined for "
                         << DTypeName(in.dtype);
}

template <class T>
void BinaryDispatch(BinaryFn f, const TensorView& a, const TensorView& b, const TensorView& out) {
  switch (f) {
#define KILN_B(name) case BinaryFn::name: return BinaryTyped<T, BinaryFn::name>(a, b, out);
    KILN_B(kAdd) KILN_B(kSub) KILN_B(kMul) KILN_B(kDiv) KILN_B(kPow) KILN_B(kMaximum)
    KILN_B(kMinimum) KILN_B(kEqual) KILN_B(kNotEqual) KILN_B(kLess) KILN_B(kLessEqual)
    KILN_B(kGreater) KILN_B(kGreaterEqual)
#undef KILN_B
  }
}

}  // namespace

void Unary(UnaryFn f, const TensorView& in, const TensorView& out) {
  KILN_DISPATCH_ALL(in.dtype, UnaryDispatch<scalar_t>(f, in, out));
}

void Binary(BinaryFn f, const TensorView& a, const TensorView& b, const TensorView& out) {
  KILN_CHECK(a.dtype == b.dtype);
  if (a.dtype == DType::kBool) {  // add/mul/max/min on bool are or/and/or/and
    BinaryFn g = f == BinaryFn::kAdd || f == BinaryFn::kMaximum ? BinaryFn::kMaximum
                 : f == BinaryFn::kMul || f == BinaryFn::kMinimum ? BinaryFn::kMinimum : f;
    return BinaryDispatch<uint8_t>(g, TensorView{a.data, DType::kUInt8, a.shape, a.strides},
                                   TensorView{b.data, DType::kUInt8, b.shape, b.strides},
                                   ReturnsBool(g) ? out : TensorView{out.data, DType::kUInt8, out.shape, out.strides});
  }
  KILN_DISPATCH_ALL(a.dtype, BinaryDispatch<scalar_t>(f, a, b, out));
}

void Where(const TensorView& cond, const TensorView& a, const TensorView& b, const TensorView& out) {
  Strides sc = BroadcastStrides(cond.shape, cond.strides, out.shape);
  Strides sa = BroadcastStrides(a.shape, a.strides, out.shape);
  Strides sb = BroadcastStrides(b.shape, b.strides, out.shape);
  KILN_DISPATCH_ALL(cond.dtype, {
    const scalar_t* c = cond.ptr<scalar_t>();
    KILN_DISPATCH_ALL(a.dtype, {
      const scalar_t* pa = a.ptr<scalar_t>();
      const scalar_t* pb = b.ptr<scalar_t>();
      scalar_t* y = out.ptr<scalar_t>();
      StridedFor<4>(out.shape, {sc, sa, sb, out.strides}, [&](const std::array<int64_t, 4>& o) {
        y[o[3]] = static_cast<float>(c[o[0]]) != 0.0f ? pa[o[1]] : pb[o[2]];
      });
    });
  });
}

}  // namespace kiln::host
