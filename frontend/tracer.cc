// The tracer (see include/kiln/frontend/tracer.h): symbolic tensors, recording ops and copies on
// the active trace, and handing the finished trace to CachedGraph::FromTrace. It does not compile,
// cache or run graphs (cached_graph.cc does).
#include "kiln/frontend/tracer.h"

#if KILN_WITH_CODEGEN
#include "kiln/codegen/elementwise.h"
#endif

#include <atomic>
#include <unordered_map>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/profiler.h"

namespace kiln::trace {

struct TraceScope::State {
  uint64_t id = 0;  // symbolic tensors carry it: one from another trace is refused
  std::unique_ptr<ir::Graph> graph = std::make_unique<ir::Graph>();
  std::vector<ir::Value*> data_inputs;
  std::vector<std::pair<ir::Value*, Tensor>> captured;           // value, concrete tensor
  std::unordered_map<const TensorImpl*, ir::Value*> captured_by_impl;
  std::vector<std::pair<ir::Value*, Tensor>> assigns;             // value, concrete destination
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
