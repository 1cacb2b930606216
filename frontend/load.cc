// kiln::load: an exported graph and its parameters, checked against each other, uploaded and
// compiled (see include/kiln/frontend/load.h). The file formats and their checks live in ir/;
// this file adds the context of a load (both file names), the per-call input checks, and the
// plans for other input shapes (passes/reshape_inputs.h), compiled on first use and cached.
#include "kiln/frontend/load.h"

#include <filesystem>
#include <list>
#include <mutex>

#include "kiln/frontend/cached_graph.h"
#include "kiln/passes/reshape_inputs.h"
#include "kiln/runtime/error.h"

namespace kiln {

struct Module::State {
  std::shared_ptr<CachedGraph> compiled;
  ir::GraphManifest manifest;
  std::vector<ir::TensorType> input_types;
  std::vector<Tensor> params;
  Device device;
  std::unique_ptr<ir::Graph> traced;  // the graph as exported, re-shaped for other input shapes
  // Plans for input shapes other than the exported ones, most recently used first.
  mutable std::mutex mu;
  mutable std::list<std::pair<std::vector<Shape>, std::shared_ptr<CachedGraph>>> reshaped;

  std::shared_ptr<CachedGraph> PlanFor(const std::vector<Tensor>& inputs) const;
};

std::shared_ptr<CachedGraph> Module::State::PlanFor(const std::vector<Tensor>& inputs) const {
  std::vector<Shape> shapes;
  bool same = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    shapes.push_back(inputs[i].shape());
    same = same && inputs[i].shape() == input_types[i].shape;
  }
  if (same) return compiled;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = reshaped.begin(); it != reshaped.end(); ++it)
    if (it->first == shapes) {
      reshaped.splice(reshaped.begin(), reshaped, it);
      return it->second;
    }
  std::unique_ptr<ir::Graph> g;
  try {
    g = passes::ReshapeInputs(*traced, shapes);
  } catch (const ShapeError& e) {
    KILN_THROW(ShapeError) << "model call: " << e.what();
  }
  auto plan = CachedGraph::FromGraph(std::move(g), static_cast<int>(inputs.size()), params, device);
  reshaped.emplace_front(std::move(shapes), plan);
  if (reshaped.size() > kMaxReshapedPlans) reshaped.pop_back();
  return plan;
}

namespace {

std::string TypeStr(DType dtype, const Shape& shape) { return std::string(DTypeName(dtype)) + shape.str(); }

std::string Signature(const Module::State& s) {
  std::string out;
  for (size_t i = 0; i < s.manifest.inputs.size(); ++i)
    out += (i ? ", " : "") + s.manifest.inputs[i] + ": " +
           TypeStr(s.input_types[i].dtype, s.input_types[i].shape);
  return "(" + out + ")";
}

}  // namespace

std::string DefaultParamsPath(const std::string& symbol_file) {
  const std::string suffix = "-symbol.json";
  if (symbol_file.size() > suffix.size() &&
      symbol_file.compare(symbol_file.size() - suffix.size(), suffix.size(), suffix) == 0)
    return symbol_file.substr(0, symbol_file.size() - suffix.size()) + "-0000.params";
  std::filesystem::path p(symbol_file);
  return p.replace_extension().string() + "-0000.params";
}

Module load(const std::string& symbol_file, const std::string& param_file, Device device) {
  CheckDeviceExists(device);
  // ir/ names the file in every message and says what to do; we add which call was loading.
  auto with_context = [&](auto&& step) {
    try {
      return step();
    } catch (const FormatError& e) {
      KILN_THROW(FormatError) << "kiln::load: " << e.what();
    }
  };
  ir::LoadedGraph loaded = with_context([&] { return ir::LoadGraph(symbol_file); });
  std::vector<ir::NamedHostTensor> host = with_context([&] { return ir::LoadParams(param_file); });
  std::vector<const ir::HostTensor*> ordered = ir::CheckParams(
      *loaded.graph, loaded.manifest, host,
      "kiln::load: the parameters in '" + param_file + "' do not fit the graph in '" + symbol_file + "'");

  auto s = std::make_shared<Module::State>();
  s->device = device;
  s->manifest = std::move(loaded.manifest);
  const auto& ins = loaded.graph->inputs();
  for (size_t i = 0; i < s->manifest.inputs.size(); ++i) s->input_types.push_back(ins[i]->type());
  for (const ir::HostTensor* t : ordered)
    s->params.push_back(Tensor::FromHost(t->bytes.data(), t->shape, t->dtype, device));
  s->traced = ir::CopyGraph(*loaded.graph);
  s->compiled = CachedGraph::FromGraph(std::move(loaded.graph), static_cast<int>(s->manifest.inputs.size()),
                                       s->params, device);
  return Module(std::move(s));
}

std::vector<Tensor> Module::operator()(const std::vector<Tensor>& inputs) const {
  const State& s = *s_;
  if (inputs.size() != s.manifest.inputs.size())
    KILN_THROW(ValueError) << "model call: expected " << s.manifest.inputs.size() << " input(s) "
                           << Signature(s) << ", found " << inputs.size()
                           << "; pass one tensor per input, in this order";
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const std::string& name = s.manifest.inputs[i];
    const ir::TensorType& want = s.input_types[i];
    if (!t.defined())
      KILN_THROW(ValueError) << "model call: input '" << name << "' is an undefined tensor; expected "
                             << TypeStr(want.dtype, want.shape);
    std::string mismatch = "input '" + name + "' expects " + TypeStr(want.dtype, want.shape) + ", found " +
                           TypeStr(t.dtype(), t.shape());
    if (t.dtype() != want.dtype)
      KILN_THROW(DTypeError) << "model call: " << mismatch << "; cast it with AsType(" << DTypeName(want.dtype)
                             << ")";
    if (t.shape().rank() != want.shape.rank())
      KILN_THROW(ShapeError) << "model call: " << mismatch << "; only the sizes of an input can change, "
                             << "pass a rank-" << want.shape.rank() << " tensor";
    if (!t.impl()->symbol && t.device() != s.device)
      KILN_THROW(DeviceError) << "model call: input '" << name << "' is on " << t.device().str()
                              << " but the model was loaded on " << s.device.str() << "; move it with To("
                              << s.device.str() << ")";
  }
  return s.PlanFor(inputs)->Call(inputs);
}

const std::vector<std::string>& Module::input_names() const { return s_->manifest.inputs; }
const std::vector<ir::TensorType>& Module::input_types() const { return s_->input_types; }
const std::vector<std::string>& Module::param_names() const { return s_->manifest.params; }
const std::vector<Tensor>& Module::params() const { return s_->params; }
int Module::num_outputs() const { return s_->compiled->num_outputs(); }
const ir::OutputStructure& Module::output_structure() const { return s_->manifest.output_structure; }
Device Module::device() const { return s_->device; }
size_t Module::num_reshaped_plans() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->reshaped.size();
}
const CachedGraph& Module::compiled() const { return *s_->compiled; }

}  // namespace kiln
