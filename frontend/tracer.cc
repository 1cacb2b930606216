// The tracer (see include/kiln/frontend/tracer.h): symbolic tensors, recording ops and copies on
// the active trace (a copy into a symbolic tensor or a view of one becomes a functional update),
// and handing the finished trace to CachedGraph::FromTrace. It does not compile, cache or run
// graphs (cached_graph.cc does).
#include "kiln/frontend/tracer.h"

#if KILN_WITH_CODEGEN
#include "kiln/codegen/elementwise.h"
#endif

#include <atomic>
#include <unordered_map>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/profiler.h"

namespace kiln::trace {

struct TraceScope::State {
  uint64_t id = 0;  // symbolic tensors carry it: one from another trace is refused
  std::unique_ptr<ir::Graph> graph = std::make_unique<ir::Graph>();
  std::vector<ir::Value*> data_inputs;
  std::vector<std::pair<ir::Value*, Tensor>> captured;           // value, concrete tensor
  std::unordered_map<const TensorImpl*, ir::Value*> captured_by_impl;
  std::vector<std::pair<ir::Value*, Tensor>> assigns;             // value, concrete destination
  /// The symbolic tensors made for each value: a write in place rebinds them to the new value.
  std::unordered_map<const ir::Value*, std::vector<std::weak_ptr<TensorImpl>>> holders;
  std::optional<Device> device;
  bool finished = false;
  int64_t prof_start = 0;  // the profiler's "trace" event starts here (0: not recording)
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
  tls_state->holders[v].push_back(impl);
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

PauseScope::PauseScope() : paused_(tls_state) { tls_state = nullptr; }
PauseScope::~PauseScope() { tls_state = paused_; }
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

namespace {
bool IsViewOp(ir::OpId op, Device d) {
  const KernelBinding* kb = KernelTable::Get().Find(op, d.type);
  return kb && kb->view;
}

bool HasLiveHolder(TraceScope::State& s, const ir::Value* v) {
  auto it = s.holders.find(v);
  if (it == s.holders.end()) return false;
  for (auto& w : it->second)
    if (auto impl = w.lock(); impl && impl->symbol == v) return true;
  return false;
}

void Rebind(TraceScope::State& s, ir::Value* from, ir::Value* to) {
  auto it = s.holders.find(from);
  if (it == s.holders.end()) return;
  std::vector<std::weak_ptr<TensorImpl>> moved = std::move(it->second);
  s.holders.erase(it);
  for (auto& w : moved)
    if (auto impl = w.lock(); impl && impl->symbol == from) {
      impl->symbol = to;
      s.holders[to].push_back(impl);
    }
}

// `dst` = `src` in place, where `dst` is a value of the trace: every symbolic tensor holding `dst`
// now holds `src`, and when `dst` is a view (y[0], y.T) of another value, that value is rewritten
// too: where(written, take(src, position), old), so `y = x * 2; y[0] = 0` traces as eager runs it.
// `from_view`: the view of `dst` the write came through (already rebound by the caller).
void WriteSymbolic(TraceScope::State& s, ir::Value* dst, ir::Value* src, Device dev, const ir::Value* from_view) {
  ir::Node* p = dst->node();
  if (!p)
    KILN_THROW(StateError) << "hybridize: writing in place into an input of the hybridized block is not supported "
                              "(the compiled graph cannot change the caller's array); compute a new array instead "
                              "(y = x.copy(); y[...] = ...)";
  // Views of dst taken before the write and still held (r = y[::-1]) see the new values in eager
  // code: here they are taken again from the new value.
  std::vector<ir::Node*> views;
  for (const auto& n : s.graph->nodes())
    if (n.get() != p && n->inputs().size() == 1 && n->input(0) == dst && n->output(0) != from_view &&
        IsViewOp(n->op(), dev) && HasLiveHolder(s, n->output(0)))
      views.push_back(n.get());
  if (p->inputs().size() == 1 && IsViewOp(p->op(), dev)) {
    ir::Value* base = p->input(0);
    const Shape& bs = base->shape();
    // Where each element of the view lies in its base: the view op applied to 0, 1, 2, ...
    std::vector<int64_t> iota(static_cast<size_t>(bs.numel()));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<int64_t>(i);
    std::vector<int64_t> pos;
    {
      PauseScope pause;
      autograd::PauseScope no_record;
      Tensor in[1] = {Tensor::FromVector(iota, bs)};
      pos = Invoke(p->op(), in, p->attrs())[0].ToVector<int64_t>();
    }
    std::vector<int64_t> inv(iota.size(), 0);
    std::vector<bool> mask(iota.size(), false);
    for (size_t k = 0; k < pos.size(); ++k) {
      if (mask[static_cast<size_t>(pos[k])])
        KILN_THROW(ValueError) << "hybridize: the destination is a broadcast view (its elements overlap) and "
                                  "cannot be written";
      mask[static_cast<size_t>(pos[k])] = true;
      inv[static_cast<size_t>(pos[k])] = static_cast<int64_t>(k);
    }
    Tensor cond, where_from;
    {
      PauseScope pause;
      cond = Tensor::FromVector(mask, bs, dev);
      where_from = Tensor::FromVector(inv, bs, dev);
    }
    Tensor src_t = Symbolic(src, dev), base_t = Symbolic(base, dev);
    Tensor flat = RecordOp(op::kReshape, {&src_t, 1}, ir::GetOp(op::kReshape).Resolve(
                                                           {{"shape", std::vector<int64_t>{dst->shape().numel()}}}),
                           dev)[0];
    Tensor take_in[2] = {flat, where_from};
    Tensor taken = RecordOp(op::kTake, take_in, ir::GetOp(op::kTake).Resolve({{"axis", int64_t{0}}}), dev)[0];
    Tensor where_in[3] = {cond, taken, base_t};
    Tensor updated = RecordOp(op::kWhere, where_in, ir::GetOp(op::kWhere).Resolve({}), dev)[0];
    WriteSymbolic(s, base, updated.impl()->symbol, dev, dst);
  }
  Rebind(s, dst, src);
  for (ir::Node* n : views) {
    Tensor in[1] = {Symbolic(src, dev)};
    Rebind(s, n->output(0), RecordOp(n->op(), in, n->attrs(), dev)[0].impl()->symbol);
  }
}
}  // namespace

void RecordAssign(const Tensor& src, const Tensor& dst) {
  TraceScope::State& s = Current();
  if (IsSymbolic(dst)) {
    if (dst.impl()->trace_id != s.id)
      KILN_THROW(StateError) << "hybridize: a symbolic tensor of an earlier trace was written in this one (kept "
                                "in an attribute or a global during forward?); compute it again inside forward";
    ir::Value* v = ValueOf(s, src);
    if (v->dtype() != dst.dtype() || !(v->shape() == dst.shape()))
      KILN_THROW(ShapeError) << "hybridize: cannot write " << DTypeName(v->dtype()) << v->shape().str() << " into "
                             << DTypeName(dst.dtype()) << dst.shape().str();
    WriteSymbolic(s, dst.impl()->symbol, v, dst.device(), nullptr);
    return;
  }
  s.assigns.emplace_back(ValueOf(s, src), dst);
}

TraceScope::TraceScope() : state_(std::make_unique<State>()), prev_(tls_state) {
  if (prev_) KILN_THROW(StateError) << "hybridize: a trace is already active on this thread";
  state_->id = ++g_trace_ids;
  if (profiler::Enabled(profiler::kCompile)) state_->prof_start = profiler::Now();
  tls_state = state_.get();
#if KILN_WITH_CODEGEN
  codegen::PrewarmJit();  // a trace is compiled next: LLVM's setup overlaps tracing and the passes
#endif
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
  if (s.prof_start)
    profiler::Complete(profiler::kCompile, "trace", s.prof_start, profiler::Now(),
                       profiler::Args("nodes", static_cast<double>(s.graph->nodes().size())));

  // Graph inputs were added data first (Input before any op), captured after: already ordered.
  TracedGraph t;
  t.graph = std::move(s.graph);
  t.num_data = static_cast<int>(s.data_inputs.size());
  t.num_outputs = static_cast<int>(outputs.size());
  t.device = s.device.value_or(cpu());
  for (auto& [v, tensor] : s.captured) t.captured.push_back(tensor);
  for (size_t i = 0; i < s.assigns.size(); ++i)
    t.assigns.emplace_back(static_cast<int>(outputs.size() + i), s.assigns[i].second);

  if (!freeze) return CachedGraph::FromTrace(std::move(t), false);
  // Folding runs ops eagerly: not recorded on this trace, nor on an autograd tape.
  struct TraceOff {
    State* saved = tls_state;
    TraceOff() { tls_state = nullptr; }
    ~TraceOff() { tls_state = saved; }
  } off;
  autograd::PauseScope pause;
  return CachedGraph::FromTrace(std::move(t), true);
}

}  // namespace kiln::trace
