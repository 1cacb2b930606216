// Tracing, the compiled graphs behind call_graph ids (forward, backward and training variants),
// calls, and freezing (see cached_graph.h). Building and running a plan is plan.cc's.
#include "kiln/frontend/cached_graph.h"

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/call_graph.h"
#include "kiln/passes/autodiff.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "plan.h"

namespace kiln {

// ---- compiled graphs ---------------------------------------------------------------------------

namespace {

// The graphs behind call_graph ids: the forward plan, and the backward plan built on first use.
struct Entry {
  std::unique_ptr<Plan> forward;
  std::once_flag backward_once;
  std::unique_ptr<Plan> backward;  // built on first use, or with the entry (training variants)
  std::atomic<bool> has_backward{false};  // set once `backward` is: the report reads it from any thread
  // Training variants (they save what their backward reads), one per set of inputs that need a
  // gradient: a data batch without attach_grad gets none computed (no matmul/conv grad_data).
  std::mutex training_mu;
  std::map<std::vector<bool>, int64_t> training_ids;
  std::atomic<int64_t> training_id{-1};   // the variant used last, for the report
};

// KILN_REPORT=1: the report of plans just built, on stderr.
void PrintReport(int64_t graph_id, std::initializer_list<const Plan*> plans) {
  if (!env::GetInt("KILN_REPORT")) return;
  CompileReport r;
  r.graph_id = graph_id;
  for (const Plan* p : plans)
    if (p) r.plans.push_back(p->report);
  std::fprintf(stderr, "%s", r.str().c_str());
}

std::mutex g_entries_mu;
std::vector<std::shared_ptr<Entry>>& Entries() {
  static auto* e = new std::vector<std::shared_ptr<Entry>>();  // leaked: kernels use it until exit
  return *e;
}
std::shared_ptr<Entry> GetEntry(int64_t id) {
  std::lock_guard<std::mutex> g(g_entries_mu);
  KILN_CHECK(id >= 0 && id < static_cast<int64_t>(Entries().size())) << "no compiled graph " << id;
  return Entries()[static_cast<size_t>(id)];
}

// Backward graph: the forward recomputed, then the autodiff pass; inputs are the forward inputs
// and one gradient per forward output, outputs the gradient of every forward input.
std::unique_ptr<ir::Graph> BackwardGraph(const ir::Graph& fwd) {
  auto g = std::make_unique<ir::Graph>();
  std::unordered_map<const ir::Value*, ir::Value*> map;
  std::vector<ir::Value*> xs;
  for (const ir::Value* v : fwd.inputs()) {
    ir::Value* c = g->AddInput(v->name(), v->type());
    map[v] = c;
    xs.push_back(c);
  }
  for (const auto& n : fwd.nodes()) {
    std::vector<ir::Value*> in;
    for (const ir::Value* v : n->inputs()) in.push_back(map.at(v));
    ir::Node* c = g->AddNode(n->op(), std::move(in), n->attrs());
    for (size_t i = 0; i < n->outputs().size(); ++i) map[n->output(static_cast<int>(i))] = c->output(static_cast<int>(i));
  }
  std::vector<ir::Value*> ys, dys;
  for (size_t k = 0; k < fwd.outputs().size(); ++k) {
    ys.push_back(map.at(fwd.outputs()[k]));
    dys.push_back(g->AddInput("grad" + std::to_string(k), fwd.outputs()[k]->type()));
  }
  // Graph inputs are ordered: forward inputs, then output gradients (as call_graph_backward's).
  std::vector<ir::Value*> grads = passes::BuildGradients(*g, ys, dys, xs);
  ir::Builder b(*g);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!grads[i]) grads[i] = b.ZerosLike(xs[i]);
  g->SetOutputs(grads);
  return g;
}

// The training variant of a forward graph: it also outputs the forward values its backward
// reads, and the backward takes them as inputs instead of recomputing the forward. Backward
// inputs: forward inputs, saved values, gradients of the forward's outputs.
struct TrainingPair {
  std::unique_ptr<ir::Graph> forward, backward;
  int num_grad_outputs = 0;
};

TrainingPair MakeTrainingPair(const ir::Graph& fwd, const std::vector<bool>& needs_grad) {
  // G: the forward cloned, then the gradient nodes the autodiff pass appends.
  ir::Graph g;
  std::unordered_map<const ir::Value*, ir::Value*> to_g;
  std::unordered_map<const ir::Value*, const ir::Value*> from_g;
  std::vector<ir::Value*> xs, wrt;  // every input; those a gradient is computed for
  for (size_t i = 0; i < fwd.inputs().size(); ++i) {
    const ir::Value* v = fwd.inputs()[i];
    ir::Value* c = g.AddInput(v->name(), v->type());
    to_g[v] = c, from_g[c] = v;
    xs.push_back(c);
    if (needs_grad[i]) wrt.push_back(c);
  }
  for (const auto& n : fwd.nodes()) {
    std::vector<ir::Value*> in;
    for (const ir::Value* v : n->inputs()) in.push_back(to_g.at(v));
    ir::Node* c = g.AddNode(n->op(), std::move(in), n->attrs());
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      to_g[n->output(static_cast<int>(i))] = c->output(static_cast<int>(i));
      from_g[c->output(static_cast<int>(i))] = n->output(static_cast<int>(i));
    }
  }
  const size_t mark = g.nodes().size();
  std::vector<ir::Value*> ys, dys;
  for (size_t k = 0; k < fwd.outputs().size(); ++k) {
    ys.push_back(to_g.at(fwd.outputs()[k]));
    dys.push_back(g.AddInput("grad" + std::to_string(k), fwd.outputs()[k]->type()));
  }
  std::vector<ir::Value*> wrt_grads = passes::BuildGradients(g, ys, dys, wrt);
  std::vector<ir::Value*> grads(xs.size(), nullptr);  // none (zeros) for inputs that need none
  for (size_t i = 0, k = 0; i < xs.size(); ++i)
    if (needs_grad[i]) grads[i] = wrt_grads[k++];

  // The forward values the gradient nodes read (or that are gradients themselves).
  auto produced_by_forward = [&](const ir::Value* v) {
    return v->node() && static_cast<size_t>(v->node()->id()) < mark;
  };
  std::vector<const ir::Value*> saved;
  std::unordered_map<const ir::Value*, size_t> saved_index;
  auto save = [&](const ir::Value* v) {
    if (v && produced_by_forward(v) && !saved_index.count(v)) saved_index[v] = saved.size(), saved.push_back(v);
  };
  for (size_t i = mark; i < g.nodes().size(); ++i)
    for (const ir::Value* v : g.nodes()[i]->inputs()) save(v);
  for (const ir::Value* v : grads) save(v);

  TrainingPair p;
  p.num_grad_outputs = static_cast<int>(fwd.outputs().size());
  // Backward: inputs, saved values, output gradients; then the gradient nodes.
  p.backward = std::make_unique<ir::Graph>();
  std::unordered_map<const ir::Value*, ir::Value*> to_b;
  for (ir::Value* x : xs) to_b[x] = p.backward->AddInput(x->name(), x->type());
  for (size_t i = 0; i < saved.size(); ++i)
    to_b[saved[i]] = p.backward->AddInput("saved" + std::to_string(i), saved[i]->type());
  for (ir::Value* d : dys) to_b[d] = p.backward->AddInput(d->name(), d->type());
  for (size_t i = mark; i < g.nodes().size(); ++i) {
    const ir::Node& n = *g.nodes()[i];
    std::vector<ir::Value*> in;
    for (const ir::Value* v : n.inputs()) in.push_back(to_b.at(v));
    ir::Node* c = p.backward->AddNode(n.op(), std::move(in), n.attrs());
    for (size_t k = 0; k < n.outputs().size(); ++k) to_b[n.output(static_cast<int>(k))] = c->output(static_cast<int>(k));
  }
  ir::Builder bb(*p.backward);
  std::vector<ir::Value*> outs;
  for (size_t i = 0; i < grads.size(); ++i)
    outs.push_back(grads[i] ? to_b.at(grads[i]) : bb.ZerosLike(to_b.at(xs[i])));
  p.backward->SetOutputs(outs);

  // Forward: the original, with the saved values as extra outputs.
  p.forward = std::make_unique<ir::Graph>();
  std::unordered_map<const ir::Value*, ir::Value*> to_f;
  for (const ir::Value* v : fwd.inputs()) to_f[v] = p.forward->AddInput(v->name(), v->type());
  for (const auto& n : fwd.nodes()) {
    std::vector<ir::Value*> in;
    for (const ir::Value* v : n->inputs()) in.push_back(to_f.at(v));
    ir::Node* c = p.forward->AddNode(n->op(), std::move(in), n->attrs());
    for (size_t i = 0; i < n->outputs().size(); ++i) to_f[n->output(static_cast<int>(i))] = c->output(static_cast<int>(i));
  }
  std::vector<ir::Value*> fouts;
  for (const ir::Value* v : fwd.outputs()) fouts.push_back(to_f.at(v));
  for (const ir::Value* v : saved) fouts.push_back(to_f.at(from_g.at(v)));
  p.forward->SetOutputs(fouts);
  return p;
}

void CallGraphKernel(const KernelArgs& a) { RunPlan(*GetEntry(a.attrs.Int("graph_id"))->forward, a); }

void CallGraphBackwardKernel(const KernelArgs& a) {
  std::shared_ptr<Entry> e = GetEntry(a.attrs.Int("graph_id"));
  std::call_once(e->backward_once, [&] {
    if (e->backward) return;
    // Not through the pipeline: its DCE could drop a random op the recomputed forward draws
    // from, and later random ops would then draw what the forward did not.
    e->backward = MakePlan(BackwardGraph(*e->forward->graph), a.device, "backward");
    e->has_backward.store(true, std::memory_order_release);
    PrintReport(a.attrs.Int("graph_id"), {e->backward.get()});
  });
  RunPlan(*e->backward, a);
}

}  // namespace

void BindGraphKernels(KernelTable& t) {
  t.Bind("call_graph", DeviceType::kCPU, {CallGraphKernel, /*contiguous_inputs=*/true});
  t.Bind("call_graph_backward", DeviceType::kCPU, {CallGraphBackwardKernel, /*contiguous_inputs=*/true});
}

// ---- tracing -----------------------------------------------------------------------------------

namespace trace {

struct TraceScope::State {
  uint64_t id = 0;  // symbolic tensors carry it: one from another trace is refused
  std::unique_ptr<ir::Graph> graph = std::make_unique<ir::Graph>();
  std::vector<ir::Value*> data_inputs;
  std::vector<std::pair<ir::Value*, Tensor>> captured;           // value, concrete tensor
  std::unordered_map<const TensorImpl*, ir::Value*> captured_by_impl;
  std::vector<std::pair<ir::Value*, Tensor>> assigns;             // value, concrete destination
  std::optional<Device> device;
  bool finished = false;
};

namespace {
thread_local TraceScope::State* tls_state = nullptr;

TraceScope::State& Current() {
  KILN_CHECK(tls_state) << "no active trace";
  return *tls_state;
}

void CheckDevice(TraceScope::State& s, Device d) {
  if (!s.device) s.device = d;
  else if (*s.device != d)
    KILN_THROW(DeviceError) << "hybridize: the traced code uses both " << (s.device->is_cpu() ? "cpu(" : "gpu(")
                            << s.device->index << ") and " << (d.is_cpu() ? "cpu(" : "gpu(") << d.index
                            << "); a compiled graph runs on one device: move the inputs and parameters first";
}

std::atomic<uint64_t> g_trace_ids{0};

Tensor Symbolic(ir::Value* v, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->trace_id = tls_state->id;
  impl->storage = std::make_shared<Storage>(0, device);
  impl->shape = v->shape();
  impl->strides = v->shape().ContiguousStrides();
  impl->dtype = v->dtype();
  impl->symbol = v;
  return Tensor(std::move(impl));
}

ir::Value* ValueOf(TraceScope::State& s, const Tensor& t) {
  if (!t.defined()) KILN_THROW(ValueError) << "hybridize: an undefined tensor was passed to an op while tracing";
  CheckDevice(s, t.device());
  if (ir::Value* v = t.impl()->symbol) {
    if (t.impl()->trace_id != s.id)
      KILN_THROW(StateError) << "hybridize: a symbolic tensor of an earlier trace was used in this one (kept "
                                "in an attribute or a global during forward?); compute it again inside forward";
    return v;
  }
  auto it = s.captured_by_impl.find(t.impl());
  if (it != s.captured_by_impl.end()) return it->second;
  // Graph inputs are ordered data inputs first: captured inputs are appended; Finish reorders.
  ir::Value* v = s.graph->AddInput("captured" + std::to_string(s.captured.size()), {t.shape(), t.dtype()});
  s.captured.emplace_back(v, t);
  s.captured_by_impl.emplace(t.impl(), v);
  return v;
}
}  // namespace

bool Active() { return tls_state != nullptr; }
bool IsSymbolic(const Tensor& t) { return t.defined() && t.impl()->symbol != nullptr; }

void ThrowSymbolicRead(const char* what) {
  KILN_THROW(StateError) << what << " needs data, but this is a symbolic tensor of a hybridized block being "
                                    "traced: the traced code must not read values. Use kiln.nd.where instead of "
                                    "Python `if` on a value, or call it outside the block, or do not hybridize it";
}

std::vector<Tensor> RecordOp(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                             std::optional<Device> device) {
  TraceScope::State& s = Current();
  std::vector<ir::Value*> in;
  for (const Tensor& t : inputs) in.push_back(ValueOf(s, t));
  Device dev = device ? *device : inputs.empty() ? (s.device ? *s.device : cpu()) : inputs[0].device();
  CheckDevice(s, dev);
  ir::Node* n = s.graph->AddNode(op, std::move(in), attrs);
  std::vector<Tensor> out;
  for (ir::Value* v : n->outputs()) out.push_back(Symbolic(v, dev));
  return out;
}

void RecordAssign(const Tensor& src, const Tensor& dst) {
  TraceScope::State& s = Current();
  if (IsSymbolic(dst))
    KILN_THROW(StateError) << "hybridize: writing into a symbolic tensor in place is not supported while "
                              "tracing; compute a new tensor instead (y = ... rather than y[:] = ...)";
  s.assigns.emplace_back(ValueOf(s, src), dst);
}

TraceScope::TraceScope() : state_(std::make_unique<State>()), prev_(tls_state) {
  if (prev_) KILN_THROW(StateError) << "hybridize: a trace is already active on this thread";
  state_->id = ++g_trace_ids;
  tls_state = state_.get();
}

TraceScope::~TraceScope() { tls_state = prev_; }

Tensor TraceScope::Input(const std::string& name, const Shape& shape, DType dtype, Device device) {
  if (!state_->captured.empty())
    KILN_THROW(StateError) << "hybridize: data inputs must be declared before any op is traced";
  CheckDevice(*state_, device);
  ir::Value* v = state_->graph->AddInput(name, {shape, dtype});
  state_->data_inputs.push_back(v);
  return Symbolic(v, device);
}

std::shared_ptr<CachedGraph> TraceScope::Finish(const std::vector<Tensor>& outputs, bool freeze) {
  State& s = *state_;
  if (s.finished) KILN_THROW(StateError) << "hybridize: the trace was already finished";
  s.finished = true;
  std::vector<ir::Value*> outs;
  for (const Tensor& t : outputs) outs.push_back(ValueOf(s, t));
  for (auto& [v, dst] : s.assigns) outs.push_back(v);
  s.graph->SetOutputs(outs);

  auto cg = std::shared_ptr<CachedGraph>(new CachedGraph());
  cg->num_data_ = static_cast<int>(s.data_inputs.size());
  cg->num_outputs_ = static_cast<int>(outputs.size());
  cg->device_ = s.device.value_or(cpu());
  for (auto& [v, t] : s.captured) cg->captured_.push_back(t);
  for (size_t i = 0; i < s.assigns.size(); ++i)
    cg->assigns_.push_back({static_cast<int>(outputs.size() + i), s.assigns[i].second});

  // Graph inputs were added data first (Input before any op), captured after: already ordered.
  if (!freeze) {
    cg->id_ = CachedGraph::Register(std::move(s.graph), cg->device_);
    return cg;
  }
  // Folding runs ops eagerly: not recorded on this trace, nor on an autograd tape.
  struct TraceOff {
    State* saved = tls_state;
    TraceOff() { tls_state = nullptr; }
    ~TraceOff() { tls_state = saved; }
  } off;
  autograd::PauseScope pause;
  cg->RegisterFrozen(std::move(s.graph));
  return cg;
}

}  // namespace trace

// ---- calls -------------------------------------------------------------------------------------

int64_t CachedGraph::Register(std::unique_ptr<ir::Graph> graph, Device device, std::unique_ptr<ir::Graph> backward,
                              int num_grad_outputs, const passes::FreezeOptions* freeze,
                              passes::FreezeResult* frozen) {
  const bool training = backward != nullptr;  // a training variant comes with its backward
  auto entry = std::make_shared<Entry>();
  entry->forward =
      OptimizeAndPlan(std::move(graph), device, training ? "training forward" : "forward", freeze, frozen);
  if (backward) {
    entry->backward = OptimizeAndPlan(std::move(backward), device, "training backward");
    entry->has_backward = true;
  }
  const ir::Graph& planned = *entry->forward->graph;
  ir::GraphSignature sig;
  for (const ir::Value* v : planned.inputs()) sig.inputs.push_back(v->type());
  for (const ir::Value* v : planned.outputs()) sig.outputs.push_back(v->type());
  sig.num_grad_outputs = num_grad_outputs;
  sig.random_numel = entry->forward->random_numel;
  int64_t id;
  {
    std::lock_guard<std::mutex> g(g_entries_mu);  // ids and entries advance together
    id = ir::RegisterGraphSignature(std::move(sig));
    KILN_CHECK(id == static_cast<int64_t>(Entries().size())) << "graph ids out of step";
    Entries().push_back(entry);
  }
  PrintReport(id, {entry->forward.get(), entry->backward.get()});
  return id;
}

// ---- freezing ----------------------------------------------------------------------------------

namespace {

// freeze_fold's evaluator: a folded node runs eagerly through Invoke, on the op's own kernel, so
// folding computes what the graph would have. Handles below `num_live` are the captured tensors
// themselves, which keep changing: the frozen graph gets copies of them, and no folded value may
// be a view of one.
class TensorEvaluator final : public passes::ConstantEvaluator {
 public:
  TensorEvaluator(const std::vector<Tensor>& live, Device device)
      : values_(live), num_live_(live.size()), device_(device) {}

  std::optional<std::vector<int>> Evaluate(const ir::Node& n, std::span<const int> in) override {
    std::vector<Tensor> args;
    for (int h : in) args.push_back(values_[static_cast<size_t>(h)]);
    std::vector<Tensor> out;
    try {
      out = Invoke(n.op(), args, n.attrs(), args.empty() ? std::optional<Device>(device_) : std::nullopt);
      for (Tensor& t : out) {
        bool view_of_live = false;
        for (int h : in)
          view_of_live |= static_cast<size_t>(h) < num_live_ && t.SharesStorage(values_[static_cast<size_t>(h)]);
        // Contiguous, as call_graph reads its inputs.
        t = view_of_live ? t.To(device_, /*copy=*/true) : t.Contiguous();
        t.WaitToRead();  // a kernel that fails (an integer division by zero) leaves the node to the graph
      }
    } catch (const InternalError&) {
      throw;
    } catch (const Error&) {
      return std::nullopt;
    }
    std::vector<int> handles;
    for (size_t k = 0; k < out.size(); ++k) {
      const ir::Value* v = n.output(static_cast<int>(k));
      KILN_CHECK(out[k].shape() == v->shape() && out[k].dtype() == v->dtype())
          << "freeze: " << n.def().name << " computed " << DTypeName(out[k].dtype()) << out[k].shape().str()
          << " eagerly but " << DTypeName(v->dtype()) << v->shape().str() << " in the graph";
      handles.push_back(static_cast<int>(values_.size()));
      values_.push_back(out[k]);
    }
    return handles;
  }

  /// The tensor a constant input of the frozen graph holds.
  Tensor Constant(int h) const {
    const Tensor& t = values_[static_cast<size_t>(h)];
    return static_cast<size_t>(h) < num_live_ ? t.To(device_, /*copy=*/true) : t;
  }

 private:
  std::vector<Tensor> values_;
  size_t num_live_;
  Device device_;
};

}  // namespace

void CachedGraph::RegisterFrozen(std::unique_ptr<ir::Graph> graph) {
  TensorEvaluator evaluator(captured_, device_);
  passes::FreezeOptions options;
  options.evaluator = &evaluator;
  options.constants.assign(static_cast<size_t>(num_data_), -1);
  for (size_t i = 0; i < captured_.size(); ++i) {
    bool written = false;  // copied into after every call (batch norm's statistics): stays live
    for (const Assign& a : assigns_) written |= a.dst.SharesStorage(captured_[i]);
    options.constants.push_back(written ? -1 : static_cast<int>(i));
  }
  passes::FreezeResult result;
  id_ = Register(std::move(graph), device_, nullptr, -1, &options, &result);
  if (!GetEntry(id_)->forward->report.freeze) return;  // KILN_DISABLE_PASS=freeze_fold: runs as traced
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < captured_.size(); ++i)
    if (options.constants[static_cast<size_t>(num_data_) + i] < 0) inputs.push_back(captured_[i]);
  for (int h : result.constants) inputs.push_back(evaluator.Constant(h));
  captured_ = std::move(inputs);
  frozen_ = true;
}

std::shared_ptr<CachedGraph> CachedGraph::FromGraph(std::unique_ptr<ir::Graph> graph, int num_data_inputs,
                                                    std::vector<Tensor> captured, Device device) {
  const auto& ins = graph->inputs();
  if (num_data_inputs < 0 || static_cast<size_t>(num_data_inputs) + captured.size() != ins.size())
    KILN_THROW(ValueError) << "compiled graph: it has " << ins.size() << " inputs, but " << num_data_inputs
                           << " data inputs and " << captured.size() << " parameters were given";
  for (size_t i = 0; i < captured.size(); ++i) {
    const ir::Value* v = ins[static_cast<size_t>(num_data_inputs) + i];
    const Tensor& t = captured[i];
    if (!(t.shape() == v->shape()) || t.dtype() != v->dtype())
      KILN_THROW(ShapeError) << "compiled graph: parameter '" << v->name() << "' is " << DTypeName(v->dtype())
                             << v->shape().str() << " in the graph but the tensor given is "
                             << DTypeName(t.dtype()) << t.shape().str();
    if (t.device() != device) captured[i] = t.To(device);
  }
  auto cg = std::shared_ptr<CachedGraph>(new CachedGraph());
  cg->num_data_ = num_data_inputs;
  cg->num_outputs_ = static_cast<int>(graph->outputs().size());
  cg->device_ = device;
  cg->captured_ = std::move(captured);
  cg->id_ = Register(std::move(graph), device);
  return cg;
}

const ir::Graph& CachedGraph::graph() const { return *GetEntry(id_)->forward->graph; }
size_t CachedGraph::arena_bytes() const { return GetEntry(id_)->forward->arena_bytes; }
int CachedGraph::num_fused_groups() const { return GetEntry(id_)->forward->num_fused_groups; }
int CachedGraph::num_fused_ops() const { return GetEntry(id_)->forward->num_fused_nodes; }

CompileReport CachedGraph::compile_report() const {
  CompileReport r;
  r.graph_id = id_;
  auto add = [&](const Entry& e) {
    r.plans.push_back(e.forward->report);
    if (e.has_backward.load(std::memory_order_acquire)) r.plans.push_back(e.backward->report);
  };
  std::shared_ptr<Entry> e = GetEntry(id_);
  add(*e);
  if (int64_t t = e->training_id.load(); t >= 0) add(*GetEntry(t));
  return r;
}


std::vector<Tensor> CachedGraph::Call(const std::vector<Tensor>& data_inputs) const {
  if (static_cast<int>(data_inputs.size()) != num_data_)
    KILN_THROW(ValueError) << "hybridized call: expected " << num_data_ << " inputs, found " << data_inputs.size();
  std::vector<Tensor> in(data_inputs);
  in.insert(in.end(), captured_.begin(), captured_.end());
  int64_t id = id_;
  int n_out = num_outputs_ + static_cast<int>(assigns_.size());
  if (!trace::Active() && autograd::NeedsRecord(in)) {
    // Training: the variant that saves what its backward reads (no forward recomputation).
    std::shared_ptr<Entry> e = GetEntry(id_);
    std::vector<bool> needs_grad(in.size());
    for (size_t i = 0; i < in.size(); ++i) needs_grad[i] = autograd::NeedsRecord(std::span<const Tensor>(&in[i], 1));
    {
      std::lock_guard<std::mutex> g(e->training_mu);
      auto it = e->training_ids.find(needs_grad);
      if (it == e->training_ids.end()) {
        TrainingPair p = MakeTrainingPair(*e->forward->graph, needs_grad);
        it = e->training_ids.emplace(needs_grad, Register(std::move(p.forward), device_, std::move(p.backward),
                                                          p.num_grad_outputs)).first;
      }
      id = it->second;
    }
    e->training_id.store(id);
    n_out = static_cast<int>(ir::GetGraphSignature(id).outputs.size());
  }
  std::vector<Tensor> out = Invoke(ir::FindOp("call_graph"), in,
                                   {{"graph_id", id}, {"num_outputs", static_cast<int64_t>(n_out)}}, device_);
  for (const Assign& a : assigns_) {
    const Tensor& src = out[static_cast<size_t>(a.output)];
    if (trace::Active()) trace::RecordAssign(src, a.dst);
    else src.CopyTo(a.dst);
  }
  out.resize(static_cast<size_t>(num_outputs_));
  return out;
}

}  // namespace kiln
