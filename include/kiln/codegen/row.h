// Fused row kernels compiled to native code at run time (DESIGN.md section 9): a reduction with
// its elementwise producers and consumers, such as softmax and log-softmax over the last axis.
//
// A float32 tensor is viewed as `rows x len`, the reduced (trailing, contiguous) axes forming one
// row. A `RowProgram` computes, for each row: values reduced over the row (sum, mean, max, min of
// an elementwise expression, in order, each free to read the ones before it), values computed
// once per row from those, and outputs that are either elementwise (one value per element, read
// from the row's elements and its row values) or row values themselves. `CompileRow` lowers it to
// a loop over rows with one vectorized pass per reduction and one for the elementwise outputs,
// JITs it through the process-wide ORC LLJIT of CompileElementwise and caches it by structure.
// The kernel does not depend on `rows` or `len`: they are arguments.
//
// Numerics: sums accumulate in float lanes whose additions may be reassociated (vectorized), so a
// sum differs from the unfused kernel (float lanes flushed into double) by about len * 2^-24 of the
// sum of magnitudes at worst; mean is the sum times 1/len. max/min propagate NaN like the unfused
// kernels (llvm.maximum/minimum); a tie of -0.0 and +0.0 yields +0.0 for max and -0.0 for min, where
// the unfused kernel yields whichever its lane order meets first. Over an empty row sum is 0 and
// mean NaN (max/min of an empty row are refused by the op's shape inference, never reach here).
//
// Deliberately not here: strides, dtypes other than float32, reductions over leading or middle
// axes, PTX, the disk cache (row kernels are compiled once per process).
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
  /// How array k is read at element j of row r.
  enum InputKind : uint8_t {
    kElement, ///< in[r * len + j]: the shape of the whole tensor
    kRow,     ///< in[r]: one value per row (a keepdims reduction's shape)
    kColumn,  ///< in[j]: one value per position in the row (a bias along the row)
    kScalar,  ///< in[0]: one value
  };
  /// How row value v is made: kSum, kMean, kMax and kMin reduce `expr`, computed per element,
  /// over the row; kPerRow computes `expr` once per row and reads no kElement or kColumn array.
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
  /// is not an elementwise output or is made twice, or there is no output.
  void Validate() const;
  /// A one-line form for messages and the compile report, e.g.
  /// "v0 = max(in0); v1 = sum(exp(sub(in0, v0))) -> out0; out0 = div(out0, v1)" (a stash is "-> outK").
  std::string ToString() const;
  bool operator==(const RowProgram&) const = default;
};

/// A JIT-compiled row kernel; the code lives as long as the process.
class RowKernel {
public:
  /// The generated function: rows [row_begin, row_end) of length `len`.
  using Fn = void (*)(const float* const* ins, float* const* outs, int64_t row_begin, int64_t row_end,
                      int64_t len);

  RowKernel(Fn fn, int num_inputs, int num_outputs, double compile_ms, std::string text)
      : fn_(fn), num_inputs_(num_inputs), num_outputs_(num_outputs), compile_ms_(compile_ms),
        text_(std::move(text)) {}

  /// Runs every row, split by rows across kiln's CPU threads (host::ParallelFor). `ins` holds
  /// num_inputs() arrays sized as their InputKind says; `outs` holds num_outputs() arrays, none of
  /// which may overlap an input.
  void Run(const float* const* ins, float* const* outs, int64_t rows, int64_t len) const;
  Fn fn() const { return fn_; }
  int num_inputs() const { return num_inputs_; }
  int num_outputs() const { return num_outputs_; }
  /// Wall time of IR building, O3 and code emission for this kernel.
  double compile_ms() const { return compile_ms_; }
  /// The program's ToString().
  const std::string& text() const { return text_; }

private:
  Fn fn_;
  int num_inputs_, num_outputs_;
  double compile_ms_;
  std::string text_;
};

/// Compiles `p`, or returns the kernel of a structurally equal program from the memory cache.
/// Thread-safe. Throws UnsupportedError for programs it cannot lower.
std::shared_ptr<RowKernel> CompileRow(const RowProgram& p);

/// Counters of the row kernel cache (compiles and cache hits, as in CodegenStats).
CodegenStats GetRowStats();

/// The optimized LLVM IR text of the most recently compiled row kernel; for tests and debugging.
std::string LastRowIR();

} // namespace kiln::codegen
