// Graph IR: Nodes (op id, typed attributes, input values) producing typed Values.
// Nodes are kept in insertion order, which is a topological order (a node's inputs exist before
// it). Graph inputs are Values with no producer. The tape of eager autograd is a Graph too.
// What it does not do yet: node removal and rewriting (the pass manager brings those).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/ir/op.h"

namespace kiln::ir {

class Node;

/// What the planning passes decided about a value (passes/memory_planning.h), printed in the text
/// form after its node's types as `@arena+256` (its byte offset in the plan's arena).
struct ValueNote {
  int64_t offset = -1;  ///< byte offset in the arena; -1: not placed there
  bool operator==(const ValueNote&) const = default;
};

/// What the planning passes decided about a node, printed after its types as
/// `#group=3 #stream=1 #wait=%5,%7` (fields left unset print nothing).
struct NodeNote {
  int group = -1;                  ///< fusion group; the group's last member runs it
  int stream = -1;                 ///< the stream (executor lane) it runs on
  std::vector<const Node*> waits;  ///< nodes of other streams it waits for
  bool operator==(const NodeNote&) const = default;
};

class Value {
 public:
  Node* node() const { return node_; }  ///< producer; nullptr for a graph input
  int index() const { return index_; }  ///< output index in the producer
  int id() const { return id_; }
  const TensorType& type() const { return type_; }
  const Shape& shape() const { return type_.shape; }
  DType dtype() const { return type_.dtype; }
  const std::string& name() const { return name_; }
  /// Planning decisions (typed annotations; a graph copy does not carry them).
  const ValueNote& note() const { return note_; }
  ValueNote& note() { return note_; }

 private:
  friend class Graph;
  Node* node_ = nullptr;
  int index_ = 0;
  int id_ = 0;
  TensorType type_;
  std::string name_;
  ValueNote note_;
};

class Node {
 public:
  OpId op() const { return op_; }
  const OpDef& def() const { return GetOp(op_); }
  const Attrs& attrs() const { return attrs_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(int i) const { return inputs_[i]; }
  Value* output(int i = 0) const { return outputs_[i]; }
  int id() const { return id_; }
  /// Planning decisions (typed annotations; a graph copy does not carry them).
  const NodeNote& note() const { return note_; }
  NodeNote& note() { return note_; }

 private:
  friend class Graph;
  OpId op_ = 0;
  Attrs attrs_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  int id_ = 0;
  NodeNote note_;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Value* AddInput(std::string name, TensorType type);
  /// Resolves attributes, infers output types (errors name the op) and appends the node.
  Node* AddNode(OpId op, std::vector<Value*> inputs, const Attrs& attrs = {});
  void SetOutputs(std::vector<Value*> outputs) { outputs_ = std::move(outputs); }

  /// A point to roll back to: everything added after it can be removed again.
  struct Mark {
    size_t nodes, values, inputs;
  };
  Mark GetMark() const { return {nodes_.size(), values_.size(), inputs_.size()}; }
  /// Removes the nodes, values and inputs added since `m` (none of them may be an output).
  void Rollback(const Mark& m);

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  int num_values() const { return static_cast<int>(values_.size()); }

  /// The text form: one line per node, e.g. `%3 = add(%1, %2) : float32(2, 3)`.
  std::string str() const;

 private:
  Value* NewValue(Node* node, int index, TensorType type);
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
};

/// Which value of one graph stands for which value of another (a copy's correspondence).
using ValueMap = std::unordered_map<const Value*, Value*>;

/// Appends a copy of `src`'s nodes [begin, end) (end 0: to the last) to `dst`, in order. Every
/// value a copied node reads must be in `map` already (a graph input mapped by the caller, or the
/// output of a node copied before); `map` gains the copies' outputs. Attributes are copied as
/// resolved and output types inferred again (they match: same op, same input types). Planning
/// notes (NodeNote, ValueNote) are not copied.
void CopyNodes(const Graph& src, Graph& dst, ValueMap& map, size_t begin = 0, size_t end = 0);

/// A whole copy of `src`: its inputs (same names and types, same order), nodes and outputs.
/// `map`, when given, receives the correspondence from `src`'s values to the copy's.
std::unique_ptr<Graph> CopyGraph(const Graph& src, ValueMap* map = nullptr);

/// Appends nodes to a graph with short names, for gradient rules and composites.
class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  /// The first output of a new node of op `op` (op::kAdd, ...).
  Value* Op(OpId op, std::vector<Value*> inputs, const Attrs& attrs = {});
  std::vector<Value*> OpN(OpId op, std::vector<Value*> inputs, const Attrs& attrs = {});
  /// The same by name, for tests and text (code uses the id constants).
  Value* Op(std::string_view name, std::vector<Value*> inputs, const Attrs& attrs = {});
  std::vector<Value*> OpN(std::string_view name, std::vector<Value*> inputs, const Attrs& attrs = {});

  Value* Add(Value* a, Value* b) { return Op(op::kAdd, {a, b}); }
  Value* Sub(Value* a, Value* b) { return Op(op::kSub, {a, b}); }
  Value* Mul(Value* a, Value* b) { return Op(op::kMul, {a, b}); }
  Value* Div(Value* a, Value* b) { return Op(op::kDiv, {a, b}); }
  Value* Neg(Value* a) { return Op(op::kNeg, {a}); }
  /// A 0-d constant of `dtype` (a `full` node).
  Value* Scalar(double v, DType dtype);
  Value* ZerosLike(Value* x);
  Value* OnesLike(Value* x);
  Value* Cast(Value* x, DType dtype);
  Value* Reshape(Value* x, const Shape& shape);
  /// Sums `x` down to `shape` (the inverse of broadcasting; for gradients of broadcast ops).
  Value* SumTo(Value* x, const Shape& shape);

 private:
  Graph& g_;
};

/// What a gradient rule sees of the node it differentiates.
class GradContext : public Builder {
 public:
  GradContext(Graph& g, const Node& node, std::vector<Value*> out_grads)
      : Builder(g), node_(node), out_grads_(std::move(out_grads)) {}
  const Node& node() const { return node_; }
  const Attrs& attrs() const { return node_.attrs(); }
  Value* input(int i) const { return node_.input(i); }
  Value* output(int i = 0) const { return node_.output(i); }
  int num_inputs() const { return static_cast<int>(node_.inputs().size()); }
  /// Gradient of output i; a zeros node when nothing flowed into that output.
  Value* out_grad(int i = 0);
  bool has_out_grad(int i) const { return out_grads_[i] != nullptr; }

 private:
  const Node& node_;
  std::vector<Value*> out_grads_;
};

}  // namespace kiln::ir
