// The op table (DESIGN.md section 3): every op is declared once, in one of ir/ops_*.cc, and that
// declaration drives everything else: name and attribute schema, arity, shape and dtype
// inference, fusion kind, the gradient rule (graph construction in terms of other ops, shared by
// eager autograd and graph autodiff), and for elementwise ops the scalar function codegen emits.
// Ids, names and scalar functions come from the op list (kiln/runtime/op_list.h; constants
// kiln::op::kAdd, ...), which runtime/ also sees; the table checks at start-up that every listed
// op is declared here exactly once. Kernels are bound to ids per device in runtime/ (kernel.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/ir/attrs.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/op_id.h"
#include "kiln/runtime/scalar_fn.h"

namespace kiln::ir {

using kiln::OpId;
namespace op = kiln::op;

/// How an op may take part in fusion (TVM's OpPatternKind).
enum class FusionKind : uint8_t {
  kElementwise,         ///< out[i] = f(in[i]) over equal shapes
  kBroadcast,           ///< elementwise with NumPy broadcasting of inputs
  kInjective,           ///< each output element reads one input element (reshape, transpose, ...)
  kReduce,              ///< reduction over axes
  kOutEwiseFusable,     ///< matmul/conv: an elementwise epilogue can be fused onto the output
  kOpaque,              ///< never fused
};
const char* FusionKindName(FusionKind k);

/// Static type of a value: shape and dtype.
struct TensorType {
  Shape shape;
  DType dtype = DType::kFloat32;
  friend bool operator==(const TensorType&, const TensorType&) = default;
};

struct OpDef;
class Value;
class GradContext;

/// Infers output types from input types and attributes; throws ShapeError / DTypeError naming
/// the op, the offending shapes and what was expected.
using InferFn = std::function<std::vector<TensorType>(const OpDef& op, std::span<const TensorType> in,
                                                      const Attrs& attrs)>;
/// Builds the gradient of each input from the gradients of the outputs (see GradContext).
/// Returns one Value* per input; nullptr means "no gradient flows into this input".
using GradFn = std::function<std::vector<Value*>(GradContext& g)>;

/// One op's declaration. `id`, `name`, `unary_fn` and `binary_fn` (OpInfo, what kernels see)
/// come from the op list: construct with OpDef(op::kAdd).
struct OpDef : OpInfo {
  OpDef() = default;
  explicit OpDef(OpId id);
  int num_inputs = 1;   ///< -1: variadic, at least one
  int num_outputs = 1;  ///< -1: given by `outputs_from_attrs`
  std::function<int(const Attrs&, int num_inputs)> outputs_from_attrs;
  std::vector<AttrSpec> attrs;
  FusionKind fusion = FusionKind::kOpaque;
  InferFn infer;
  GradFn grad;              ///< empty together with differentiable=false: not differentiable
  bool differentiable = true;
  bool random = false;      ///< consumes the random generator (seed and offset)
  /// Generator counter space one call consumes; empty: the number of output elements.
  std::function<int64_t(const Attrs&)> random_numel;
  std::string doc;          ///< one line

  /// Checks caller-supplied attributes against the schema: fills defaults, orders them, and
  /// throws ValueError naming the op for unknown names, missing required ones or wrong kinds.
  Attrs Resolve(const Attrs& given) const;
  int NumOutputs(const Attrs& attrs, int n_inputs) const;
  /// Checks arity, then runs `infer`.
  std::vector<TensorType> Infer(std::span<const TensorType> in, const Attrs& attrs) const;
};

/// The table, indexed by op id. Built on first use by calling every Register*Ops function (no
/// static-init order or dropped-object-file surprises), then checked: every op of the op list
/// declared exactly once.
class OpTable {
 public:
  static const OpTable& Get();
  const OpDef& operator[](OpId id) const { return *ops_[id]; }
  /// Throws ValueError listing close names when `name` is not an op.
  OpId Find(std::string_view name) const;
  std::optional<OpId> TryFind(std::string_view name) const;
  size_t size() const { return ops_.size(); }

  /// Adds a declaration (used by the Register*Ops functions); returns it for chained setup.
  /// `def.id` must be an op of the op list not declared before.
  OpDef& Add(OpDef def);
  /// Throws InternalError naming every op of the op list that was never declared.
  void CheckComplete() const;

 private:
  std::vector<std::unique_ptr<OpDef>> ops_ = std::vector<std::unique_ptr<OpDef>>(op::kNumOps);
};

/// Shorthand for OpTable::Get().Find(name): for names from text, files and users. Code that
/// means a particular op uses its constant (op::kAdd).
inline OpId FindOp(std::string_view name) { return OpTable::Get().Find(name); }
/// The op whose name is closest to `name` (edit distance), for "did you mean" messages.
std::string ClosestOpName(std::string_view name);
inline const OpDef& GetOp(OpId id) { return OpTable::Get()[id]; }

// One registration function per group of ops (ir/ops_<group>.cc).
void RegisterElementwiseOps(OpTable& t);
void RegisterReduceOps(OpTable& t);
void RegisterMovementOps(OpTable& t);
void RegisterNNOps(OpTable& t);
void RegisterCreationOps(OpTable& t);
void RegisterGraphOps(OpTable& t);  // call_graph.h

}  // namespace kiln::ir
