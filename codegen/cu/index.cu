// The indexing and joining ops' GPU kernels (bound in codegen/gpu_kernels_index.cc), written to
// match the CPU kernels of runtime/cpu/movement.cc, reduce.cc and elementwise.cc exactly:
//   - strided copies and zero fills by element size (concat, stack, split, slice_grad move bytes);
//   - where: the condition of any dtype tested as the CPU does (float(c) != 0), values by size;
//   - argmax / argmin: the first NaN, else the first extremum, of each row along the axis; one
//     thread per row, or one block per row (a shared-memory reduction) for long rows;
//   - take: an index check (the first bad position, by an atomic max of n - j) and a gather that
//     clips, so that a bad index never reads out of bounds before the host raises the error;
//   - take_grad (floating dtypes): deterministic, no floating-point atomics: the (index,
//     position) keys are sorted (bitonic), each index's run found by binary search, and every
//     output element sums its run in position order, as the CPU does: the CPU's bits;
//   - one_hot: on/off values given as bits (converted on the host as the CPU converts them).
// Strided kernels take kDims sizes and strides per operand (unused leading dims size 1, stride 0).
#include "cu_common.h"
#include "kiln/runtime/float16_bits.h"

namespace {

constexpr int kDims = 6;  // kGpuIndexDims of include/kiln/codegen/ptx.h

#define KILN_DIMS(p) long long p##0, long long p##1, long long p##2, long long p##3, long long p##4, long long p##5
#define KILN_ARR(p) {p##0, p##1, p##2, p##3, p##4, p##5}

/// The offset, along strides `s`, of element `i` (row-major) of sizes `n`.
__device__ inline long long Offset(long long i, const long long* n, const long long* s) {
  long long off = 0;
  for (int d = kDims - 1; d >= 0 && i > 0; --d) {  // i == 0: the remaining coordinates are 0
    off += (i % n[d]) * s[d];
    i /= n[d];
  }
  return off;
}

template <class T>
__device__ void CopyStrided(T* dst, const T* src, long long count, const long long* n, const long long* ss,
                            const long long* ds) {
  for (long long i = GlobalThread(); i < count; i += GridThreads()) {
    long long rest = i, so = 0, dof = 0;
    for (int d = kDims - 1; d >= 0 && rest > 0; --d) {
      const long long q = rest % n[d];
      rest /= n[d];
      so += q * ss[d];
      dof += q * ds[d];
    }
    dst[dof] = src[so];
  }
}

// ---- where ----------------------------------------------------------------------------------------

// The condition's truth as the CPU tests it: static_cast<float>(c) != 0 (a float64 too small for
// float32 is false; NaN is true). 16-bit floats: nonzero apart from the sign bit; bytes: nonzero.
__device__ inline bool Truth(float c) { return c != 0.0f; }
__device__ inline bool Truth(double c) { return static_cast<float>(c) != 0.0f; }
__device__ inline bool Truth(int c) { return c != 0; }
__device__ inline bool Truth(long long c) { return c != 0; }
__device__ inline bool Truth(unsigned char c) { return c != 0; }
__device__ inline bool Truth(unsigned short c) { return (c & 0x7fff) != 0; }

template <class C, class T>
__device__ void Where(T* out, const C* cond, const T* a, const T* b, long long count, const long long* n,
                      const long long* cs, const long long* as, const long long* bs) {
  for (long long i = GlobalThread(); i < count; i += GridThreads()) {
    long long rest = i, co = 0, ao = 0, bo = 0;
    for (int d = kDims - 1; d >= 0 && rest > 0; --d) {
      const long long q = rest % n[d];
      rest /= n[d];
      co += q * cs[d];
      ao += q * as[d];
      bo += q * bs[d];
    }
    out[i] = Truth(cond[co]) ? a[ao] : b[bo];
  }
}

// ---- argmax / argmin ------------------------------------------------------------------------------

struct Half16 {
  unsigned short bits;
};
struct BFloat16 {
  unsigned short bits;
};

/// The value compared (the CPU's compute type): 16-bit floats widen exactly to float.
__device__ inline float Value(Half16 h) { return kiln::f16::HalfBitsToFloat(h.bits); }
__device__ inline float Value(BFloat16 h) { return kiln::f16::BFloat16BitsToFloat(h.bits); }
__device__ inline float Value(float x) { return x; }
__device__ inline double Value(double x) { return x; }
__device__ inline int Value(int x) { return x; }
__device__ inline long long Value(long long x) { return x; }
__device__ inline int Value(unsigned char x) { return x; }  // uint8 and bool

/// v rounded to the storage type, as the CPU's Half(float) and BFloat16(float) round
/// (include/kiln/runtime/float16_bits.h): to nearest even, NaN kept a NaN.
__device__ inline Half16 Narrow(float f, Half16) { return {kiln::f16::FloatToHalfBits(f)}; }
__device__ inline BFloat16 Narrow(float f, BFloat16) { return {kiln::f16::FloatToBFloat16Bits(f)}; }
__device__ inline float Narrow(float v, float) { return v; }
__device__ inline double Narrow(double v, double) { return v; }

/// b replaces the best a when strictly better, or when it is the first NaN (the CPU's rule).
template <bool kMax, class C>
__device__ inline bool Better(C b, C a) {
  return (kMax ? b > a : b < a) || (b != b && a == a);
}

/// Thread per row: out[r] = the CPU's answer for row r of `rows` (kept dims n/s), `len` long.
template <class S, bool kMax>
__device__ void ArgRows(long long* out, const S* x, long long rows, long long len, long long sa, const long long* n,
                        const long long* s) {
  for (long long r = GlobalThread(); r < rows; r += GridThreads()) {
    const S* p = x + Offset(r, n, s);
    auto best = Value(p[0]);
    long long arg = 0;
    for (long long l = 1; l < len && best == best; ++l) {
      const auto v = Value(p[l * sa]);
      if (Better<kMax>(v, best)) {
        best = v;
        arg = l;
      }
    }
    out[r] = arg;
  }
}

constexpr int kArgThreads = 256;  // the block size of ArgBlocks (the binding launches with it)

/// Block per row: each thread takes every blockDim-th element (its own first NaN, else first
/// extremum), then a tree reduction keeps NaN over numbers, the extremum, and the lower index
/// among equals: the first NaN of the row, else its first extremum, as on the CPU.
template <class S, bool kMax>
__device__ void ArgBlocks(long long* out, const S* x, long long rows, long long len, long long sa, const long long* n,
                          const long long* s) {
  using C = decltype(Value(S{}));
  __shared__ C best[kArgThreads];
  __shared__ long long arg[kArgThreads];
  const int t = static_cast<int>(threadIdx.x);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* p = x + Offset(r, n, s);
    C b = C();
    long long a = -1;  // none yet
    for (long long l = t; l < len; l += blockDim.x) {
      const C v = Value(p[l * sa]);
      if (a < 0 || Better<kMax>(v, b)) {
        b = v;
        a = l;
      }
      if (b != b) break;  // a NaN: nothing later in this thread's share replaces it
    }
    best[t] = b;
    arg[t] = a;
    __syncthreads();
    for (int w = static_cast<int>(blockDim.x) / 2; w > 0; w /= 2) {
      if (t < w && arg[t + w] >= 0) {
        const C vb = best[t + w], va = best[t];
        const long long ib = arg[t + w], ia = arg[t];
        const bool na = va != va, nb = vb != vb;
        bool take;
        if (ia < 0) take = true;
        else if (na || nb) take = nb && (!na || ib < ia);
        else take = (kMax ? vb > va : vb < va) || (vb == va && ib < ia);
        if (take) {
          best[t] = vb;
          arg[t] = ib;
        }
      }
      __syncthreads();
    }
    if (t == 0) out[r] = arg[0];
    __syncthreads();
  }
}

// ---- take / take_grad / one_hot -------------------------------------------------------------------

/// Records the first index outside [-dim, dim): *flag = max over bad j of n - j (0: none).
template <class I>
__device__ void CheckIndices(const I* ix, long long n, long long dim, long long* flag) {
  for (long long j = GlobalThread(); j < n; j += GridThreads()) {
    const long long k = static_cast<long long>(ix[j]);
    if (k < -dim || k >= dim) __atomic_fetch_max(flag, n - j, __ATOMIC_RELAXED);
  }
}

/// Records the first class label outside [0, depth): *flag = max over bad j of n - j (0: none).
template <class I>
__device__ void CheckLabels(const I* ix, long long n, long long depth, long long* flag) {
  for (long long j = GlobalThread(); j < n; j += GridThreads()) {
    const long long k = static_cast<long long>(ix[j]);
    if (k < 0 || k >= depth) __atomic_fetch_max(flag, n - j, __ATOMIC_RELAXED);
  }
}

/// One thread: copies the first bad index a check flagged into the device's error record
/// (cuda.h DeferredCheck), unless the record holds an error the host has not raised yet.
/// Record: [0] the check (0 none, -1 being written, then `kind`: 1 a bad label, 2 a bad index of
/// take, 3 of take_grad), [1] and [5] the error's number (written first and last: a copy that
/// caught the record half written has them differ), [2] the position, [3] the value, [4] the
/// number of classes or the axis's size, [6] the last number given, [7] the axis.
template <class I>
__device__ void RecordFirstBad(const I* ix, long long n, long long limit, const long long* flag, long long* record,
                               long long kind, long long axis) {
  if (GlobalThread() != 0 || *flag == 0) return;
  long long none = 0;  // claimed by one kernel at a time (lanes run on several streams)
  if (!__atomic_compare_exchange_n(record, &none, -1LL, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
  volatile long long* r = record;  // stored in this order (the copy that publishes it runs after)
  const long long j = n - *flag, number = r[6] + 1;
  r[6] = number;
  r[1] = number;
  r[2] = j;
  r[3] = static_cast<long long>(ix[j]);
  r[4] = limit;
  r[7] = axis;
  r[5] = number;
  r[0] = kind;
}

/// The row an index picks: negative ones wrap; bad ones (already flagged) are clipped so that
/// nothing is read out of bounds before the host raises the error. dim > 0.
template <class I>
__device__ inline long long Row(I i, long long dim) {
  long long k = static_cast<long long>(i);
  if (k < 0) k += dim;
  return k < 0 ? 0 : k >= dim ? dim - 1 : k;
}

/// out[o, j, c] = x[o, ix[j], c] over outer * n * inner elements (contiguous; dim > 0).
template <class T, class I>
__device__ void Take(T* out, const T* x, const I* ix, long long outer, long long n, long long dim, long long inner) {
  const long long count = outer * n * inner;
  for (long long t = GlobalThread(); t < count; t += GridThreads()) {
    const long long c = t % inner, r = t / inner, j = r % n, o = r / n;
    out[t] = x[(o * dim + Row(ix[j], dim)) * inner + c];
  }
}

/// keys[j] = row(ix[j]) * n + j for j < n, and the largest key for the padding up to `padded`.
template <class I>
__device__ void TakeKeys(long long* keys, const I* ix, long long n, long long dim, long long padded) {
  for (long long j = GlobalThread(); j < padded; j += GridThreads())
    keys[j] = j < n ? Row(ix[j], dim) * n + j : 0x7fffffffffffffffLL;
}

/// One compare-exchange step of a bitonic sort of `padded` (a power of 2) keys.
__device__ void BitonicStep(long long* keys, long long padded, long long size, long long stride) {
  for (long long i = GlobalThread(); i < padded; i += GridThreads()) {
    const long long p = i ^ stride;
    if (p <= i) continue;
    const long long a = keys[i], b = keys[p];
    if ((a > b) == ((i & size) == 0)) {
      keys[i] = b;
      keys[p] = a;
    }
  }
}

/// start[k] = the first sorted key of row k or above (k = 0..dim): row k's run is
/// [start[k], start[k + 1]).
__device__ void RunStarts(long long* start, const long long* keys, long long n, long long dim) {
  for (long long k = GlobalThread(); k <= dim; k += GridThreads()) {
    long long lo = 0, hi = n;
    const long long key = k * n;
    while (lo < hi) {
      const long long mid = lo + (hi - lo) / 2;
      if (keys[mid] < key) lo = mid + 1;
      else hi = mid;
    }
    start[k] = lo;
  }
}

/// dx[o, k, c] = the sum, in position order from 0, of dy[o, j, c] over j in row k's run.
/// Each step computes in the CPU's compute type and rounds to the storage type, as the CPU does.
template <class T>
__device__ void TakeGradSum(T* dx, const T* dy, const long long* keys, const long long* start, long long outer,
                            long long n, long long dim, long long inner) {
  using C = decltype(Value(T{}));
  const long long count = outer * dim * inner;
  for (long long t = GlobalThread(); t < count; t += GridThreads()) {
    const long long c = t % inner, r = t / inner, k = r % dim, o = r / dim;
    T s = Narrow(C(0), T{});
    for (long long q = start[k]; q < start[k + 1]; ++q)
      s = Narrow(Value(s) + Value(dy[(o * n + (keys[q] - k * n)) * inner + c]), T{});
    dx[t] = s;
  }
}

/// out[j, c] = on where ix[j] == c, else off (indices outside [0, depth): all off).
template <class T, class I>
__device__ void OneHot(T* out, const I* ix, long long n, long long depth, unsigned long long on_bits,
                       unsigned long long off_bits) {
  T on, off;
  __builtin_memcpy(&on, &on_bits, sizeof(T));  // the low bytes: the value's bits (little-endian)
  __builtin_memcpy(&off, &off_bits, sizeof(T));
  const long long count = n * depth;
  for (long long t = GlobalThread(); t < count; t += GridThreads())
    out[t] = static_cast<long long>(ix[t / depth]) == t % depth ? on : off;
}

}  // namespace

// ---- entry points -----------------------------------------------------------------------------------

#define KILN_BY_SIZE(T, eb)                                                                                    \
  extern "C" __global__ void kiln_index_copy_e##eb(T* dst, const T* src, long long count, KILN_DIMS(n),       \
                                                   KILN_DIMS(s), KILN_DIMS(d)) {                               \
    const long long nn[kDims] = KILN_ARR(n), ss[kDims] = KILN_ARR(s), ds[kDims] = KILN_ARR(d);                \
    CopyStrided(dst, src, count, nn, ss, ds);                                                                  \
  }                                                                                                            \
  extern "C" __global__ void kiln_index_zero_e##eb(T* dst, long long count) {                                  \
    for (long long i = GlobalThread(); i < count; i += GridThreads()) dst[i] = 0;                              \
  }                                                                                                            \
  extern "C" __global__ void kiln_take_e##eb##_i32(T* out, const T* x, const int* ix, long long outer,         \
                                                   long long n, long long dim, long long inner) {              \
    Take(out, x, ix, outer, n, dim, inner);                                                                    \
  }                                                                                                            \
  extern "C" __global__ void kiln_take_e##eb##_i64(T* out, const T* x, const long long* ix, long long outer,   \
                                                   long long n, long long dim, long long inner) {              \
    Take(out, x, ix, outer, n, dim, inner);                                                                    \
  }                                                                                                            \
  extern "C" __global__ void kiln_one_hot_e##eb##_i32(T* out, const int* ix, long long n, long long depth,     \
                                                      unsigned long long on, unsigned long long off) {         \
    OneHot(out, ix, n, depth, on, off);                                                                        \
  }                                                                                                            \
  extern "C" __global__ void kiln_one_hot_e##eb##_i64(T* out, const long long* ix, long long n, long long depth, \
                                                      unsigned long long on, unsigned long long off) {         \
    OneHot(out, ix, n, depth, on, off);                                                                        \
  }

KILN_BY_SIZE(unsigned char, 1)
KILN_BY_SIZE(unsigned short, 2)
KILN_BY_SIZE(unsigned int, 4)
KILN_BY_SIZE(unsigned long long, 8)

#define KILN_WHERE(C, cname, T, eb)                                                                            \
  extern "C" __global__ void kiln_where_##cname##_e##eb(T* out, const C* cond, const T* a, const T* b,        \
                                                        long long count, KILN_DIMS(n), KILN_DIMS(c),           \
                                                        KILN_DIMS(x), KILN_DIMS(y)) {                          \
    const long long nn[kDims] = KILN_ARR(n), cs[kDims] = KILN_ARR(c), as[kDims] = KILN_ARR(x),                \
                    bs[kDims] = KILN_ARR(y);                                                                   \
    Where(out, cond, a, b, count, nn, cs, as, bs);                                                             \
  }
#define KILN_WHERE_COND(C, cname)           \
  KILN_WHERE(C, cname, unsigned char, 1)    \
  KILN_WHERE(C, cname, unsigned short, 2)   \
  KILN_WHERE(C, cname, unsigned int, 4)     \
  KILN_WHERE(C, cname, unsigned long long, 8)

KILN_WHERE_COND(float, f32)
KILN_WHERE_COND(double, f64)
KILN_WHERE_COND(int, i32)
KILN_WHERE_COND(long long, i64)
KILN_WHERE_COND(unsigned char, b8)     // uint8 and bool
KILN_WHERE_COND(unsigned short, h16)   // float16 and bfloat16

#define KILN_ARG(S, sname, kind, kMax)                                                                          \
  extern "C" __global__ void kiln_##kind##_rows_##sname(long long* out, const S* x, long long rows, long long len, \
                                                        long long sa, KILN_DIMS(n), KILN_DIMS(s)) {            \
    const long long nn[kDims] = KILN_ARR(n), ss[kDims] = KILN_ARR(s);                                          \
    ArgRows<S, kMax>(out, x, rows, len, sa, nn, ss);                                                           \
  }                                                                                                             \
  extern "C" __global__ void kiln_##kind##_blocks_##sname(long long* out, const S* x, long long rows,           \
                                                          long long len, long long sa, KILN_DIMS(n),            \
                                                          KILN_DIMS(s)) {                                       \
    const long long nn[kDims] = KILN_ARR(n), ss[kDims] = KILN_ARR(s);                                          \
    ArgBlocks<S, kMax>(out, x, rows, len, sa, nn, ss);                                                         \
  }
#define KILN_ARG_BOTH(S, sname) KILN_ARG(S, sname, argmax, true) KILN_ARG(S, sname, argmin, false)

KILN_ARG_BOTH(float, f32)
KILN_ARG_BOTH(double, f64)
KILN_ARG_BOTH(Half16, f16)
KILN_ARG_BOTH(BFloat16, bf16)
KILN_ARG_BOTH(int, i32)
KILN_ARG_BOTH(long long, i64)
KILN_ARG_BOTH(unsigned char, u8)  // uint8 and bool

#define KILN_INDICES(I, iname)                                                                                 \
  extern "C" __global__ void kiln_check_indices_##iname(const I* ix, long long n, long long dim, long long* flag) { \
    CheckIndices(ix, n, dim, flag);                                                                            \
  }                                                                                                            \
  extern "C" __global__ void kiln_check_labels_##iname(const I* ix, long long n, long long depth, long long* flag) { \
    CheckLabels(ix, n, depth, flag);                                                                           \
  }                                                                                                            \
  extern "C" __global__ void kiln_record_first_bad_##iname(const I* ix, long long n, long long dim,               \
                                                         const long long* flag, long long* record,              \
                                                         long long kind, long long axis) {                      \
    RecordFirstBad(ix, n, dim, flag, record, kind, axis);                                                      \
  }                                                                                                            \
  extern "C" __global__ void kiln_take_keys_##iname(long long* keys, const I* ix, long long n, long long dim,  \
                                                    long long padded) {                                        \
    TakeKeys(keys, ix, n, dim, padded);                                                                        \
  }

KILN_INDICES(int, i32)
KILN_INDICES(long long, i64)

extern "C" __global__ void kiln_bitonic_step(long long* keys, long long padded, long long size, long long stride) {
  BitonicStep(keys, padded, size, stride);
}
extern "C" __global__ void kiln_run_starts(long long* start, const long long* keys, long long n, long long dim) {
  RunStarts(start, keys, n, dim);
}

#define KILN_TAKE_GRAD(T, tname)                                                                               \
  extern "C" __global__ void kiln_take_grad_sum_##tname(T* dx, const T* dy, const long long* keys,            \
                                                        const long long* start, long long outer, long long n,  \
                                                        long long dim, long long inner) {                      \
    TakeGradSum(dx, dy, keys, start, outer, n, dim, inner);                                                    \
  }

KILN_TAKE_GRAD(float, f32)
KILN_TAKE_GRAD(double, f64)
KILN_TAKE_GRAD(Half16, f16)
KILN_TAKE_GRAD(BFloat16, bf16)
