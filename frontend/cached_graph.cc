// The compiled graphs behind call_graph ids (forward, backward and training variants), their
// lifetime, calls, and freezing (see cached_graph.h). Tracing is tracer.cc's; building and
// running a plan is plan.cc's.
#include "kiln/frontend/cached_graph.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/deferred.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/call_graph.h"
#include "kiln/passes/autodiff.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/passes/rematerialize.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/profiler.h"
#include "kiln/codegen/plan.h"

namespace kiln {

// ---- compiled graphs ---------------------------------------------------------------------------

namespace {

// The payload of a registered graph: the forward plan, and the backward plan built on first use.
struct Entry final : ir::GraphPayload {
  std::unique_ptr<Plan> forward;
  std::once_flag backward_once;
  std::unique_ptr<Plan> backward;  // built on first use, or with the entry (training variants)
  std::atomic<bool> has_backward{false};  // set once `backward` is: the report reads it from any thread
  // Training variants (they save what their backward reads), one per set of inputs that need a
  // gradient: a data batch without attach_grad gets none computed (no matmul/conv grad_data).
  std::mutex training_mu;
  std::map<std::vector<bool>, ir::GraphRef> training;  // owned: freed with this entry
  std::atomic<int64_t> training_id{-1};   // the variant used last, for the report
  std::vector<ir::GraphRef> callees;      // graphs the forward calls (call_graph nodes): kept alive
  // Compiled graphs made from this one and cached with it (a tape's compiled backward through
  // this training variant, CompanionGraph): they go when it goes. Guarded by training_mu.
  std::map<std::string, std::pair<std::shared_ptr<CachedGraph>, uint64_t>> companions;  // graph, last use
  uint64_t companion_uses = 0;
};

Entry& EntryOf(const ir::RegisteredGraph& g) { return static_cast<Entry&>(*g.payload()); }

// KILN_REPORT=1: the report of plans just built, on stderr.
void PrintReport(int64_t graph_id, std::initializer_list<const Plan*> plans) {
  if (!env::GetInt("KILN_REPORT")) return;
  CompileReport r;
  r.graph_id = graph_id;
  for (const Plan* p : plans)
    if (p) r.plans.push_back(p->report);
  std::fprintf(stderr, "%s", r.str().c_str());
}

// The entry of a running call_graph kernel: alive while the task runs, since a CachedGraph's
// entry is released only when the engine is idle (Retire).
ir::GraphRef GetEntry(int64_t id) { return ir::FindGraph(id); }

// Entries released by a CachedGraph while tasks may still run them; freed once the engine is idle.
std::mutex g_retired_mu;
std::vector<ir::GraphRef>& Retired() {
  static auto* r = new std::vector<ir::GraphRef>();  // leaked: released while statics are destroyed
  return *r;
}
std::atomic<bool> g_any_retired{false};

void FreeRetiredIfIdle() {
  if (!g_any_retired.load(std::memory_order_acquire)) return;
  if (engine::Engine::Get().Stats().pending != 0) return;
  std::vector<ir::GraphRef> done;
  {
    std::lock_guard<std::mutex> g(g_retired_mu);
    done.swap(Retired());
    g_any_retired.store(false, std::memory_order_release);
  }
  // Freed here, outside the lock: an entry's plans may hold other entries.
}

void Retire(ir::GraphRef ref) {
  if (!ref) return;
  {
    std::lock_guard<std::mutex> g(g_retired_mu);
    Retired().push_back(std::move(ref));
    g_any_retired.store(true, std::memory_order_release);
  }
  FreeRetiredIfIdle();
}

// Backward graph: the forward recomputed, then the autodiff pass; inputs are the forward inputs
// and one gradient per forward output, outputs the gradient of every forward input.
std::unique_ptr<ir::Graph> BackwardGraph(const ir::Graph& fwd) {
  std::unique_ptr<ir::Graph> g = ir::CopyGraph(fwd);
  const std::vector<ir::Value*> xs = g->inputs(), ys = g->outputs();
  std::vector<ir::Value*> dys;
  for (size_t k = 0; k < ys.size(); ++k) dys.push_back(g->AddInput("grad" + std::to_string(k), ys[k]->type()));
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

// `overwritten[i]`: the call copies new values into input i after running (batch norm's running
// statistics), so the backward reads the new values there.
TrainingPair MakeTrainingPair(const ir::Graph& fwd, const std::vector<bool>& needs_grad,
                              const std::vector<bool>& overwritten) {
  // G: the forward copied, then the gradient nodes the autodiff pass appends.
  ir::ValueMap to_g;
  std::unique_ptr<ir::Graph> g = ir::CopyGraph(fwd, &to_g);
  std::unordered_map<const ir::Value*, const ir::Value*> from_g;
  for (const auto& [v, c] : to_g) from_g[c] = v;
  const std::vector<ir::Value*> xs = g->inputs(), ys = g->outputs();  // every input; the outputs
  std::vector<ir::Value*> wrt;  // the inputs a gradient is computed for
  for (size_t i = 0; i < xs.size(); ++i)
    if (needs_grad[i]) wrt.push_back(xs[i]);
  const size_t mark = g->nodes().size();
  std::vector<ir::Value*> dys;
  for (size_t k = 0; k < ys.size(); ++k) dys.push_back(g->AddInput("grad" + std::to_string(k), ys[k]->type()));
  std::vector<ir::Value*> wrt_grads = passes::BuildGradients(*g, ys, dys, wrt);
  std::vector<ir::Value*> grads(xs.size(), nullptr);  // none (zeros) for inputs that need none
  for (size_t i = 0, k = 0; i < xs.size(); ++i)
    if (needs_grad[i]) grads[i] = wrt_grads[k++];

  // The forward values the gradient nodes read (or that are gradients themselves); the backward
  // is handed some of them and computes the others again from those (passes::ChooseSaved).
  std::vector<const ir::Value*> needed;
  for (size_t i = mark; i < g->nodes().size(); ++i)
    for (const ir::Value* v : g->nodes()[i]->inputs()) needed.push_back(v);
  for (const ir::Value* v : grads)
    if (v) needed.push_back(v);
  const std::vector<const ir::Value*> keep(ys.begin(), ys.end());
  std::vector<const ir::Value*> stale;
  for (size_t i = 0; i < xs.size(); ++i)
    if (overwritten[i]) stale.push_back(xs[i]);
  const passes::SavePlan plan = passes::ChooseSaved(*g, mark, needed, keep, stale);
  const std::vector<const ir::Value*>& saved = plan.saved;

  TrainingPair p;
  p.num_grad_outputs = static_cast<int>(fwd.outputs().size());
  // Backward: inputs, saved values, output gradients; then the recomputed forward nodes and the
  // gradient nodes.
  p.backward = std::make_unique<ir::Graph>();
  ir::ValueMap to_b;
  for (ir::Value* x : xs) to_b[x] = p.backward->AddInput(x->name(), x->type());
  for (size_t i = 0; i < saved.size(); ++i)
    to_b[saved[i]] = p.backward->AddInput("saved" + std::to_string(i), saved[i]->type());
  for (ir::Value* d : dys) to_b[d] = p.backward->AddInput(d->name(), d->type());
  // Recomputed nodes are placed just before the first node that reads them (directly or through
  // other recomputed nodes), so that their values live no longer in the backward than they must;
  // those a node needs go in the forward's order (a topological one).
  std::unordered_set<const ir::Node*> pending(plan.recompute.begin(), plan.recompute.end());
  auto place_for = [&](const ir::Node& n) {
    std::vector<const ir::Node*> todo, stack = {&n};
    if (pending.erase(&n)) todo.push_back(&n);
    while (!stack.empty()) {
      const ir::Node* m = stack.back();
      stack.pop_back();
      for (const ir::Value* v : m->inputs())
        if (v->node() && pending.erase(v->node())) todo.push_back(v->node()), stack.push_back(v->node());
    }
    std::sort(todo.begin(), todo.end(), [](const ir::Node* a, const ir::Node* b) { return a->id() < b->id(); });
    for (const ir::Node* m : todo) {
      const size_t id = static_cast<size_t>(m->id());
      ir::CopyNodes(*g, *p.backward, to_b, id, id + 1);
    }
  };
  for (size_t i = mark; i < g->nodes().size(); ++i) {
    place_for(*g->nodes()[i]);
    ir::CopyNodes(*g, *p.backward, to_b, i, i + 1);
  }
  for (const ir::Value* v : grads)  // a gradient that is a recomputed forward value
    if (v && v->node() && static_cast<size_t>(v->node()->id()) < mark) place_for(*v->node());
  ir::Builder bb(*p.backward);
  std::vector<ir::Value*> outs;
  for (size_t i = 0; i < grads.size(); ++i)
    outs.push_back(grads[i] ? to_b.at(grads[i]) : bb.ZerosLike(to_b.at(xs[i])));
  p.backward->SetOutputs(outs);

  // Forward: the original, with the saved values as extra outputs.
  ir::ValueMap to_f;
  p.forward = ir::CopyGraph(fwd, &to_f);
  std::vector<ir::Value*> fouts = p.forward->outputs();
  for (const ir::Value* v : saved) fouts.push_back(to_f.at(from_g.at(v)));
  p.forward->SetOutputs(fouts);
  return p;
}

void CallGraphKernel(const KernelArgs& a) {
  ir::GraphRef g = GetEntry(a.attrs.Int("graph_id"));
  RunPlan(*EntryOf(*g).forward, a);
}

void CallGraphBackwardKernel(const KernelArgs& a) {
  ir::GraphRef g = GetEntry(a.attrs.Int("graph_id"));
  Entry* e = &EntryOf(*g);
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
  t.Bind(op::kCallGraph, DeviceType::kCPU, {CallGraphKernel, /*contiguous_inputs=*/true});
  t.Bind(op::kCallGraphBackward, DeviceType::kCPU, {CallGraphBackwardKernel, /*contiguous_inputs=*/true});
  // On a GPU the plan's steps launch the GPU kernels on the worker's stream (exec::Run).
  t.Bind(op::kCallGraph, DeviceType::kGPU, {CallGraphKernel, /*contiguous_inputs=*/true});
  t.Bind(op::kCallGraphBackward, DeviceType::kGPU, {CallGraphBackwardKernel, /*contiguous_inputs=*/true});
}

// ---- calls -------------------------------------------------------------------------------------

namespace {
// The graphs `g` calls (call_graph and call_graph_backward nodes), added to `out` once each.
void AddCallees(const ir::Graph& g, std::vector<ir::GraphRef>& out) {
  const ir::OpId call = op::kCallGraph, call_backward = op::kCallGraphBackward;
  for (const auto& n : g.nodes()) {
    if (n->op() != call && n->op() != call_backward) continue;
    int64_t id = n->attrs().Int("graph_id");
    bool known = false;
    for (const ir::GraphRef& r : out) known |= r->id() == id;
    if (!known) out.push_back(ir::FindGraph(id));
  }
}
}  // namespace

CachedGraph::~CachedGraph() { Retire(std::move(ref_)); }

void RetireGraph(ir::GraphRef ref) { Retire(std::move(ref)); }

size_t NumLiveGraphs() {
  FreeRetiredIfIdle();
  return ir::NumRegisteredGraphs();
}

ir::GraphRef CachedGraph::Register(std::unique_ptr<ir::Graph> graph, Device device,
                                   std::unique_ptr<ir::Graph> backward, int num_grad_outputs,
                                   const passes::FreezeOptions* freeze, passes::FreezeResult* frozen,
                                   std::vector<int> late_outputs) {
  FreeRetiredIfIdle();
  const bool training = backward != nullptr;  // a training variant comes with its backward
  auto entry = std::make_unique<Entry>();
  AddCallees(*graph, entry->callees);
  if (backward) AddCallees(*backward, entry->callees);
  // The profiler: compiling one variant (passes, plan, codegen inside) is one event.
  profiler::Scope event(profiler::kCompile, training ? "compile training" : "compile forward");
  entry->forward =
      OptimizeAndPlan(std::move(graph), device, training ? "training forward" : "forward", freeze, frozen,
                      late_outputs);
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
  const Entry* e = entry.get();
  ir::GraphRef ref = ir::RegisterGraph(std::move(sig), std::move(entry));
  PrintReport(ref->id(), {e->forward.get(), e->backward.get()});
  return ref;
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
    } catch (const DeferredDeviceError&) {
      throw;  // the user's bad input from before, raised by this wait: not the folded node's
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
  ref_ = Register(std::move(graph), device_, nullptr, -1, &options, &result, LateOutputs());
  if (!EntryOf(*ref_).forward->report.freeze) return;  // KILN_DISABLE_PASS=freeze_fold: runs as traced
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < captured_.size(); ++i)
    if (options.constants[static_cast<size_t>(num_data_) + i] < 0) inputs.push_back(captured_[i]);
  for (int h : result.constants) inputs.push_back(evaluator.Constant(h));
  captured_ = std::move(inputs);
  frozen_ = true;
}

std::shared_ptr<CachedGraph> CachedGraph::FromGraph(std::unique_ptr<ir::Graph> graph, int num_data_inputs,
                                                    std::vector<Tensor> captured, Device device,
                                                    std::vector<int> late_outputs) {
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
  cg->ref_ = Register(std::move(graph), device, nullptr, -1, nullptr, nullptr, std::move(late_outputs));
  return cg;
}

std::shared_ptr<CachedGraph> CachedGraph::FromTrace(trace::TracedGraph t, bool freeze) {
  auto cg = std::shared_ptr<CachedGraph>(new CachedGraph());
  cg->num_data_ = t.num_data;
  cg->num_outputs_ = t.num_outputs;
  cg->device_ = t.device;
  cg->captured_ = std::move(t.captured);
  for (auto& [output, dst] : t.assigns) cg->assigns_.push_back({output, std::move(dst)});
  if (!cg->assigns_.empty()) cg->no_data_ = Tensor::Empty(Shape{0}, DType::kUInt8, cg->device_);
  if (freeze) cg->RegisterFrozen(std::move(t.graph));
  else cg->ref_ = Register(std::move(t.graph), cg->device_, nullptr, -1, nullptr, nullptr, cg->LateOutputs());
  return cg;
}

const ir::Graph* TrainingBackwardBody(int64_t graph_id) {
  ir::GraphRef g = ir::FindGraph(graph_id);
  if (!g || g->signature().num_grad_outputs < 0) return nullptr;  // not a training variant
  const Entry& e = EntryOf(*g);
  return e.has_backward.load(std::memory_order_acquire) ? e.backward->graph.get() : nullptr;
}

std::shared_ptr<CachedGraph> CompanionGraph(int64_t graph_id, const std::string& key,
                                            const std::function<std::shared_ptr<CachedGraph>()>& make) {
  ir::GraphRef g = ir::FindGraph(graph_id);
  KILN_CHECK(g) << "no live compiled graph has id " << graph_id;
  Entry& e = EntryOf(*g);
  {
    std::lock_guard<std::mutex> lock(e.training_mu);
    auto it = e.companions.find(key);
    if (it != e.companions.end()) {
      it->second.second = ++e.companion_uses;
      return it->second.first;
    }
  }
  std::shared_ptr<CachedGraph> made = make();  // compiles: not under the lock
  std::lock_guard<std::mutex> lock(e.training_mu);
  constexpr size_t kMaxCompanions = 8;  // a loop whose loss changes shape every step: the least recently used goes
  if (e.companions.size() >= kMaxCompanions)
    e.companions.erase(std::min_element(e.companions.begin(), e.companions.end(), [](const auto& a, const auto& b) {
      return a.second.second < b.second.second;
    }));
  auto& slot = e.companions[key];
  slot = {std::move(made), ++e.companion_uses};
  return slot.first;
}

const ir::Graph& RegisteredGraphBody(int64_t graph_id) { return *EntryOf(*ir::FindGraph(graph_id)).forward->graph; }

const ir::Graph& CachedGraph::graph() const { return *EntryOf(*ref_).forward->graph; }
size_t CachedGraph::arena_bytes() const { return EntryOf(*ref_).forward->arena_bytes; }
int CachedGraph::num_fused_groups() const { return EntryOf(*ref_).forward->num_fused_groups; }
int CachedGraph::num_fused_ops() const { return EntryOf(*ref_).forward->num_fused_nodes; }

CompileReport CachedGraph::compile_report() const {
  CompileReport r;
  r.graph_id = ref_->id();
  auto add = [&](const Entry& e) {
    r.plans.push_back(e.forward->report);
    if (e.has_backward.load(std::memory_order_acquire)) r.plans.push_back(e.backward->report);
  };
  Entry& e = EntryOf(*ref_);
  add(e);
  if (int64_t t = e.training_id.load(); t >= 0) add(EntryOf(*GetEntry(t)));
  return r;
}


std::vector<int> CachedGraph::LateOutputs() const {
  std::vector<int> late;
  for (const Assign& a : assigns_) late.push_back(a.output);
  return late;
}

Tensor CachedGraph::OutputTensor(int64_t id, size_t k, const ir::TensorType& t) const {
  // A small output (a prediction, a loss) reuses the storage of the same output of an earlier
  // call once the user dropped it (only this cache still holds it): in the d2l loop, no
  // allocation and no free task per step. Its engine variable orders the new call's writes after
  // every read of the old value. At most two per output (this step's and the previous one's).
  constexpr size_t kMaxRecycled = size_t{1} << 20, kPerOutput = 2;
  const size_t nbytes = static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype);
  if (nbytes == 0 || nbytes > kMaxRecycled) return Tensor::Empty(t.shape, t.dtype, device_);
  {
    std::lock_guard<std::mutex> g(recycle_mu_);
    std::vector<StoragePtr>& slot = recycled_[{id, k}];
    // One autograd knows by address (written in place while recording) is never handed out again.
    std::erase_if(slot, [](const StoragePtr& s) { return s->keeps_identity(); });
    for (const StoragePtr& s : slot)
      if (s.use_count() == 1 && s->nbytes() == nbytes) {
        // The last holder's reads on its thread happen before this reuse.
        std::atomic_thread_fence(std::memory_order_acquire);
        auto impl = std::make_shared<TensorImpl>();
        impl->storage = s;
        impl->shape = t.shape;
        impl->strides = t.shape.ContiguousStrides();
        impl->dtype = t.dtype;
        return Tensor(std::move(impl));
      }
  }
  Tensor fresh = Tensor::Empty(t.shape, t.dtype, device_);  // not under the lock: it may wait
  std::lock_guard<std::mutex> g(recycle_mu_);
  std::vector<StoragePtr>& slot = recycled_[{id, k}];
  if (slot.size() < kPerOutput) slot.push_back(fresh.storage());
  return fresh;
}

std::vector<Tensor> CachedGraph::Call(const std::vector<Tensor>& data_inputs) const {
  if (static_cast<int>(data_inputs.size()) != num_data_)
    KILN_THROW(ValueError) << "hybridized call: expected " << num_data_ << " inputs, found " << data_inputs.size();
  std::vector<Tensor> in(data_inputs);
  in.insert(in.end(), captured_.begin(), captured_.end());
  int64_t id = ref_->id();
  const ir::RegisteredGraph* called = ref_.get();
  int n_out = num_outputs_ + static_cast<int>(assigns_.size());
  if (!trace::Active() && autograd::NeedsRecord(in)) {
    // Training: the variant that saves what its backward reads (no forward recomputation).
    Entry& e = EntryOf(*ref_);
    std::vector<bool> needs_grad(in.size());
    for (size_t i = 0; i < in.size(); ++i) needs_grad[i] = autograd::NeedsRecord(std::span<const Tensor>(&in[i], 1));
    const ir::RegisteredGraph* variant;
    {
      std::lock_guard<std::mutex> g(e.training_mu);
      auto it = e.training.find(needs_grad);
      if (it == e.training.end()) {
        std::vector<bool> overwritten(in.size(), false);
        for (const Assign& a : assigns_)
          for (size_t j = 0; j < captured_.size(); ++j)
            if (captured_[j].SharesStorage(a.dst)) overwritten[static_cast<size_t>(num_data_) + j] = true;
        TrainingPair p = MakeTrainingPair(*e.forward->graph, needs_grad, overwritten);
        it = e.training.emplace(needs_grad, Register(std::move(p.forward), device_, std::move(p.backward),
                                                     p.num_grad_outputs, nullptr, nullptr, LateOutputs())).first;
      }
      variant = it->second.get();
    }
    id = variant->id();
    called = variant;
    e.training_id.store(id);
    n_out = static_cast<int>(variant->signature().outputs.size());
  }
  const ir::Attrs attrs{{"graph_id", id}, {"num_outputs", static_cast<int64_t>(n_out)}};
  if (trace::Active() || n_out == 0) {  // inside another trace: recorded, the copies too
    std::vector<Tensor> out = Invoke(op::kCallGraph, in, attrs, device_);
    for (const Assign& a : assigns_) trace::RecordAssign(out[static_cast<size_t>(a.output)], a.dst);
    out.resize(static_cast<size_t>(num_outputs_));
    return out;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) KILN_THROW(ValueError) << "hybridized call: input " << i << " is an undefined tensor";
    if (in[i].impl()->symbol) trace::ThrowSymbolicRead("a hybridized block");  // kept from a trace: no data
  }
  // The outputs: the user's, each its own tensor; the values copied into captured tensors (batch
  // norm's running statistics), written by the call straight into them (late outputs: after
  // every step, so the steps read the old values); the small saved values of a training call
  // (what its backward reads: batch norm's batch statistics, a pooling's indices), views into
  // blocks of at most 16 MiB, each allocated and freed once per call. A large one keeps a block
  // of its own: the caching allocator rounds a block up by as much as an eighth, and activations
  // summed into one block would waste that much more than each rounded alone.
  const ir::GraphSignature& sig = called->signature();
  std::vector<Tensor> out(static_cast<size_t>(n_out)), recorded;
  std::vector<const Assign*> copy_after;
  std::vector<bool> assigned(static_cast<size_t>(n_out), false);
  auto view = [](const StoragePtr& storage, int64_t offset, const Shape& shape, DType dtype) {
    auto impl = std::make_shared<TensorImpl>();  // contiguous, `offset` elements into `storage`
    impl->storage = storage;
    impl->offset = offset;
    impl->shape = shape;
    impl->strides = shape.ContiguousStrides();
    impl->dtype = dtype;
    return Tensor(std::move(impl));
  };
  for (const Assign& a : assigns_) {
    const ir::TensorType& t = sig.outputs[static_cast<size_t>(a.output)];
    const Tensor& d = a.dst;
    assigned[static_cast<size_t>(a.output)] = true;
    if (d.device() == device_ && d.dtype() == t.dtype && d.shape() == t.shape && d.is_contiguous() &&
        !out[static_cast<size_t>(a.output)].defined())
      out[static_cast<size_t>(a.output)] = d;
    else
      copy_after.push_back(&a);
  }
  constexpr size_t kAlign = 256, kMaxPacked = size_t{1} << 20, kMaxBlock = size_t{16} << 20;
  const size_t first_saved = sig.num_grad_outputs < 0 ? out.size() : static_cast<size_t>(sig.num_grad_outputs);
  auto packed_bytes = [&](size_t k) -> size_t {  // 0: not packed into a block
    const size_t n = static_cast<size_t>(sig.outputs[k].shape.numel()) * DTypeSize(sig.outputs[k].dtype);
    return k < first_saved || assigned[k] || n == 0 || n > kMaxPacked ? 0 : (n + kAlign - 1) / kAlign * kAlign;
  };
  size_t k = 0;
  while (k < out.size()) {  // the packed values from k on, a block at a time
    size_t end = k, block_bytes = 0;
    for (; end < out.size(); ++end) {
      const size_t b = packed_bytes(end);
      if (b > 0 && block_bytes > 0 && block_bytes + b > kMaxBlock) break;
      block_bytes += b;
    }
    Tensor block;
    // Saved values are reserved, not allocated: a backward joined with this call (deferred.h)
    // keeps them in its arena and never allocates them.
    if (block_bytes > 0) block = Tensor::Reserved(Shape{static_cast<int64_t>(block_bytes)}, DType::kUInt8, device_);
    size_t at = 0;
    for (; k < end; ++k) {
      if (out[k].defined()) continue;  // a captured tensor written in place
      const ir::TensorType& t = sig.outputs[k];
      const size_t bytes = packed_bytes(k);
      if (bytes == 0) {
        out[k] = k >= first_saved ? Tensor::Reserved(t.shape, t.dtype, device_) : OutputTensor(id, k, t);
        continue;
      }
      out[k] = view(block.storage(), static_cast<int64_t>(at / DTypeSize(t.dtype)), t.shape, t.dtype);
      at += bytes;
    }
  }
  // A training call waits for the next compiled call to join it (deferred.h): the loss, then
  // the backward, run with it as one plan.
  const bool held = copy_after.empty() && sig.num_grad_outputs >= 0 && deferred::Hold(id, in, out, LateOutputs());
  if (!held) InvokeInto(op::kCallGraph, in, attrs, out);
  if (autograd::NeedsRecord(in)) {
    // The tape sees no data where the call wrote a captured tensor: the running statistics stay
    // plain tensors, outside every gradient, and a later write into them (copyto, set_data) is
    // no write the tape records. Nothing reads such an output: the gradient rule of call_graph
    // reads the saved values, which come after the outputs that take gradients.
    recorded = out;
    for (const Assign& a : assigns_) {
      Tensor& r = recorded[static_cast<size_t>(a.output)];
      if (!r.SharesStorage(a.dst)) continue;
      KILN_CHECK(static_cast<size_t>(a.output) < first_saved) << "an assigned output is a saved value";
      r = view(no_data_.storage(), 0, r.shape(), r.dtype());
    }
    autograd::Record(op::kCallGraph, ir::GetOp(op::kCallGraph).Resolve(attrs), in, recorded);
    out = recorded;
  }
  for (const Assign* a : copy_after) {
    autograd::PauseScope pause(autograd::IsTraining());  // as eager batch norm: statistics are not recorded
    out[static_cast<size_t>(a->output)].CopyTo(a->dst);
  }
  out.resize(static_cast<size_t>(num_outputs_));
  return out;
}

}  // namespace kiln
