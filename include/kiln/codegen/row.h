// Fused row kernels compiled to native code at run time (DESIGN.md section 9): a reduction with
// its elementwise producers and consumers, such as softmax and log-softmax over the last axis.
//
// A float32 tensor is viewed as `rows x len`, the reduced axes forming one row: the trailing axes
// (a contiguous row, RowProgram::kContiguous), or leading and trailing axes around a kept middle
// block (RowProgram::kStrided: batch-norm statistics over (0, 2, 3) of NCHW, one row per channel),
// or leading axes only (RowProgram::kColumns: a sum over (0,) of a matrix, one row per column).
// A `RowProgram` computes, for each row: values reduced over the row (sum, mean, max, min of
// an elementwise expression, in order, each free to read the ones before it), values computed
// once per row from those, and outputs that are either elementwise (one value per element, read
// from the row's elements and its row values) or row values themselves. `CompileRow` lowers it to
// a loop over rows with one vectorized pass per reduction and one for the elementwise outputs
// (a strided row: an outer loop over its stretches, the inner one vectorized; columns: blocks of
// adjacent rows, each pass a loop over the row around a vectorized loop across the block),
// JITs it through the process-wide ORC LLJIT of CompileElementwise and caches it by structure, in
// memory and on disk (the kernel cache of kiln/codegen/kernel_cache.h).
// The kernel does not depend on `rows` or `len`: they are arguments.
//
// Numerics: sums accumulate in float lanes whose additions may be reassociated (vectorized), so a
// sum differs from the unfused kernel (float lanes flushed into double) by about len * 2^-24 of the
// sum of magnitudes at worst; mean is the sum times 1/len. max/min propagate NaN like the unfused
// kernels (llvm.maximum/minimum); a tie of -0.0 and +0.0 yields +0.0 for max and -0.0 for min, where
// the unfused kernel yields whichever its lane order meets first. Over an empty row sum is 0 and
// mean NaN (max/min of an empty row are refused by the op's shape inference, never reach here).
//
// A strided row sums each stretch of `inner` contiguous elements in float lanes and adds the
// stretches in double, so its error is about inner * 2^-24 of the sum of magnitudes. A column
// (kColumns) is summed in order, in float: about len * 2^-24 of the sum of magnitudes.
//
// Deliberately not here: arbitrary strides (reduced axes that are not leading and trailing
// around one kept block), dtypes other than float32 (except one-hot labels), PTX.
// This header includes no LLVM header: only codegen/*.cc does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/codegen/elementwise.h"

namespace kiln::codegen {

/// What a row program computes. Expressions name their operands as Expr inputs: index
/// k < inputs.size() is array k (read as its InputKind says); index inputs.size() + v is row value v;
/// in outputs only, index inputs.size() + steps.size() + k is the element of output k's array that
/// a step stashed there (see Step::stash), read before the outputs are stored.
///   // softmax over rows: v0 = max(x), v1 = sum(exp(x - v0)), out = exp(x - v0) / v1
///   RowProgram p;
///   p.inputs = {RowProgram::kElement};
///   Expr m; m.Input(0);                                   p.AddReduce(RowProgram::kMax, m);
///   Expr s; s.Unary(UnaryFn::kExp, s.Sub(s.Input(0), s.Input(1))); p.AddReduce(RowProgram::kSum, s);
///   Expr o; int e = o.Unary(UnaryFn::kExp, o.Sub(o.Input(0), o.Input(1))); o.Div(e, o.Input(2));
///   p.AddOutput(o);
struct RowProgram {
  /// Where element j of row r lies in a tensor of the whole shape. The kernel's arguments are the
  /// row length `len`, `rows` (kStrided, kColumns) and `inner` (kStrided: len is a multiple of it).
  enum Layout : uint8_t {
    kContiguous, ///< at r * len + j: the reduced axes are the trailing ones
    kStrided,    ///< at (j / inner) * rows * inner + r * inner + j % inner: leading and trailing
                 ///< axes reduced (outer = len / inner and inner elements), the middle ones kept
    kColumns,    ///< at j * rows + r: the leading axes reduced, the trailing ones kept (a column
                 ///< sum over (0,)); adjacent rows are computed together, vectorized across them
  };
  /// How array k is read at element j of row r.
  enum InputKind : uint8_t {
    kElement,  ///< the element's position in the whole tensor (see Layout)
    kRow,      ///< in[r]: one value per row (a keepdims reduction's shape)
    kColumn,   ///< in[j]: one value per position in the row (a bias along the row); kContiguous only
    kScalar,   ///< in[0]: one value
    kOneHot,   ///< int64 labels, one per row: 1 where j == label[r], else 0 (a one_hot of depth len);
               ///< not kColumns
    kOneHot32, ///< the same with int32 labels
  };
  /// How row value v is made: kSum, kMean, kMax and kMin reduce `expr`, computed per element,
  /// over the row; kPerRow computes `expr` once per row and reads only kRow and kScalar arrays.
  enum StepKind : uint8_t { kSum, kMean, kMax, kMin, kPerRow };
  struct Step {
    StepKind kind = kSum;
    Expr expr;
    /// A reduction may also store its per-element values into elementwise output `stash`'s array,
    /// so that the outputs read them instead of computing them again (softmax's exp). -1: not.
    int32_t stash = -1;
    bool operator==(const Step&) const = default;
  };
  struct Output {
    int32_t row_value = -1; ///< >= 0: writes row value `row_value` (rows floats)
    Expr expr;              ///< otherwise: writes expr per element (rows * len floats)
    bool operator==(const Output&) const = default;
  };

  Layout layout = kContiguous;
  std::vector<InputKind> inputs;
  std::vector<Step> steps; ///< step v defines row value v; its expr reads row values < v only
  std::vector<Output> outputs;

  /// Appends a step and returns the Expr input index of its row value.
  int AddReduce(StepKind kind, Expr e) {
    steps.push_back({kind, std::move(e), -1});
    return static_cast<int>(inputs.size() + steps.size()) - 1;
  }
  /// Appends an output computing `e` per element.
  void AddOutput(Expr e) { outputs.push_back({-1, std::move(e)}); }
  /// Appends an output writing row value `v` (0 for the first step).
  void AddRowOutput(int v) { outputs.push_back({v, Expr{}}); }

  /// Structural hash: equal programs hash alike.
  uint64_t Hash() const;
  /// Throws UnsupportedError when an expression reads an operand it may not (a later row value,
  /// an element of the row in a per-row step, a stash no step makes), a node is malformed, a stash
  /// is not an elementwise output or is made twice, a strided program reads a kColumn array (or a
  /// kColumns one a kColumn or one-hot array), or there is no output.
  void Validate() const;
  /// A one-line form for messages and the compile report, e.g.
  /// "v0 = max(in0); v1 = sum(exp(sub(in0, v0))) -> out0; out0 = div(out0, v1)" (a stash is "-> outK";
  /// a strided program starts with "strided: ", a kColumns one with "columns: "; one-hot labels
  /// read as their one-hot values are "onehot(inK)").
  std::string ToString() const;
  bool operator==(const RowProgram&) const = default;
};

/// A JIT-compiled row kernel; the code lives as long as the kernel and its copies (Bind).
class RowKernel {
public:
  /// The generated function: rows [row_begin, row_end) of length `len`, of `rows` in all (kStrided,
  /// kColumns), with `inner` contiguous elements per stretch (kStrided). Others ignore them.
  using Fn = void (*)(const float* const* ins, float* const* outs, int64_t row_begin, int64_t row_end,
                      int64_t len, int64_t rows, int64_t inner);

  /// `code` owns the JIT code of `fn` (null: it lives as long as the process).
  RowKernel(Fn fn, int num_inputs, int num_outputs, double compile_ms, std::string text, bool from_disk = false,
            std::shared_ptr<void> code = nullptr)
      : fn_(fn), num_inputs_(num_inputs), num_outputs_(num_outputs), compile_ms_(compile_ms),
        text_(std::move(text)), from_disk_(from_disk), code_(std::move(code)) {}

  /// Runs every row, split by rows across kiln's CPU threads (host::ParallelFor). `ins` holds
  /// num_inputs() arrays sized as their InputKind says; `outs` holds num_outputs() arrays, none of
  /// which may overlap an input. A strided kernel runs with the `inner` it was bound to (Bind).
  void Run(const float* const* ins, float* const* outs, int64_t rows, int64_t len) const {
    Run(ins, outs, rows, len, inner_);
  }
  void Run(const float* const* ins, float* const* outs, int64_t rows, int64_t len, int64_t inner) const;
  /// The same code bound to a strided layout's `inner` (what Run(ins, outs, rows, len) passes):
  /// callers that know only rows and len run strided kernels through it.
  std::shared_ptr<RowKernel> Bind(int64_t inner) const {
    auto k = std::make_shared<RowKernel>(*this);
    k->inner_ = inner;
    return k;
  }
  Fn fn() const { return fn_; }
  int num_inputs() const { return num_inputs_; }
  int num_outputs() const { return num_outputs_; }
  /// Wall time of IR building, O3 and code emission for this kernel (or of loading it from disk).
  double compile_ms() const { return compile_ms_; }
  /// The program's ToString().
  const std::string& text() const { return text_; }
  /// Loaded from the disk cache rather than compiled.
  bool from_disk() const { return from_disk_; }

private:
  Fn fn_;
  int num_inputs_, num_outputs_;
  int64_t inner_ = 1;
  double compile_ms_;
  std::string text_;
  bool from_disk_;
  std::shared_ptr<void> code_;
};

/// Compiles `p`, or returns the kernel of a structurally equal program from the memory cache, or
/// loads it from the disk cache (kernel_cache.h). Thread-safe. Throws UnsupportedError for
/// programs it cannot lower.
std::shared_ptr<RowKernel> CompileRow(const RowProgram& p);

/// Counters of the row kernels in the kernel cache.
CodegenStats GetRowStats();

/// The file of the disk cache that holds (or would hold) the kernel of `p`; "" when it is off.
std::string DiskCacheFile(const RowProgram& p);

/// The optimized LLVM IR text of the most recently compiled row kernel (empty after a kernel came
/// from the disk cache); for tests and debugging.
std::string LastRowIR();

} // namespace kiln::codegen
