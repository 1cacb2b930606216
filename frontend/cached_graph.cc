// Tracing and compiled execution of hybridized graphs (see cached_graph.h).
#include "kiln/frontend/cached_graph.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/call_graph.h"
#include "kiln/passes/autodiff.h"
#include "kiln/passes/dce.h"
#include "kiln/passes/pass.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/error.h"

namespace kiln {

// ---- plans -------------------------------------------------------------------------------------

namespace {

// Where a value lives while a plan runs.
struct Slot {
  enum Kind : uint8_t { kNone, kInput, kOutput, kArena } kind = kNone;
  int64_t index = 0;  // input or output index, or byte offset in the arena
};

// A graph ready to run: its nodes in order with their kernels, and a place for every value.
struct Plan {
  std::unique_ptr<ir::Graph> graph;
  Device device;
  std::vector<const KernelBinding*> kernels;   // per node
  std::vector<uint64_t> random_offsets;        // per node: counter offset from the call's base
  std::vector<Slot> slots;                     // per value id
  std::vector<int> out_of_place;               // outputs whose value lives elsewhere: copied at the end
  size_t arena_bytes = 0;
  int64_t random_numel = 0;
};

size_t Bytes(const ir::Value* v) {
  return (static_cast<size_t>(v->shape().numel()) * DTypeSize(v->dtype()) + 63) / 64 * 64;
}

// Lays out the intermediates: a value takes the smallest free block that fits once its producer
// runs, and frees its block after its last reader. A node's outputs never share memory with its
// inputs (blocks are freed after the node's outputs are placed).
std::unique_ptr<Plan> MakePlan(std::unique_ptr<ir::Graph> g, Device device) {
  auto p = std::make_unique<Plan>();
  p->device = device;
  const ir::Graph& graph = *g;
  p->slots.resize(static_cast<size_t>(graph.num_values()));
  for (size_t i = 0; i < graph.inputs().size(); ++i) p->slots[graph.inputs()[i]->id()] = {Slot::kInput, static_cast<int64_t>(i)};
  for (size_t k = 0; k < graph.outputs().size(); ++k) {
    Slot& s = p->slots[graph.outputs()[k]->id()];
    if (s.kind == Slot::kNone) s = {Slot::kOutput, static_cast<int64_t>(k)};
    else p->out_of_place.push_back(static_cast<int>(k));  // an input, or an output listed twice
  }
  std::vector<bool> live = passes::LiveNodes(graph, graph.outputs());
  std::vector<int> last_use(p->slots.size(), -1);
  for (size_t i = 0; i < graph.nodes().size(); ++i)
    if (live[i])
      for (const ir::Value* v : graph.nodes()[i]->inputs()) last_use[v->id()] = static_cast<int>(i);
  std::multimap<size_t, size_t> free_blocks;  // size -> offset
  size_t end = 0;
  uint64_t rnd = 0;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const ir::Node& n = *graph.nodes()[i];
    // Random ops advance the generator counter whether they run or not, the same way in every
    // plan of a graph (a backward that recomputes the forward draws what the forward drew).
    p->random_offsets.push_back(rnd);
    if (n.def().random) {
      int64_t numel = 0;
      if (n.def().random_numel) numel = n.def().random_numel(n.attrs());
      else
        for (const ir::Value* o : n.outputs()) numel += o->shape().numel();
      rnd += static_cast<uint64_t>((numel + 3) / 4 * 4);
    }
    if (!live[i]) {  // nothing reads its result: not run
      p->kernels.push_back(nullptr);
      continue;
    }
    const KernelBinding* kb = KernelTable::Get().Find(n.op(), device.type);
    if (!kb || !kb->fn)
      KILN_THROW(DeviceError) << "hybridize: op '" << n.def().name << "' has no kernel for "
                              << (device.is_cpu() ? "CPU" : "GPU") << " devices in a compiled graph";
    p->kernels.push_back(kb);
    for (const ir::Value* o : n.outputs()) {
      Slot& s = p->slots[o->id()];
      if (s.kind != Slot::kNone) continue;
      size_t need = Bytes(o);
      auto it = free_blocks.lower_bound(need);
      if (it != free_blocks.end()) {
        s = {Slot::kArena, static_cast<int64_t>(it->second)};
        if (it->first > need) free_blocks.emplace(it->first - need, it->second + need);
        free_blocks.erase(it);
      } else {
        s = {Slot::kArena, static_cast<int64_t>(end)};
        end += need;
      }
    }
    for (const ir::Value* v : n.inputs()) {
      const Slot& s = p->slots[v->id()];
      if (s.kind == Slot::kArena && last_use[v->id()] == static_cast<int>(i)) {
        free_blocks.emplace(Bytes(v), static_cast<size_t>(s.index));
        last_use[v->id()] = -2;  // freed once, even when the node reads it twice (a * a)
      }
    }
    for (const ir::Value* o : n.outputs())  // outputs nobody reads
      if (p->slots[o->id()].kind == Slot::kArena && last_use[o->id()] < 0)
        free_blocks.emplace(Bytes(o), static_cast<size_t>(p->slots[o->id()].index));
  }
  p->arena_bytes = end;
  p->random_numel = static_cast<int64_t>(rnd);
  p->graph = std::move(g);
  return p;
}

// Per-thread arenas, grown as needed and kept between calls; one per nesting depth, since a
// plan may run another (a call_graph node inside a compiled graph) while its own values live.
thread_local int tls_plan_depth = 0;
uint8_t* Arena(size_t bytes) {
  struct Buf {
    uint8_t* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local std::vector<std::unique_ptr<Buf>> bufs;
  while (static_cast<int>(bufs.size()) <= tls_plan_depth) bufs.push_back(std::make_unique<Buf>());
  Buf& buf = *bufs[static_cast<size_t>(tls_plan_depth)];
  if (buf.n < bytes) {
    std::free(buf.p);
    buf.n = (bytes + 4095) / 4096 * 4096;
    buf.p = static_cast<uint8_t*>(std::aligned_alloc(64, buf.n));
    if (!buf.p) KILN_THROW(MemoryError) << "hybridize: cannot allocate an arena of " << bytes << " bytes";
  }
  return buf.p;
}

void RunPlan(const Plan& p, const KernelArgs& a) {
  const ir::Graph& g = *p.graph;
  uint8_t* arena = p.arena_bytes ? Arena(p.arena_bytes) : nullptr;
  struct Depth {  // nested plans take the next arena
    Depth() { ++tls_plan_depth; }
    ~Depth() { --tls_plan_depth; }
  } depth;
  auto view = [&](const ir::Value* v) {
    const Slot& s = p.slots[v->id()];
    switch (s.kind) {
      case Slot::kInput: return a.in[static_cast<size_t>(s.index)];
      case Slot::kOutput: return a.out[static_cast<size_t>(s.index)];
      default: {
        TensorView t;
        t.data = arena + s.index;
        t.dtype = v->dtype();
        t.shape = v->shape();
        t.strides = v->shape().ContiguousStrides();
        return t;
      }
    }
  };
  std::vector<TensorView> in, out;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!p.kernels[i]) continue;  // dead
    const ir::Node& n = *g.nodes()[i];
    in.clear(), out.clear();
    for (const ir::Value* v : n.inputs()) in.push_back(view(v));
    for (const ir::Value* v : n.outputs()) out.push_back(view(v));
    p.kernels[i]->fn(KernelArgs{n.def(), in, out, n.attrs(), a.device, a.seed, a.offset + p.random_offsets[i]});
  }
  for (int k : p.out_of_place) host::CopyConvert(view(g.outputs()[static_cast<size_t>(k)]), a.out[static_cast<size_t>(k)]);
}

// The graphs behind call_graph ids: the forward plan, and the backward plan built on first use.
struct Entry {
  std::unique_ptr<Plan> forward;
  std::once_flag backward_once;
  std::unique_ptr<Plan> backward;  // built on first use, or with the entry (training variants)
  std::once_flag training_once;
  int64_t training_id = -1;        // the variant that saves what its backward reads
};

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

TrainingPair MakeTrainingPair(const ir::Graph& fwd) {
  // G: the forward cloned, then the gradient nodes the autodiff pass appends.
  ir::Graph g;
  std::unordered_map<const ir::Value*, ir::Value*> to_g;
  std::unordered_map<const ir::Value*, const ir::Value*> from_g;
  std::vector<ir::Value*> xs;
  for (const ir::Value* v : fwd.inputs()) {
    ir::Value* c = g.AddInput(v->name(), v->type());
    to_g[v] = c, from_g[c] = v;
    xs.push_back(c);
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
  std::vector<ir::Value*> grads = passes::BuildGradients(g, ys, dys, xs);

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
    if (!e->backward) e->backward = MakePlan(BackwardGraph(*e->forward->graph), a.device);
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

std::shared_ptr<CachedGraph> TraceScope::Finish(const std::vector<Tensor>& outputs) {
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
  cg->id_ = CachedGraph::Register(std::move(s.graph), cg->device_);
  return cg;
}

}  // namespace trace

// ---- calls -------------------------------------------------------------------------------------

int64_t CachedGraph::Register(std::unique_ptr<ir::Graph> graph, Device device, std::unique_ptr<ir::Graph> backward,
                              int num_grad_outputs) {
  // The optimizing pipeline (passes/pass.h): inputs and outputs keep their order and types.
  graph = passes::RunPipeline(std::move(graph), passes::DefaultPipeline());
  if (backward) backward = passes::RunPipeline(std::move(backward), passes::DefaultPipeline());
  ir::GraphSignature sig;
  for (const ir::Value* v : graph->inputs()) sig.inputs.push_back(v->type());
  for (const ir::Value* v : graph->outputs()) sig.outputs.push_back(v->type());
  sig.num_grad_outputs = num_grad_outputs;
  auto entry = std::make_shared<Entry>();
  entry->forward = MakePlan(std::move(graph), device);
  if (backward) entry->backward = MakePlan(std::move(backward), device);
  sig.random_numel = entry->forward->random_numel;
  std::lock_guard<std::mutex> g(g_entries_mu);  // ids and entries advance together
  int64_t id = ir::RegisterGraphSignature(std::move(sig));
  KILN_CHECK(id == static_cast<int64_t>(Entries().size())) << "graph ids out of step";
  Entries().push_back(entry);
  return id;
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
    std::call_once(e->training_once, [&] {
      TrainingPair p = MakeTrainingPair(*e->forward->graph);
      e->training_id = Register(std::move(p.forward), device_, std::move(p.backward), p.num_grad_outputs);
    });
    id = e->training_id;
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
