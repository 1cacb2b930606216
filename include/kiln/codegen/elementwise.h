// Fused elementwise kernels compiled to native code at run time (DESIGN.md section 9).
//
// An `Expr` is a small DAG over float32 inputs, constants and the scalar functions of
// kiln/runtime/scalar_fn.h, independent of the graph IR. `CompileElementwise` lowers it to an LLVM
// loop `out[i] = expr(in0[i], in1[i], ...)`, optimizes it at O3 for the host CPU (so it vectorizes
// for AVX2 / AVX-512), JITs it through one process-wide ORC LLJIT and caches it by structure.
//
// Compiled kernels are also kept on disk (KILN_CACHE_DIR, see kiln/codegen/kernel_cache.h), so a later process
// loads them instead of compiling.
//
// Deliberately not here (first version): strides (every input and the output are contiguous;
// an input may be broadcast like a bias), dtypes other than float32, reductions and PTX.
// Functions returning bool (comparisons, logical_not) yield 1.0f / 0.0f.
// This header includes no LLVM header: only codegen/*.cc does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/codegen/kernel_cache.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/scalar_fn.h"

namespace kiln::codegen {

/// CompileElementwise cannot lower this expression (an unsupported function, a malformed DAG);
/// callers catch it and fall back to unfused kernels.
class UnsupportedError : public Error {
  using Error::Error;
};

/// A fused elementwise expression: nodes in topological order (operands refer to earlier
/// nodes by index); the value of `root` (the last node when root is -1) is the output.
///   Expr e; int a = e.Input(0), b = e.Input(1), c = e.Input(2);
///   e.Add(e.Mul(e.Relu(e.Add(e.Mul(a, b), c)), e.Const(0.5)), a);   // relu(a*b + c) * 0.5 + a
struct Expr {
  enum class Kind : uint8_t { kInput, kConst, kUnary, kBinary };
  struct Node {
    Kind kind = Kind::kConst;
    int32_t input = 0;  ///< kInput: which input array
    double value = 0;   ///< kConst: the constant (rounded to float32 in the kernel)
    UnaryFn unary = UnaryFn::kIdentity;
    BinaryFn binary = BinaryFn::kAdd;
    int32_t a = -1, b = -1;  ///< operands (node indices) of kUnary (a) and kBinary (a, b)
    /// kInput broadcast along the output (a bias): element i reads input[(i / inner) % outer];
    /// outer == 0: the input has the output's size and element i reads input[i].
    int64_t inner = 1, outer = 0;
    bool operator==(const Node&) const = default;
  };

  std::vector<Node> nodes;
  int32_t root = -1;

  int Input(int i) { return Push({.kind = Kind::kInput, .input = i}); }
  /// An input broadcast along the output: element i reads input[(i / inner) % outer].
  int InputBroadcast(int i, int64_t inner, int64_t outer) {
    return Push({.kind = Kind::kInput, .input = i, .inner = inner, .outer = outer});
  }
  int Const(double v) { return Push({.kind = Kind::kConst, .value = v}); }
  int Unary(UnaryFn f, int x) { return Push({.kind = Kind::kUnary, .unary = f, .a = x}); }
  int Binary(BinaryFn f, int x, int y) { return Push({.kind = Kind::kBinary, .binary = f, .a = x, .b = y}); }
  int Add(int x, int y) { return Binary(BinaryFn::kAdd, x, y); }
  int Sub(int x, int y) { return Binary(BinaryFn::kSub, x, y); }
  int Mul(int x, int y) { return Binary(BinaryFn::kMul, x, y); }
  int Div(int x, int y) { return Binary(BinaryFn::kDiv, x, y); }
  int Relu(int x) { return Unary(UnaryFn::kRelu, x); }

  /// The output node (root, or the last node).
  int Output() const { return root >= 0 ? root : static_cast<int>(nodes.size()) - 1; }
  /// 1 + the largest input index used (the length of the `ins` array Run expects).
  int NumInputs() const;
  /// Structural hash: equal expressions (same nodes, same order, bitwise-equal constants) hash alike.
  uint64_t Hash() const;
  /// Throws UnsupportedError when an operand is out of order, an index is negative or the DAG is empty.
  void Validate() const;
  /// A one-line form for messages, e.g. "add(mul(relu(add(mul(in0, in1), in2)), 0.5), in0)".
  std::string ToString() const;
  bool operator==(const Expr& o) const { return nodes == o.nodes && Output() == o.Output(); }

 private:
  int Push(Node n) {
    nodes.push_back(n);
    return static_cast<int>(nodes.size()) - 1;
  }
};

/// A JIT-compiled elementwise kernel; the code lives as long as the kernel.
class CompiledKernel {
 public:
  /// The generated function: out[i] = expr(ins[0][i], ...) for i in [begin, end).
  using Fn = void (*)(const float* const* ins, float* out, int64_t begin, int64_t end);

  /// `code` owns the JIT code of `fn` (null: it lives as long as the process).
  CompiledKernel(Fn fn, int num_inputs, double compile_ms, std::string expr, bool from_disk = false,
                 std::shared_ptr<void> code = nullptr)
      : fn_(fn), num_inputs_(num_inputs), compile_ms_(compile_ms), expr_(std::move(expr)), from_disk_(from_disk),
        code_(std::move(code)) {}

  /// Computes out[0, n) split across kiln's CPU threads (host::ParallelFor). `ins` holds
  /// NumInputs() pointers to n floats each; `out` may be one of them (in place).
  void Run(const float* const* ins, float* out, int64_t n) const;
  /// The raw function, for callers that split the range themselves.
  Fn fn() const { return fn_; }
  int num_inputs() const { return num_inputs_; }
  /// Wall time of IR building, O3 and code emission for this kernel (or of loading it from disk).
  double compile_ms() const { return compile_ms_; }
  const std::string& expr() const { return expr_; }
  /// Loaded from the disk cache rather than compiled.
  bool from_disk() const { return from_disk_; }

 private:
  Fn fn_;
  int num_inputs_;
  double compile_ms_;
  std::string expr_;
  bool from_disk_;
  std::shared_ptr<void> code_;
};

/// Compiles `e`, or returns the kernel of a structurally equal expression from the memory cache,
/// or loads it from the disk cache. Thread-safe. Throws UnsupportedError for expressions it
/// cannot lower.
std::shared_ptr<CompiledKernel> CompileElementwise(const Expr& e);

/// Starts creating the process-wide JIT on a background thread, once per process, so that it is
/// ready when the first kernel is linked (about 0.7 ms of LLVM setup, overlapped with tracing
/// and the passes). The tracer calls it when a trace begins; harmless when never needed.
void PrewarmJit();

/// Counters of the elementwise kernels in the kernel cache (kernel_cache.h has every kind's).
CodegenStats GetCodegenStats();

/// The file of the disk cache that holds (or would hold) the kernel of `e`; "" when it is off.
std::string DiskCacheFile(const Expr& e);

/// The optimized LLVM IR text of the most recently compiled kernel (empty before the first, and
/// after a kernel came from the disk cache);
/// for tests and debugging (for example checking that the loop was vectorized).
std::string LastOptimizedIR();

}  // namespace kiln::codegen
