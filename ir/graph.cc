// Graph, Node and Value (see graph.h), the graph copier, and the Builder's shorthands.
#include "kiln/ir/graph.h"

#include <sstream>

#include "kiln/ir/text.h"

#include "kiln/runtime/error.h"

namespace kiln::ir {

Value* Graph::NewValue(Node* node, int index, TensorType type) {
  auto v = std::make_unique<Value>();
  v->node_ = node;
  v->index_ = index;
  v->id_ = static_cast<int>(values_.size());
  v->type_ = type;
  values_.push_back(std::move(v));
  return values_.back().get();
}

Value* Graph::AddInput(std::string name, TensorType type) {
  Value* v = NewValue(nullptr, 0, type);
  v->name_ = std::move(name);
  inputs_.push_back(v);
  return v;
}

Node* Graph::AddNode(OpId op, std::vector<Value*> inputs, const Attrs& attrs) {
  const OpDef& def = GetOp(op);
  Attrs resolved = def.Resolve(attrs);
  std::vector<TensorType> in_types;
  in_types.reserve(inputs.size());
  for (Value* v : inputs) {
    KILN_CHECK(v) << "null input to " << def.name;
    in_types.push_back(v->type());
  }
  std::vector<TensorType> out_types = def.Infer(in_types, resolved);
  auto n = std::make_unique<Node>();
  n->op_ = op;
  n->attrs_ = std::move(resolved);
  n->inputs_ = std::move(inputs);
  n->id_ = static_cast<int>(nodes_.size());
  for (size_t i = 0; i < out_types.size(); ++i)
    n->outputs_.push_back(NewValue(n.get(), static_cast<int>(i), out_types[i]));
  nodes_.push_back(std::move(n));
  return nodes_.back().get();
}

void Graph::Rollback(const Mark& m) {
  KILN_CHECK(m.nodes <= nodes_.size() && m.values <= values_.size() && m.inputs <= inputs_.size());
  nodes_.resize(m.nodes);
  values_.resize(m.values);
  inputs_.resize(m.inputs);
}

// One text form (text.h): what str() prints parses back to the same graph.
std::string Graph::str() const { return PrintGraph(*this); }

void CopyNodes(const Graph& src, Graph& dst, ValueMap& map, size_t begin, size_t end) {
  if (end == 0 || end > src.nodes().size()) end = src.nodes().size();
  for (size_t i = begin; i < end; ++i) {
    const Node& n = *src.nodes()[i];
    std::vector<Value*> in;
    in.reserve(n.inputs().size());
    for (const Value* v : n.inputs()) {
      auto it = map.find(v);
      KILN_CHECK(it != map.end()) << "CopyNodes: node " << n.id() << " (" << n.def().name
                                  << ") reads a value that was not mapped";
      in.push_back(it->second);
    }
    Node* c = dst.AddNode(n.op(), std::move(in), n.attrs());
    for (size_t k = 0; k < n.outputs().size(); ++k) map[n.outputs()[k]] = c->outputs()[k];
  }
}

std::unique_ptr<Graph> CopyGraph(const Graph& src, ValueMap* map) {
  auto g = std::make_unique<Graph>();
  ValueMap local;
  ValueMap& m = map ? *map : local;
  for (const Value* v : src.inputs()) m[v] = g->AddInput(v->name(), v->type());
  CopyNodes(src, *g, m);
  std::vector<Value*> outs;
  for (const Value* v : src.outputs()) outs.push_back(m.at(v));
  g->SetOutputs(std::move(outs));
  return g;
}

Value* Builder::Op(OpId op, std::vector<Value*> inputs, const Attrs& attrs) {
  return g_.AddNode(op, std::move(inputs), attrs)->output(0);
}

std::vector<Value*> Builder::OpN(OpId op, std::vector<Value*> inputs, const Attrs& attrs) {
  return g_.AddNode(op, std::move(inputs), attrs)->outputs();
}

Value* Builder::Op(std::string_view name, std::vector<Value*> inputs, const Attrs& attrs) {
  return Op(FindOp(name), std::move(inputs), attrs);
}

std::vector<Value*> Builder::OpN(std::string_view name, std::vector<Value*> inputs, const Attrs& attrs) {
  return OpN(FindOp(name), std::move(inputs), attrs);
}

Value* Builder::Scalar(double v, DType dtype) {
  return Op(op::kFull, {}, {{"shape", std::vector<int64_t>{}}, {"value", v}, {"dtype", dtype}});
}

Value* Builder::ZerosLike(Value* x) {
  return Op(op::kFull, {}, {{"shape", x->shape().vec()}, {"value", 0.0}, {"dtype", x->dtype()}});
}

Value* Builder::OnesLike(Value* x) {
  return Op(op::kFull, {}, {{"shape", x->shape().vec()}, {"value", 1.0}, {"dtype", x->dtype()}});
}

Value* Builder::Cast(Value* x, DType dtype) {
  if (x->dtype() == dtype) return x;
  return Op(op::kCast, {x}, {{"dtype", dtype}});
}

Value* Builder::Reshape(Value* x, const Shape& shape) {
  if (x->shape() == shape) return x;
  return Op(op::kReshape, {x}, {{"shape", shape.vec()}});
}

Value* Builder::SumTo(Value* x, const Shape& shape) {
  if (x->shape() == shape) return x;
  const Shape& xs = x->shape();
  int lead = xs.rank() - shape.rank();
  KILN_CHECK(lead >= 0) << "SumTo " << xs.str() << " -> " << shape.str();
  std::vector<int64_t> axes;
  for (int i = 0; i < xs.rank(); ++i) {
    int j = i - lead;
    if (j < 0 || (shape[j] == 1 && xs[i] != 1)) axes.push_back(i);
  }
  Value* s = axes.empty() ? x : Op(op::kSum, {x}, {{"axes", axes}, {"keepdims", true}});
  return Reshape(s, shape);
}

Value* GradContext::out_grad(int i) {
  if (!out_grads_[i]) out_grads_[i] = ZerosLike(node_.output(i));
  return out_grads_[i];
}

}  // namespace kiln::ir
