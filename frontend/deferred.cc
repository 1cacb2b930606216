// Joined calls (see deferred.h): held training calls, and the one plan they run as.
#include "kiln/frontend/deferred.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <utility>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/call_graph.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/interrupt.h"

namespace kiln::deferred {

namespace {

constexpr size_t kMaxHeld = 4;  // calls per device: a longer chain pushes the first ones

struct Call {
  ir::GraphRef graph;  // kept alive while held
  std::vector<Tensor> in, out;
  std::vector<int> late;
  // A random call's numbers, reserved when it was held (where it would have been pushed).
  uint64_t draws = 0;
  RandomReservation random;
};

// Where a call's input comes from: output `output` of held call `call`, or outside (call -1).
struct Source {
  int call = -1, output = -1;
};

struct Group {
  Device device;
  std::vector<Call> calls;
  std::vector<std::vector<Source>> sources;  // per call, per input
  std::vector<engine::Var*> vars;            // held in the engine
  bool step = false;  // one joined step (forward, loss, backward) awaiting its update (RunUpdate)
};

std::recursive_mutex g_mu;  // recursive: pushing a group goes through the engine's flush hook
std::vector<Group>& Groups() {
  static auto* g = new std::vector<Group>();  // leaked: the engine may flush while statics die
  return *g;
}

bool Enabled() {
  static const bool on = env::GetInt("KILN_JOIN_CALLS") != 0;
  return on;
}

// Contiguous tensors whose bytes overlap.
bool Overlaps(const Tensor& a, const Tensor& b) {
  if (!a.SharesStorage(b)) return false;
  const int64_t a0 = a.offset() * static_cast<int64_t>(DTypeSize(a.dtype()));
  const int64_t b0 = b.offset() * static_cast<int64_t>(DTypeSize(b.dtype()));
  const int64_t a1 = a0 + a.numel() * static_cast<int64_t>(DTypeSize(a.dtype()));
  const int64_t b1 = b0 + b.numel() * static_cast<int64_t>(DTypeSize(b.dtype()));
  return a0 < b1 && b0 < a1;
}

bool SameView(const Tensor& a, const Tensor& b) {
  return a.SharesStorage(b) && a.offset() == b.offset() && a.shape() == b.shape() && a.dtype() == b.dtype();
}

// The sources of `inputs` among the held outputs of `g`; false when an input overlaps a held
// output without being that very tensor (a view into it: no value of the joined graph).
bool Resolve(const Group& g, std::span<const Tensor> inputs, std::vector<Source>& src) {
  src.assign(inputs.size(), Source{});
  for (size_t j = 0; j < inputs.size(); ++j)
    for (size_t c = 0; c < g.calls.size(); ++c)
      for (size_t k = 0; k < g.calls[c].out.size(); ++k) {
        const Tensor& o = g.calls[c].out[k];
        if (!Overlaps(inputs[j], o)) continue;
        if (!SameView(inputs[j], o)) return false;
        src[j] = {static_cast<int>(c), static_cast<int>(k)};
      }
  return true;
}

// Whether writing `outputs` would change what a held call reads or writes.
bool WritesHeld(const Group& g, std::span<const Tensor> outputs) {
  for (const Tensor& o : outputs)
    for (const Call& c : g.calls) {
      for (const Tensor& t : c.in)
        if (Overlaps(o, t)) return true;
      for (const Tensor& t : c.out)
        if (Overlaps(o, t)) return true;
    }
  return false;
}

void AddKey(std::string& key, const std::vector<Source>& src) {
  key += " in";
  for (const Source& s : src) {
    if (s.call < 0) {
      key += " x";
      continue;
    }
    key += ' ';
    key += std::to_string(s.call);
    key += '.';
    key += std::to_string(s.output);
  }
}

// Per held call, per output: not an output of the joined graph (a saved value only the joined
// backward reads, which the tape then drops: it stays in the arena). Empty: none.
using Omitted = std::vector<std::vector<bool>>;

bool IsOmitted(const Omitted& omit, size_t c, size_t k) { return !omit.empty() && omit[c][k]; }

// The cache key of the joined graph of `g` (then a graph named `then`, reading `then_src`).
std::string KeyOf(const Group& g, const Omitted& omit, const std::vector<Source>* then_src, const std::string& then) {
  std::string key = "joined " + g.device.str();
  for (size_t c = 0; c < g.calls.size(); ++c) {
    key += "\ncall ";
    key += std::to_string(g.calls[c].graph->id());
    AddKey(key, g.sources[c]);
    key += " late";
    for (int l : g.calls[c].late) {
      key += ' ';
      key += std::to_string(l);
    }
    key += " omit";
    for (size_t k = 0; k < g.calls[c].out.size(); ++k)
      if (IsOmitted(omit, c, k)) {
        key += ' ';
        key += std::to_string(k);
      }
  }
  if (then_src) {
    key += "\nthen";
    AddKey(key, *then_src);
    key += "\n" + then;
  }
  return key;
}

// The late outputs of the joined graph of `g` (see Join): each call's late outputs that stay
// outputs, then `then_late` (indices into the outputs of the graph after the calls).
std::vector<int> JoinedLate(const Group& g, const Omitted& omit, std::span<const int> then_late) {
  std::vector<int> late;
  int n = 0;
  for (size_t c = 0; c < g.calls.size(); ++c)
    for (size_t k = 0; k < g.calls[c].out.size(); ++k) {
      if (IsOmitted(omit, c, k)) continue;
      if (std::find(g.calls[c].late.begin(), g.calls[c].late.end(), static_cast<int>(k)) != g.calls[c].late.end())
        late.push_back(n);
      ++n;
    }
  for (int l : then_late) late.push_back(n + l);
  return late;
}

// The joined graph: each call's graph inlined in order, an input read from an earlier call's
// output where it is one, a graph input otherwise; outputs: every call's that is not omitted, in
// order, then those of `then`.
std::unique_ptr<ir::Graph> Join(const Group& g, const Omitted& omit, const ir::Graph* then,
                                const std::vector<Source>* then_src) {
  auto m = std::make_unique<ir::Graph>();
  std::vector<std::vector<ir::Value*>> outs;
  std::vector<ir::Value*> all;
  int n_in = 0;
  auto add = [&](const ir::Graph& body, const std::vector<Source>& src, const std::vector<bool>* body_omit) {
    KILN_CHECK(body.inputs().size() == src.size()) << "joined call: the graph has " << body.inputs().size()
                                                   << " inputs, the call " << src.size();
    ir::ValueMap map;
    for (size_t j = 0; j < src.size(); ++j) {
      const ir::Value* x = body.inputs()[j];
      map[x] = src[j].call < 0 ? m->AddInput("in" + std::to_string(n_in++), x->type())
                               : outs[static_cast<size_t>(src[j].call)][static_cast<size_t>(src[j].output)];
    }
    ir::CopyNodes(body, *m, map);
    outs.emplace_back();
    for (size_t k = 0; k < body.outputs().size(); ++k) {
      ir::Value* v = map.at(body.outputs()[k]);
      outs.back().push_back(v);
      if (body_omit && (*body_omit)[k]) continue;
      all.push_back(v);
    }
  };
  for (size_t c = 0; c < g.calls.size(); ++c)
    add(RegisteredGraphBody(g.calls[c].graph->id()), g.sources[c], omit.empty() ? nullptr : &omit[c]);
  if (then) add(*then, *then_src, nullptr);
  m->SetOutputs(all);
  return m;
}

// The joined call's inputs (those from outside) and outputs, in the joined graph's order.
void JoinedOperands(const Group& g, const Omitted& omit, std::span<const Tensor> then_in,
                    const std::vector<Source>* then_src, std::span<const Tensor> then_out, std::vector<Tensor>& in,
                    std::vector<Tensor>& out) {
  for (size_t c = 0; c < g.calls.size(); ++c) {
    for (size_t j = 0; j < g.calls[c].in.size(); ++j)
      if (g.sources[c][j].call < 0) in.push_back(g.calls[c].in[j]);
    for (size_t k = 0; k < g.calls[c].out.size(); ++k)
      if (!IsOmitted(omit, c, k)) out.push_back(g.calls[c].out[k]);
  }
  if (then_src)
    for (size_t j = 0; j < then_in.size(); ++j)
      if ((*then_src)[j].call < 0) in.push_back(then_in[j]);
  out.insert(out.end(), then_out.begin(), then_out.end());
}

void Run(int64_t graph_id, std::span<const Tensor> in, std::span<const Tensor> out,
         const RandomReservation* random = nullptr) {
  RandomReservationScope scope(random);
  InvokeInto(op::kCallGraph, in, {{"graph_id", graph_id}, {"num_outputs", static_cast<int64_t>(out.size())}}, out);
}

// The numbers of the calls of `g` joined: those of the first random call, when each random call
// draws right after the one before (nothing else drew in between); nullopt when they do not.
// `fresh`: none of the calls draws but the graph after them does, from numbers reserved where
// it runs (the call is pushed or held), as a call of its own would.
struct JoinedRandom {
  uint64_t draws = 0;
  RandomReservation at;
  bool fresh = false;
  const RandomReservation* held() const { return draws && !fresh ? &at : nullptr; }
};
std::optional<JoinedRandom> RandomOf(const Group& g) {
  JoinedRandom j;
  for (const Call& c : g.calls) {
    if (c.draws == 0) continue;
    if (j.draws == 0)
      j.at = c.random;
    else if (c.random.seed != j.at.seed || c.random.offset != j.at.offset + j.draws)
      return std::nullopt;
    j.draws += c.draws;
  }
  return j;
}

// The numbers compiled joined call `cg` of the calls of `g` draws: the held calls' reservations,
// when it draws just what they reserved (the plan numbers random ops in node order, the passes
// keep them in order and never merge them, and the calls' nodes are inlined in call order); fresh
// numbers when they reserved none. Nullopt when the calls cannot run as one: the reservations are
// not contiguous, or the graph after the calls draws too (its numbers would come after others
// drawn since).
std::optional<JoinedRandom> JoinedDraws(const Group& g, const CachedGraph& cg) {
  std::optional<JoinedRandom> r = RandomOf(g);
  if (!r) return std::nullopt;
  const auto n = static_cast<uint64_t>(ir::GetGraphSignature(cg.graph_id()).random_numel);
  if (r->draws == 0 && n > 0) return JoinedRandom{n, {}, /*fresh=*/true};
  if (r->draws != n) return std::nullopt;
  return r;
}

// Held in every entry point. Waiting for it lets go of the host language's lock (the GIL): the
// holder may wait for that lock while it pushes (the engine's backpressure lets go of it too).
class Lock {
 public:
  Lock() {
    if (!g_mu.try_lock()) {
      BlockingRegion blocking;
      g_mu.lock();
    }
  }
  ~Lock() { g_mu.unlock(); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;
};

// Set while this thread pushes a taken group: the engine's flush hook, which the group's own held
// variables call, returns at once (other devices' groups wait on).
thread_local int tls_pushing = 0;
struct PushingScope {
  PushingScope() { ++tls_pushing; }
  ~PushingScope() { --tls_pushing; }
};

void HoldCall(std::vector<engine::Var*>& vars, const Call& c) {
  std::vector<engine::Var*> reads, writes;
  for (const Tensor& t : c.in) reads.push_back(t.storage()->var());
  for (const Tensor& t : c.out) writes.push_back(t.storage()->var());
  engine::HoldVars(reads, /*written=*/false);
  engine::HoldVars(writes, /*written=*/true);
  vars.insert(vars.end(), reads.begin(), reads.end());
  vars.insert(vars.end(), writes.begin(), writes.end());
}

// Lets go of the held variables `old` that `kept` (held again by now) does not hold.
void ReleaseAllBut(const std::vector<engine::Var*>& old, const std::vector<engine::Var*>& kept) {
  std::unordered_set<engine::Var*> still(kept.begin(), kept.end());
  std::vector<engine::Var*> done;
  for (engine::Var* v : old)
    if (!still.count(v)) done.push_back(v);
  engine::ReleaseHeldVars(done);
}

// After a push of taken group `g` failed having pushed its first `pushed` calls: the others are
// held again (their sources renumbered), so that the next flush pushes them, and whatever reads
// their outputs waits for them as before; the error goes on to the caller.
void Restore(Group& g, size_t pushed) {
  Group rest{g.device, {}, {}, {}, g.step && pushed == 0};
  for (size_t c = pushed; c < g.calls.size(); ++c) {
    std::vector<Source> src = g.sources[c];
    for (Source& s : src)
      s = s.call < static_cast<int>(pushed) ? Source{} : Source{s.call - static_cast<int>(pushed), s.output};
    rest.calls.push_back(std::move(g.calls[c]));
    rest.sources.push_back(std::move(src));
  }
  // Held again before the pushed calls' variables are let go: no other thread's push slips by.
  for (const Call& c : rest.calls) HoldCall(rest.vars, c);
  ReleaseAllBut(g.vars, rest.vars);
  if (!rest.calls.empty()) Groups().insert(Groups().begin(), std::move(rest));
}

// The compiled joined graph; null when it does not compile (the calls then run one by one).
std::shared_ptr<CachedGraph> Compile(const Group& g, const std::string& key, std::vector<int> late,
                                     const std::function<std::unique_ptr<ir::Graph>()>& join) {
  try {
    return CompanionGraph(g.calls[0].graph->id(), key, [&] {
      std::unique_ptr<ir::Graph> m = join();
      const int n = static_cast<int>(m->inputs().size());
      return CachedGraph::FromGraph(std::move(m), n, {}, g.device, std::move(late));
    });
  } catch (const InternalError&) {
    throw;
  } catch (const DeferredDeviceError&) {
    throw;  // the user's bad input from before, raised by a wait while compiling
  } catch (const Error&) {
    return nullptr;
  }
}

// Lets go of the graphs of calls `begin`..`end` of `g` once the engine is idle: a pushed call's
// task finds its graph by id when it runs, and a held call may have kept the last reference.
void RetireCalls(Group& g, size_t begin, size_t end) {
  for (size_t c = begin; c < end && c < g.calls.size(); ++c) RetireGraph(std::move(g.calls[c].graph));
}

// Pushes the calls of a group taken out of Groups(), whose variables are still held.
void PushGroup(Group& g) {
  PushingScope pushing;
  size_t pushed = 0;
  try {
    if (g.calls.size() > 1 && RandomOf(g)) {
      auto cg = Compile(g, KeyOf(g, {}, nullptr, ""), JoinedLate(g, {}, {}), [&] { return Join(g, {}, nullptr, nullptr); });
      std::optional<JoinedRandom> r;
      if (cg) r = JoinedDraws(g, *cg);
      if (r) {
        std::vector<Tensor> in, out;
        JoinedOperands(g, {}, {}, nullptr, {}, in, out);
        Run(cg->graph_id(), in, out, r->held());
        pushed = g.calls.size();
      }
    }
    for (; pushed < g.calls.size(); ++pushed) {
      const Call& c = g.calls[pushed];
      Run(c.graph->id(), c.in, c.out, c.draws ? &c.random : nullptr);
    }
  } catch (...) {
    Restore(g, pushed);
    RetireCalls(g, 0, pushed);
    throw;
  }
  engine::ReleaseHeldVars(g.vars);
  RetireCalls(g, 0, g.calls.size());
}

Group* Find(Device device) {
  for (Group& g : Groups())
    if (g.device == device) return &g;
  return nullptr;
}

Group Take(Device device) {
  auto& groups = Groups();
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups[i].device == device) {
      Group g = std::move(groups[i]);
      groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(i));
      return g;
    }
  return Group{device, {}, {}, {}, false};
}

// Holds joined call `cg` of taken group `g` (operands `in`, `out`, drawing `random`) as the device's step, which an
// update may join (RunUpdate); the taken calls' variables are let go once the step's are held.
void HoldStep(Group& g, const CachedGraph& cg, std::vector<Tensor> in, std::vector<Tensor> out, std::vector<int> late,
              const JoinedRandom& random) {
  ir::GraphRef graph = ir::FindGraph(cg.graph_id());
  KILN_CHECK(graph) << "joined step: graph " << cg.graph_id() << " is not registered";
  Group step{g.device, {}, {}, {}, /*step=*/true};
  // Fresh numbers are reserved now, where the step would have been pushed.
  const RandomReservation at = random.fresh ? ReserveRandom(random.draws) : random.at;
  step.calls.push_back(Call{std::move(graph), std::move(in), std::move(out), std::move(late), random.draws, at});
  step.sources.emplace_back(step.calls[0].in.size());
  HoldCall(step.vars, step.calls[0]);
  ReleaseAllBut(g.vars, step.vars);
  Groups().push_back(std::move(step));
}

// Runs the calls of taken group `g` joined with the graph `make` builds (reading `src`, writing
// `outputs`, of which `then_late` late), omitting `omit`; with `hold`, holds the joined call as the
// device's step instead of pushing it. False when the joined graph does not compile: the calls
// were pushed one by one and the caller runs its graph alone.
bool RunTaken(Group& g, const Omitted& omit, const std::vector<Source>& src, const std::string& key,
              const std::vector<int>& then_late, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
              const std::function<std::unique_ptr<ir::Graph>()>& make, bool hold) {
  std::shared_ptr<CachedGraph> cg;
  {
    PushingScope pushing;
    try {
      std::vector<int> late = JoinedLate(g, omit, then_late);
      if (RandomOf(g))
        cg = Compile(g, KeyOf(g, omit, &src, key), late, [&] {
          std::unique_ptr<ir::Graph> then = make();
          return Join(g, omit, then.get(), &src);
        });
      std::optional<JoinedRandom> r;
      if (cg) r = JoinedDraws(g, *cg);
      if (!r) cg = nullptr;
      if (cg) {
        std::vector<Tensor> in, out;
        JoinedOperands(g, omit, inputs, &src, outputs, in, out);
        if (hold) {
          HoldStep(g, *cg, std::move(in), std::move(out), std::move(late), *r);
          RetireCalls(g, 0, g.calls.size());
          return true;
        }
        Run(cg->graph_id(), in, out, r->held());
      }
    } catch (...) {
      Restore(g, 0);  // held again: the caller's error leaves the calls as they were
      throw;
    }
  }
  if (!cg) {
    PushGroup(g);
    return false;
  }
  engine::ReleaseHeldVars(g.vars);
  RetireCalls(g, 0, g.calls.size());
  return true;
}

[[maybe_unused]] const bool kHookSet = (engine::SetFlushHook(&Flush), true);

}  // namespace

bool Hold(int64_t graph_id, std::span<const Tensor> inputs, std::span<const Tensor> outputs, std::vector<int> late) {
  if (!Enabled() || outputs.empty()) return false;
  ir::GraphRef graph = ir::FindGraph(graph_id);
  if (!graph) return false;
  const ir::GraphSignature& sig = graph->signature();
  if (sig.inputs.size() != inputs.size() || sig.outputs.size() != outputs.size()) return false;
  const Device device = outputs[0].device();
  for (size_t j = 0; j < inputs.size(); ++j) {  // anything InvokeInto would copy or refuse runs now
    const Tensor& t = inputs[j];
    if (!t.defined() || t.impl()->symbol || !t.is_contiguous() || !(t.device() == device) ||
        !(t.shape() == sig.inputs[j].shape) || t.dtype() != sig.inputs[j].dtype)
      return false;
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& t = outputs[k];
    if (!t.defined() || !t.is_contiguous() || !(t.device() == device) || !(t.shape() == sig.outputs[k].shape) ||
        t.dtype() != sig.outputs[k].dtype)
      return false;
  }
  Lock lock;
  std::vector<Source> src(inputs.size());
  if (Group* g = Find(device)) {
    if (g->step || g->calls.size() >= kMaxHeld || !Resolve(*g, inputs, src) || WritesHeld(*g, outputs)) {
      Group taken = Take(device);
      PushGroup(taken);
      src.assign(inputs.size(), Source{});
    }
  }
  Group* g = Find(device);
  if (!g) {
    Groups().push_back(Group{device, {}, {}, {}, false});
    g = &Groups().back();
  }
  // A random call's numbers are reserved now, where it would have been pushed: what draws after
  // it draws what it would have, however long the call is held.
  const auto draws = static_cast<uint64_t>(sig.random_numel);
  const RandomReservation random = draws ? ReserveRandom(draws) : RandomReservation{};
  g->calls.push_back(Call{std::move(graph), {inputs.begin(), inputs.end()}, {outputs.begin(), outputs.end()},
                          std::move(late), (draws + 3) / 4 * 4, random});
  g->sources.push_back(std::move(src));
  HoldCall(g->vars, g->calls.back());
  return true;
}

bool RunJoined(const std::string& key, Device device, std::span<const Tensor> inputs, const std::vector<bool>& spent,
               std::span<const Tensor> outputs, const std::function<std::unique_ptr<ir::Graph>()>& make) {
  if (!Enabled()) return false;
  Lock lock;
  Group* g = Find(device);
  if (!g) return false;
  if (g->step) {  // a step awaiting its update: this graph runs after it, alone
    Group taken = Take(device);
    PushGroup(taken);
    return false;
  }
  std::vector<Source> src;
  bool reads = false, contiguous = true;
  for (const Tensor& t : inputs) contiguous &= t.is_contiguous();
  for (const Tensor& t : outputs) contiguous &= t.is_contiguous();
  const bool joinable = contiguous && Resolve(*g, inputs, src) && !WritesHeld(*g, outputs);
  for (const Source& s : src) reads |= s.call >= 0;
  if (joinable && !reads) return false;  // independent: the held calls wait on
  Group taken = Take(device);
  if (!joinable) {
    PushGroup(taken);
    return false;
  }
  // A saved value (after a training call's gradient outputs) that only this graph reads, and only
  // where the caller drops it after: never written (nor allocated: reserved, cached_graph.cc).
  Omitted omit(taken.calls.size());
  for (size_t c = 0; c < taken.calls.size(); ++c) {
    const Call& call = taken.calls[c];
    omit[c].assign(call.out.size(), false);
    for (size_t k = static_cast<size_t>(std::max(0, call.graph->signature().num_grad_outputs)); k < call.out.size(); ++k)
      omit[c][k] = call.graph->signature().num_grad_outputs >= 0;
    for (int l : call.late) omit[c][static_cast<size_t>(l)] = false;
  }
  for (size_t c = 0; c < taken.calls.size(); ++c)  // read by a held call
    for (const Source& s : taken.sources[c])
      if (s.call >= 0) omit[static_cast<size_t>(s.call)][static_cast<size_t>(s.output)] = false;
  std::vector<std::vector<bool>> read(taken.calls.size());
  for (size_t c = 0; c < taken.calls.size(); ++c) read[c].assign(taken.calls[c].out.size(), false);
  for (size_t j = 0; j < src.size(); ++j) {
    if (src[j].call < 0) continue;
    const auto c = static_cast<size_t>(src[j].call), k = static_cast<size_t>(src[j].output);
    read[c][k] = true;
    if (j >= spent.size() || !spent[j]) omit[c][k] = false;
  }
  for (size_t c = 0; c < taken.calls.size(); ++c)
    for (size_t k = 0; k < omit[c].size(); ++k) omit[c][k] = omit[c][k] && read[c][k];
  return RunTaken(taken, omit, src, key, {}, inputs, outputs, make, /*hold=*/true);
}

bool RunUpdate(const std::string& key, Device device, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
               const std::function<std::unique_ptr<ir::Graph>()>& make) {
  if (!Enabled()) return false;
  Lock lock;
  Group* g = Find(device);
  if (!g || !g->step) return false;
  std::vector<Source> src;
  bool contiguous = true, reads = false;
  for (const Tensor& t : inputs) contiguous &= t.is_contiguous();
  for (const Tensor& t : outputs) contiguous &= t.is_contiguous();
  bool joinable = contiguous && Resolve(*g, inputs, src);
  for (const Tensor& o : outputs)  // written last (late): what the step reads, never what it writes
    for (const Tensor& t : g->calls[0].out) joinable &= !Overlaps(o, t);
  for (const Source& s : src) reads |= s.call >= 0;
  if (joinable && !reads) return false;  // independent: the step waits on
  Group taken = Take(device);
  if (!joinable) {
    PushGroup(taken);
    return false;
  }
  std::vector<int> late(outputs.size());
  for (size_t k = 0; k < late.size(); ++k) late[k] = static_cast<int>(k);
  return RunTaken(taken, {}, src, key, late, inputs, outputs, make, /*hold=*/false);
}

bool HoldsStep(Device device) {
  if (!Enabled()) return false;
  Lock lock;
  const Group* g = Find(device);
  return g && g->step;
}

void Flush() {
  if (tls_pushing) return;  // this thread is pushing a group: its own variables call here
  Lock lock;
  while (!Groups().empty()) {
    Group g = std::move(Groups().back());
    Groups().pop_back();
    PushGroup(g);
  }
}

void Drop() {
  Lock lock;
  for (Group& g : Groups()) engine::ReleaseHeldVars(g.vars);
  Groups().clear();
}

}  // namespace kiln::deferred
