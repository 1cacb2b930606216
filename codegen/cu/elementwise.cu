// The elementwise ops, cast and the reductions (sum, mean, max, min) on GPUs for every dtype:
// what the generated float32 kernels (codegen/nvptx.cc) do not cover. Each kernel mirrors the CPU
// kernel of runtime/cpu/ (elementwise.cc, copy.cc, reduce.cc), which is the reference:
// - float64 computes in double, float32/float16/bfloat16 in float (16-bit floats converted by
//   hand on their bits, rounding to nearest even as runtime/basic_types.cc and dtype.h do),
//   integers in their own type with two's-complement wrap-around, bool as 0/1 bytes;
// - the op is an `int` argument (the scalar function's id of include/kiln/runtime/scalar_fn.h),
//   switched on inside the grid-stride loop; the ids below must follow that header's order;
// - operands are strided (NumPy broadcasting: stride 0 in a broadcast dim) over the output's dims,
//   at most kDims of them (codegen/gpu_kernels_dtypes.cc merges dims before), or flat;
// - an integer division by zero sets *flag (the host raises the CPU's ValueError).
// Not here: float32 arithmetic on operands the generated kernels read (the fast path).
#include "cu_common.h"
#include "kiln/runtime/float16_bits.h"

extern "C" __device__ float __nv_sqrtf(float);
extern "C" __device__ float __nv_expf(float);
extern "C" __device__ float __nv_logf(float);
extern "C" __device__ float __nv_log1pf(float);
extern "C" __device__ float __nv_expm1f(float);
extern "C" __device__ float __nv_sinf(float);
extern "C" __device__ float __nv_cosf(float);
extern "C" __device__ float __nv_tanhf(float);
extern "C" __device__ float __nv_erff(float);
extern "C" __device__ float __nv_floorf(float);
extern "C" __device__ float __nv_ceilf(float);
extern "C" __device__ float __nv_roundf(float);
extern "C" __device__ float __nv_fabsf(float);
extern "C" __device__ float __nv_powf(float, float);
extern "C" __device__ double __nv_exp(double);
extern "C" __device__ double __nv_log1p(double);
extern "C" __device__ double __nv_expm1(double);
extern "C" __device__ double __nv_tanh(double);
extern "C" __device__ double __nv_erf(double);
extern "C" __device__ double __nv_floor(double);
extern "C" __device__ double __nv_ceil(double);
extern "C" __device__ double __nv_round(double);
extern "C" __device__ double __nv_fabs(double);
extern "C" __device__ double __nv_pow(double, double);

namespace {

constexpr int kDims = 6;  // kGpuIndexDims (include/kiln/codegen/ptx.h)

// UnaryFn and BinaryFn of scalar_fn.h (positions in KILN_UNARY_OPS / KILN_BINARY_OPS).
enum Unary {
  kNeg, kAbs, kSign, kSquare, kSqrt, kRsqrt, kReciprocal, kExp, kLog, kLog1p, kExpm1, kSin, kCos,
  kTanh, kErf, kRelu, kFloor, kCeil, kRound, kLogicalNot, kSoftplus, kMish, kIdentity
};
enum Binary { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum, kEqual, kNotEqual, kLess, kLessEqual, kGreater, kGreaterEqual };

// ---- 16-bit floats on their bits (include/kiln/runtime/float16_bits.h, shared with the CPU)

__device__ unsigned FloatBits(float f) { return __builtin_bit_cast(unsigned, f); }
__device__ float BitsFloat(unsigned u) { return __builtin_bit_cast(float, u); }

__device__ float HalfToFloat(unsigned short h) { return kiln::f16::HalfBitsToFloat(h); }
__device__ unsigned short FloatToHalf(float f) { return kiln::f16::FloatToHalfBits(f); }
__device__ float BFloatToFloat(unsigned short b) { return kiln::f16::BFloat16BitsToFloat(b); }
__device__ unsigned short FloatToBFloat(float f) { return kiln::f16::FloatToBFloat16Bits(f); }

// ---- dtypes: storage S, compute type C (compute_t of dtype.h), load and store -----------------

struct F32 {
  using S = float;
  using C = float;
  static __device__ C Load(S v) { return v; }
  static __device__ S Store(C v) { return v; }
};
struct F64 {
  using S = double;
  using C = double;
  static __device__ C Load(S v) { return v; }
  static __device__ S Store(C v) { return v; }
};
struct F16 {
  using S = unsigned short;
  using C = float;
  static __device__ C Load(S v) { return HalfToFloat(v); }
  static __device__ S Store(C v) { return FloatToHalf(v); }
};
struct BF16 {
  using S = unsigned short;
  using C = float;
  static __device__ C Load(S v) { return BFloatToFloat(v); }
  static __device__ S Store(C v) { return FloatToBFloat(v); }
};
struct I32 {
  using S = int;
  using C = int;
  using U = unsigned;
  static __device__ C Load(S v) { return v; }
  static __device__ S Store(C v) { return v; }
};
struct I64 {
  using S = long long;
  using C = long long;
  using U = unsigned long long;
  static __device__ C Load(S v) { return v; }
  static __device__ S Store(C v) { return v; }
};
struct U8 {
  using S = unsigned char;
  using C = unsigned char;
  using U = unsigned char;
  static __device__ C Load(S v) { return v; }
  static __device__ S Store(C v) { return v; }
};
struct B8 {  // bool: one byte holding 0 or 1
  using S = unsigned char;
  using C = unsigned char;
  using U = unsigned char;
  static __device__ C Load(S v) { return v; }
  static __device__ S Store(C v) { return v; }
};

template <class C> constexpr bool kIsFloat = false;
template <> constexpr bool kIsFloat<float> = true;
template <> constexpr bool kIsFloat<double> = true;

// ---- the scalar functions (runtime/cpu/elementwise.cc: ApplyUnary, ApplyBinary) ---------------

// Float math: float and double versions of libdevice.
__device__ float Sqrt(float x) { return __nv_sqrtf(x); }
__device__ double Sqrt(double x) { return __nv_sqrt(x); }
__device__ float Exp(float x) { return __nv_expf(x); }
__device__ double Exp(double x) { return __nv_exp(x); }
__device__ float Log(float x) { return __nv_logf(x); }
__device__ double Log(double x) { return __nv_log(x); }
__device__ float Log1p(float x) { return __nv_log1pf(x); }
__device__ double Log1p(double x) { return __nv_log1p(x); }
__device__ float Expm1(float x) { return __nv_expm1f(x); }
__device__ double Expm1(double x) { return __nv_expm1(x); }
__device__ float Sin(float x) { return __nv_sinf(x); }
__device__ double Sin(double x) { return __nv_sin(x); }
__device__ float Cos(float x) { return __nv_cosf(x); }
__device__ double Cos(double x) { return __nv_cos(x); }
__device__ float Tanh(float x) { return __nv_tanhf(x); }
__device__ double Tanh(double x) { return __nv_tanh(x); }
__device__ float Erf(float x) { return __nv_erff(x); }
__device__ double Erf(double x) { return __nv_erf(x); }
__device__ float Floor(float x) { return __nv_floorf(x); }
__device__ double Floor(double x) { return __nv_floor(x); }
__device__ float Ceil(float x) { return __nv_ceilf(x); }
__device__ double Ceil(double x) { return __nv_ceil(x); }
__device__ float Round(float x) { return __nv_roundf(x); }  // half away from zero, as std::round
__device__ double Round(double x) { return __nv_round(x); }
__device__ float Fabs(float x) { return __nv_fabsf(x); }
__device__ double Fabs(double x) { return __nv_fabs(x); }
__device__ float Pow(float a, float b) { return __nv_powf(a, b); }
__device__ double Pow(double a, double b) { return __nv_pow(a, b); }

/// f(x) for a float or double x (one copy each: the 16-bit floats share float's).
template <class C> __device__ __attribute__((noinline)) C FloatUnary(int f, C x) {
  switch (f) {
    case kNeg: return -x;
    case kAbs: return Fabs(x);  // abs(-0.0) is +0.0
    case kSign: return static_cast<C>((C(0) < x) - (x < C(0)));
    case kSquare: return x * x;
    case kSqrt: return Sqrt(x);
    case kRsqrt: return C(1) / Sqrt(x);
    case kReciprocal: return C(1) / x;
    case kExp: return Exp(x);
    case kLog: return Log(x);
    case kLog1p: return Log1p(x);
    case kExpm1: return Expm1(x);
    case kSin: return Sin(x);
    case kCos: return Cos(x);
    case kTanh: return Tanh(x);
    case kErf: return Erf(x);
    case kRelu: return x > C(0) ? x : C(0);
    case kFloor: return Floor(x);
    case kCeil: return Ceil(x);
    case kRound: return Round(x);
    case kLogicalNot: return static_cast<C>(x == C(0));
    case kSoftplus: {  // scalar_fn.h ExpandUnary: max(x, 0) + log1p(e^-|x|)
      C r = x > C(0) ? x : C(0);
      return r + Log1p(Exp(-Fabs(x)));
    }
    case kMish: {  // x * tanh(softplus(x))
      C r = x > C(0) ? x : C(0);
      return x * Tanh(r + Log1p(Exp(-Fabs(x))));
    }
    default: return x;  // kIdentity
  }
}

/// f(x) for an integer or bool x: wraps around on overflow (two's complement) where the CPU's
/// C++ arithmetic does on x86. Only Numeric functions (and logical_not) reach here.
template <class D> __device__ typename D::C IntUnary(int f, typename D::C x) {
  using C = typename D::C;
  using U = typename D::U;
  switch (f) {
    case kNeg: return static_cast<C>(U(0) - static_cast<U>(x));
    case kAbs: return x < C(0) ? static_cast<C>(U(0) - static_cast<U>(x)) : x;
    case kSign: return static_cast<C>((C(0) < x) - (x < C(0)));
    case kSquare: return static_cast<C>(static_cast<U>(x) * static_cast<U>(x));
    case kRelu: return x > C(0) ? x : C(0);
    case kLogicalNot: return static_cast<C>(x == C(0));
    default: return x;  // floor, ceil, round and identity: integers are their own rounding
  }
}

template <class D> __device__ typename D::C ApplyUnary(int f, typename D::C x) {
  if constexpr (kIsFloat<typename D::C>) return FloatUnary(f, x);
  else return IntUnary<D>(f, x);
}

/// a op b, as ApplyBinary of the CPU (comparisons give 0 or 1). Integer division by zero sets
/// *flag and gives 0.
template <class D> __device__ typename D::C ApplyBinary(int f, typename D::C a, typename D::C b, int* flag) {
  using C = typename D::C;
  if constexpr (kIsFloat<C>) {
    switch (f) {
      case kAdd: return a + b;
      case kSub: return a - b;
      case kMul: return a * b;
      case kDiv: return a / b;
      case kPow: return Pow(a, b);
      default: break;
    }
  } else {
    using U = typename D::U;
    switch (f) {
      case kAdd: return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
      case kSub: return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
      case kMul: return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
      case kDiv:  // truncates toward zero
        if (b == C(0)) {
          *flag = 1;
          return C(0);
        }
        if (C(-1) < C(0) && b == C(-1)) return static_cast<C>(U(0) - static_cast<U>(a));  // MIN / -1 wraps
        return static_cast<C>(a / b);
      case kPow: {
        if (C(-1) < C(0) && b < C(0)) return a == C(1) ? C(1) : a == C(-1) ? (b % 2 ? C(-1) : C(1)) : C(0);
        U r = 1, base = static_cast<U>(a);
        for (C e = b; e > 0; e >>= 1, base = static_cast<U>(base * base))
          if (e & 1) r = static_cast<U>(r * base);
        return static_cast<C>(r);
      }
      default: break;
    }
  }
  switch (f) {
    case kMaximum: return (a != a || a > b) ? a : b;  // NaN propagates
    case kMinimum: return (a != a || a < b) ? a : b;
    case kEqual: return a == b;
    case kNotEqual: return a != b;
    case kLess: return a < b;
    case kLessEqual: return a <= b;
    case kGreater: return a > b;
    default: return a >= b;  // kGreaterEqual
  }
}

// ---- strided indexing ---------------------------------------------------------------------------

#define KILN_DIMS(p) long long p##0, long long p##1, long long p##2, long long p##3, long long p##4, long long p##5
#define KILN_ARRAY(p) {p##0, p##1, p##2, p##3, p##4, p##5}

/// The offsets of output element i in operands whose strides over the output's dims (`size`, the
/// last innermost) are `stride[k]`.
template <int K>
__device__ void Offsets(long long i, const long long* size, const long long (*stride)[kDims], long long* off) {
  for (int k = 0; k < K; ++k) off[k] = 0;
  for (int d = kDims - 1; d >= 0 && i != 0; --d) {  // leading dims of index 0 add nothing
    const long long q = i / size[d], r = i - q * size[d];
    for (int k = 0; k < K; ++k) off[k] += r * stride[k][d];
    i = q;
  }
}

template <class D, class O>
__device__ void UnaryLoop(void* out, const void* x, long long n, int f, int flat, const long long* size,
                          const long long (*stride)[kDims]) {
  auto* y = static_cast<typename O::S*>(out);
  auto* p = static_cast<const typename D::S*>(x);
  for (long long i = GlobalThread(); i < n; i += GridThreads()) {
    long long off = i;
    if (!flat) Offsets<1>(i, size, stride, &off);
    y[i] = O::Store(static_cast<typename O::C>(ApplyUnary<D>(f, D::Load(p[off]))));
  }
}

template <class D, class O>
__device__ void BinaryLoop(void* out, const void* a, const void* b, long long n, int f, int flat, int* flag,
                           const long long* size, const long long (*stride)[kDims]) {
  auto* y = static_cast<typename O::S*>(out);
  auto* pa = static_cast<const typename D::S*>(a);
  auto* pb = static_cast<const typename D::S*>(b);
  for (long long i = GlobalThread(); i < n; i += GridThreads()) {
    long long off[2] = {i, i};
    if (!flat) Offsets<2>(i, size, stride, off);
    y[i] = O::Store(static_cast<typename O::C>(ApplyBinary<D>(f, D::Load(pa[off[0]]), D::Load(pb[off[1]]), flag)));
  }
}

// ---- cast (runtime/cpu/copy.cc: static_cast<D>(static_cast<compute_t<S>>(s))) ------------------

/// compute_t<S> value v converted as the CPU's static_cast does on x86: a float out of an
/// integer's range, or NaN, gives the "integer indefinite" value (the minimum) that cvttss2si
/// gives; uint8 takes the low byte of the int32 conversion; bool is v != 0 (NaN is true); the
/// 16-bit floats round from float (a double is rounded to float first, as Half(float) does).
template <class To, class V> __device__ typename To::S Convert(V v) {
  using S = typename To::S;
  if constexpr (kIsFloat<V>) {
    const double d = static_cast<double>(v);
    if constexpr (__is_same(To, I32)) return d > -2147483649.0 && d < 2147483648.0 ? static_cast<int>(v) : -2147483647 - 1;
    if constexpr (__is_same(To, I64))
      return d >= -9223372036854775808.0 && d < 9223372036854775808.0 ? static_cast<long long>(v)
                                                                         : -9223372036854775807LL - 1;
    if constexpr (__is_same(To, U8))
      return static_cast<S>(d > -2147483649.0 && d < 2147483648.0 ? static_cast<int>(v) : -2147483647 - 1);
  }
  if constexpr (__is_same(To, B8)) return static_cast<S>(v != V(0));
  if constexpr (__is_same(To, F16) || __is_same(To, BF16)) return To::Store(static_cast<float>(v));
  return static_cast<S>(v);
}

template <class From, class To>
__device__ void CastLoop(void* out, const void* x, long long n, int flat, const long long* size,
                         const long long (*stride)[kDims]) {
  auto* y = static_cast<typename To::S*>(out);
  auto* p = static_cast<const typename From::S*>(x);
  for (long long i = GlobalThread(); i < n; i += GridThreads()) {
    long long off = i;
    if (!flat) Offsets<1>(i, size, stride, &off);
    y[i] = Convert<To>(From::Load(p[off]));
  }
}

// ---- reductions (runtime/cpu/reduce.cc) -------------------------------------------------------

constexpr int kThreads = 256;  // kReduceThreads (include/kiln/codegen/ptx.h)
enum Reduce { kSum, kMean, kMax, kMin };

/// What a sum of D accumulates in: float for the 16-bit floats (and float32), double for
/// float64, int64 for integers and bool.
template <class D> struct SumAcc { using T = long long; };
template <> struct SumAcc<F32> { using T = float; };
template <> struct SumAcc<F16> { using T = float; };
template <> struct SumAcc<BF16> { using T = float; };
template <> struct SumAcc<F64> { using T = double; };

template <class A> __device__ A Identity(int kind) {
  if (kind == kSum || kind == kMean) return A(0);
  if constexpr (kIsFloat<A>) return kind == kMax ? -__builtin_inf() : __builtin_inf();
  else if constexpr (sizeof(A) == 1) return kind == kMax ? A(0) : A(255);
  else if constexpr (sizeof(A) == 4) return kind == kMax ? A(-2147483647 - 1) : A(2147483647);
  else return kind == kMax ? A(-9223372036854775807LL - 1) : A(9223372036854775807LL);
}

/// a combined with b: sums add; max and min take b when it is more extreme or NaN, and keep a
/// NaN held (cpu/combine.h).
template <class A> __device__ A Combine(int kind, A a, A b) {
  if (kind == kSum || kind == kMean) return a + b;
  if (kind == kMax) return (b > a || b != b) ? b : a;
  return (b < a || b != b) ? b : a;
}

/// One block of kThreads threads per output row (rows in a block-stride loop): row r reads
/// in[offset of r over the kept dims + offset of j over the reduced dims] for j < len; each thread
/// combines a strided share in A, a tree in shared memory combines the threads.
template <class D, class O, class A>
__device__ void ReduceRows(void* out, const void* in, long long rows, long long len, int kind, const long long* ksize,
                           const long long (*kstride)[kDims], const long long* rsize,
                           const long long (*rstride)[kDims]) {
  __shared__ A partial[kThreads];
  auto* y = static_cast<typename O::S*>(out);
  auto* x = static_cast<const typename D::S*>(in);
  const int t = static_cast<int>(threadIdx.x);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    long long base;
    Offsets<1>(r, ksize, kstride, &base);
    A acc = Identity<A>(kind);
    for (long long j = t; j < len; j += blockDim.x) {
      long long off;
      Offsets<1>(j, rsize, rstride, &off);
      acc = Combine<A>(kind, acc, static_cast<A>(D::Load(x[base + off])));
    }
    partial[t] = acc;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
      if (t < half) partial[t] = Combine<A>(kind, partial[t], partial[t + half]);
      __syncthreads();
    }
    if (t == 0) {
      const A v = partial[0];
      if (kind == kMean)  // as the CPU: the sum over n in double, rounded through compute_t<O>
        y[r] = O::Store(static_cast<typename O::C>(static_cast<double>(v) / static_cast<double>(len)));
      else
        y[r] = O::Store(static_cast<typename O::C>(v));
    }
    __syncthreads();  // slot 0 is read before the next row's stores
  }
}

}  // namespace

// ---- the kernels ------------------------------------------------------------------------------
// kiln_unary_<D>(out, x, n, fn, flat, sizes, x strides): out is D, or bool for logical_not.
// kiln_binary_<D>(out, a, b, n, fn, flat, flag, sizes, a strides, b strides): out is D, or bool
// for the comparisons. kiln_cast_<From>_<To>(out, x, n, flat, sizes, x strides).
// kiln_reduce_<D>(out, in, rows, len, kind, kept sizes and strides, reduced sizes and strides):
// sum (bool sums to int64), mean (floating D), max, min.

#define KILN_ELEMENTWISE(D)                                                                                    \
  extern "C" __global__ void kiln_unary_##D(void* out, const void* x, long long n, int fn, int flat,           \
                                            KILN_DIMS(s), KILN_DIMS(x)) {                                     \
    const long long size[kDims] = KILN_ARRAY(s), stride[1][kDims] = {KILN_ARRAY(x)};                        \
    if (fn == kLogicalNot) UnaryLoop<D, B8>(out, x, n, fn, flat, size, stride);                                \
    else UnaryLoop<D, D>(out, x, n, fn, flat, size, stride);                                                   \
  }                                                                                                            \
  extern "C" __global__ void kiln_binary_##D(void* out, const void* a, const void* b, long long n, int fn,     \
                                             int flat, int* flag, KILN_DIMS(s), KILN_DIMS(a), KILN_DIMS(b)) { \
    const long long size[kDims] = KILN_ARRAY(s), stride[2][kDims] = {KILN_ARRAY(a), KILN_ARRAY(b)};         \
    if (fn >= kEqual) BinaryLoop<D, B8>(out, a, b, n, fn, flat, flag, size, stride);                          \
    else BinaryLoop<D, D>(out, a, b, n, fn, flat, flag, size, stride);                                         \
  }                                                                                                            \
  extern "C" __global__ void kiln_reduce_##D(void* out, const void* in, long long rows, long long len, int kind, \
                                             KILN_DIMS(ks), KILN_DIMS(kt), KILN_DIMS(rs), KILN_DIMS(rt)) {    \
    const long long ksize[kDims] = KILN_ARRAY(ks), kstride[1][kDims] = {KILN_ARRAY(kt)};                     \
    const long long rsize[kDims] = KILN_ARRAY(rs), rstride[1][kDims] = {KILN_ARRAY(rt)};                     \
    if (kind == kSum || kind == kMean) {                                                                       \
      if constexpr (__is_same(D, B8))                                                                          \
        ReduceRows<D, I64, long long>(out, in, rows, len, kind, ksize, kstride, rsize, rstride);               \
      else                                                                                                     \
        ReduceRows<D, D, SumAcc<D>::T>(out, in, rows, len, kind, ksize, kstride, rsize, rstride);              \
    } else {                                                                                                   \
      ReduceRows<D, D, D::C>(out, in, rows, len, kind, ksize, kstride, rsize, rstride);                        \
    }                                                                                                          \
  }

KILN_ELEMENTWISE(F32)
KILN_ELEMENTWISE(F64)
KILN_ELEMENTWISE(F16)
KILN_ELEMENTWISE(BF16)
KILN_ELEMENTWISE(I32)
KILN_ELEMENTWISE(I64)
KILN_ELEMENTWISE(U8)
KILN_ELEMENTWISE(B8)

#define KILN_CAST(From, To)                                                                                   \
  extern "C" __global__ void kiln_cast_##From##_##To(void* out, const void* x, long long n, int flat,         \
                                                     KILN_DIMS(s), KILN_DIMS(x)) {                            \
    const long long size[kDims] = KILN_ARRAY(s), stride[1][kDims] = {KILN_ARRAY(x)};                        \
    CastLoop<From, To>(out, x, n, flat, size, stride);                                                         \
  }
#define KILN_CAST_FROM(From)                                                                                   \
  KILN_CAST(From, F32) KILN_CAST(From, F64) KILN_CAST(From, F16) KILN_CAST(From, BF16) KILN_CAST(From, I32)    \
  KILN_CAST(From, I64) KILN_CAST(From, U8) KILN_CAST(From, B8)

KILN_CAST_FROM(F32)
KILN_CAST_FROM(F64)
KILN_CAST_FROM(F16)
KILN_CAST_FROM(BF16)
KILN_CAST_FROM(I32)
KILN_CAST_FROM(I64)
KILN_CAST_FROM(U8)
KILN_CAST_FROM(B8)
