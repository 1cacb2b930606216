// Eager autograd over a tape that is an ir::Graph (see autograd.h).
//
// The tape of a record scope holds the graph plus the data its gradients read (storage views,
// not Tensors, so no reference cycle through AutogradMeta); the other values are only located,
// so that the program's dropping them frees them. Every tensor produced while recording points
// at the tape and its value; the tape lives as long as any such tensor.
// Leaves (tensors with AttachGrad) are graph inputs of the tape that first used them.
//
// In-place writes (RecordWrite, called by Tensor::CopyTo): the tape tracks a storage written while
// recording as one flat value of its whole contents. A write makes a new flat value,
// where(mask, take_grad(src, positions), old), and bumps the storage's version; a tensor viewing
// the storage whose value is of an older version is read again from the flat value (a slice and
// reshape, or a take of its element positions) when it is next used. Saved values that live in the
// written storage are first copied, so backward reads what forward read (PyTorch raises "modified
// by an inplace operation" there instead). A write into a leaf is not differentiated (an optimizer
// step inside the scope): see WriteIntoLeaf.
#include "kiln/frontend/autograd.h"

#include <algorithm>
#include <optional>

#include <unordered_map>
#include <variant>
#include <unordered_set>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/deferred.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/call_graph.h"
#include "kiln/passes/autodiff.h"
#include "kiln/passes/dce.h"
#include "kiln/ir/text.h"
#include "kiln/runtime/env.h"

namespace kiln {

struct Tape {
  ir::Graph graph;
  /// The data backward reads (detached views: no autograd meta): the values a recorded op's
  /// gradient rule reads, the graph inputs, and the values of the in-place machinery below.
  std::unordered_map<const ir::Value*, Tensor> data;
  /// Where the other values of recorded ops are, without keeping their memory alive: an
  /// activation no gradient reads (a convolution's output before its bias, a batch norm's output
  /// that a relu reads) is freed as soon as the program drops it, as PyTorch frees what no
  /// backward function saved. A value is promoted into `data` when a later op's gradient reads
  /// it (from the tensor that op was given) or an in-place write needs its old contents.
  struct Unsaved {
    std::shared_ptr<TensorImpl> view;  // the view, without its storage
    std::weak_ptr<Storage> storage;
  };
  std::unordered_map<const ir::Value*, Unsaved> unsaved;
  /// The data of `v` if it is held or its storage still lives (then it is held from now on).
  const Tensor* Data(const ir::Value* v) {
    auto it = data.find(v);
    if (it != data.end()) return &it->second;
    auto u = unsaved.find(v);
    if (u == unsaved.end()) return nullptr;
    StoragePtr st = u->second.storage.lock();
    if (!st) return nullptr;
    auto impl = std::make_shared<TensorImpl>(*u->second.view);
    impl->storage = std::move(st);
    unsaved.erase(u);
    return &data.emplace(v, Tensor(std::move(impl))).first->second;
  }
  std::vector<std::pair<const ir::Value*, std::weak_ptr<TensorImpl>>> leaves;
  /// Values whose data a backward without retain_graph released. A tape can hold several
  /// disjoint computations (one loss per device, each with its own backward): each backward frees
  /// only what its heads were computed from.
  std::unordered_set<const ir::Value*> freed;
  std::unordered_set<const ir::Node*> spent;  // nodes whose saved values were released
  /// The compiled graph of each recorded call: a backward must find it even when the block that
  /// compiled it dropped it since (a cache cleared or evicted inside the scope). Released when a
  /// backward spends the call.
  std::unordered_map<const ir::Node*, ir::GraphRef> graphs;
  /// Storages written in place while recording: the value of the whole contents (flat, 1-D, of
  /// the written dtype) and a version that changes with every write (see the header comment).
  /// Keyed by address: `storage` tells a live entry from one whose storage died (its address may
  /// be reused by a new storage).
  struct Written {
    ir::Value* flat;
    uint64_t version;
    std::weak_ptr<Storage> storage;
  };
  std::unordered_map<const Storage*, Written> written;
  /// The entry of `t`'s storage, or null.
  const Written* Find(const Tensor& t) {
    if (written.empty()) return nullptr;
    auto it = written.find(t.storage().get());
    if (it == written.end()) return nullptr;
    if (it->second.storage.expired()) {
      written.erase(it);
      return nullptr;
    }
    return &it->second;
  }
  uint64_t writes = 0;
};

namespace {
const char* kFreedMessage =
    "backward: the graph of this computation was already freed by an earlier backward; pass "
    "retain_graph=True to the first backward to run it twice";
}  // namespace

struct AutogradMeta {
  // Leaf state.
  GradReq req = GradReq::kNull;
  Tensor grad;
  bool fresh = false;  // a backward wrote `grad` since the last SetGradFresh(false)
  // Where this tensor lives on a tape (for leaves: the tape that last used it).
  std::shared_ptr<Tape> tape;
  ir::Value* value = nullptr;
  uint64_t version = 0;  // the written version of the storage `value` was taken at (0: never written)
};

namespace autograd {

namespace {
thread_local bool tls_recording = false;
thread_local bool tls_training = false;
thread_local std::shared_ptr<Tape> tls_tape;  // the tape of the outermost active record scope
thread_local int tls_record_depth = 0;

Tensor Detached(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd.reset();
  return Tensor(std::move(impl));
}

bool OnTape(const Tensor& t) { return t.impl()->autograd && t.impl()->autograd->tape; }
bool IsLeaf(const Tensor& t) { return t.impl()->autograd && t.impl()->autograd->req != GradReq::kNull; }

uint64_t VersionOf(Tape& tape, const Tensor& t) {
  const Tape::Written* w = tape.Find(t);
  return w ? w->version : 0;
}

// `keep_all`: hold the data of every output (the in-place machinery reads them back).
void RecordOn(const std::shared_ptr<Tape>& tape, ir::OpId op, const ir::Attrs& attrs,
              std::span<const Tensor> inputs, std::span<const Tensor> outputs, bool keep_all = false);
ir::Value* Reread(const std::shared_ptr<Tape>& tape, const Tensor& t, const Tape::Written& w);

// The value of `t` on `tape`, adding it as a graph input (leaf or constant) when needed.
ir::Value* ValueOn(const std::shared_ptr<Tape>& tape, const Tensor& t) {
  auto& meta = t.impl()->autograd;
  if (!tape->written.empty() && !IsLeaf(t))
    if (const Tape::Written* w = tape->Find(t)) {
      if (meta && meta->tape == tape && meta->value && meta->version == w->version) return meta->value;
      return Reread(tape, t, *w);
    }
  if (meta && meta->tape == tape && meta->value) return meta->value;
  ir::Value* v = tape->graph.AddInput(IsLeaf(t) ? "leaf" : "const", {t.shape(), t.dtype()});
  tape->data.emplace(v, Detached(t));
  if (IsLeaf(t)) {
    meta->tape = tape;
    meta->value = v;
    tape->leaves.emplace_back(v, t.impl_ptr());
  }
  return v;
}

bool NeedsRecordOn(Tape& tape, const Tensor& t) {
  return IsLeaf(t) || (OnTape(t) && t.impl()->autograd->tape.get() == &tape) || tape.Find(t);
}

// Runs `op` with recording paused and records it on `tape` (ops that RecordWrite and Reread add).
Tensor OpOn(const std::shared_ptr<Tape>& tape, ir::OpId op, std::vector<Tensor> in, const ir::Attrs& attrs) {
  std::vector<Tensor> out;
  {
    PauseScope pause(IsTraining());
    out = Invoke(op, in, attrs, std::nullopt);
  }
  RecordOn(tape, op, ir::GetOp(op).Resolve(attrs), in, out, /*keep_all=*/true);
  return out[0];
}

// A tensor holding value `v` of `tape` (its data, and meta pointing at `v`).
Tensor TensorOf(const std::shared_ptr<Tape>& tape, ir::Value* v) {
  const Tensor* d = tape->Data(v);
  if (!d) KILN_THROW(StateError) << kFreedMessage;
  Tensor t = Detached(*d);
  auto meta = std::make_shared<AutogradMeta>();
  meta->tape = tape;
  meta->value = v;
  meta->version = VersionOf(*tape, t);
  t.impl()->autograd = std::move(meta);
  return t;
}

// Positions of `t`'s elements (in its logical order) counted in elements from its storage's start.
std::vector<int64_t> Positions(const Tensor& t) {
  std::vector<int64_t> pos(static_cast<size_t>(t.numel()));
  std::vector<int64_t> idx(static_cast<size_t>(t.rank()), 0);
  for (size_t k = 0; k < pos.size(); ++k) {
    int64_t off = t.offset();
    for (int d = 0; d < t.rank(); ++d) off += idx[static_cast<size_t>(d)] * t.strides()[d];
    pos[k] = off;
    for (int d = t.rank() - 1; d >= 0 && ++idx[static_cast<size_t>(d)] == t.shape()[d]; --d)
      idx[static_cast<size_t>(d)] = 0;
  }
  return pos;
}

// The value of `t`, a view of a storage written in place, read from the storage's current value.
ir::Value* Reread(const std::shared_ptr<Tape>& tape, const Tensor& t, const Tape::Written& w) {
  Tensor flat = TensorOf(tape, w.flat);
  if (flat.dtype() != t.dtype())
    KILN_THROW(DTypeError) << "autograd.record(): this " << DTypeName(t.dtype()) << " array views memory that "
                           << "was written in place as " << DTypeName(flat.dtype()) << "; autograd cannot "
                           << "follow writes through views of another dtype: write into a copy instead";
  Tensor out;
  if (t.is_contiguous()) {
    const int64_t begin = t.offset(), end = t.offset() + t.numel();
    Tensor part = begin == 0 && end == flat.numel()
                      ? flat
                      : OpOn(tape, op::kSlice, {flat}, {{"begin", std::vector<int64_t>{begin}},
                                                        {"end", std::vector<int64_t>{end}},
                                                        {"step", std::vector<int64_t>{1}}});
    out = OpOn(tape, op::kReshape, {part}, {{"shape", t.shape().vec()}});
  } else {
    Tensor idx = Tensor::FromVector(Positions(t), t.shape(), t.device());
    out = OpOn(tape, op::kTake, {flat, idx}, {{"axis", int64_t{0}}});
  }
  auto meta = std::make_shared<AutogradMeta>();
  meta->tape = tape;
  meta->value = out.impl()->autograd->value;
  meta->version = w.version;
  t.impl()->autograd = meta;
  return meta->value;
}

// Copies the storage of `dst` and points every saved value that lives in it at the copy: it is
// about to be overwritten, and backward must read the values forward read.
void PreserveSaved(const std::shared_ptr<Tape>& tape, const Tensor& dst) {
  const Storage* s = dst.storage().get();
  // A value not held whose memory is about to change is gone: no backward reads it, and an
  // in-place write must not take the new contents for its old ones.
  std::erase_if(tape->unsaved, [&](const auto& u) { return u.second.storage.lock().get() == s; });
  bool any = false;
  for (auto& [v, d] : tape->data) any = any || d.storage().get() == s;
  if (!any) return;
  auto raw = std::make_shared<TensorImpl>();
  raw->storage = dst.storage();
  raw->shape = Shape{static_cast<int64_t>(s->nbytes())};
  raw->strides = raw->shape.ContiguousStrides();
  raw->dtype = DType::kUInt8;
  Tensor copy = Tensor::Empty(raw->shape, DType::kUInt8, dst.device());
  {
    PauseScope pause(IsTraining());
    Tensor(std::move(raw)).CopyTo(copy);
  }
  for (auto& [v, d] : tape->data)
    if (d.storage().get() == s) {
      auto impl = std::make_shared<TensorImpl>(*d.impl());
      impl->storage = copy.storage();
      d = Tensor(std::move(impl));
    }
}
}  // namespace

RecordScope::RecordScope(bool train_mode) : prev_recording_(tls_recording), prev_training_(tls_training) {
  if (tls_record_depth++ == 0 || !tls_tape) tls_tape = std::make_shared<Tape>();
  tls_recording = true;
  tls_training = train_mode;
}
RecordScope::~RecordScope() {
  tls_recording = prev_recording_;
  tls_training = prev_training_;
  if (--tls_record_depth == 0) tls_tape.reset();
}

PauseScope::PauseScope(bool train_mode) : prev_recording_(tls_recording), prev_training_(tls_training) {
  tls_recording = false;
  tls_training = train_mode;
}
PauseScope::~PauseScope() {
  tls_recording = prev_recording_;
  tls_training = prev_training_;
}

bool IsRecording() { return tls_recording; }
bool IsTraining() { return tls_training; }
bool SetTraining(bool training) {
  bool prev = tls_training;
  tls_training = training;
  return prev;
}

bool FromCompiledCall(const Tensor& t) {
  if (!tls_recording || !t.defined() || !OnTape(t) || t.impl()->autograd->tape != tls_tape) return false;
  const ir::Value* v = t.impl()->autograd->value;
  return v && v->node() && v->node()->op() == op::kCallGraph;
}

bool NeedsRecord(std::span<const Tensor> inputs) {
  if (!tls_recording) return false;
  for (const Tensor& t : inputs)
    if (IsLeaf(t) || (OnTape(t) && t.impl()->autograd->tape == tls_tape)) return true;
  if (tls_tape && !tls_tape->written.empty())
    for (const Tensor& t : inputs)
      if (tls_tape->Find(t)) return true;
  return false;
}

void Record(ir::OpId op, const ir::Attrs& attrs, std::span<const Tensor> inputs,
            std::span<const Tensor> outputs) {
  RecordOn(tls_tape, op, attrs, inputs, outputs);
}

namespace {

// Which of a node's inputs and outputs its gradient rule reads: found once per op, attributes and
// input types by differentiating the node alone, in a graph of its own, for every input (more
// than a backward ever asks). `all`: the rule could not be examined; everything is held.
struct GradReads {
  std::vector<bool> inputs, outputs;
  bool all = false;
};

struct ReadsKey {
  ir::OpId op;
  ir::Attrs attrs;
  std::vector<ir::TensorType> types;
  bool operator==(const ReadsKey& o) const { return op == o.op && types == o.types && attrs == o.attrs; }
};
struct ReadsKeyHash {
  size_t operator()(const ReadsKey& k) const {
    size_t h = std::hash<int>()(static_cast<int>(k.op));
    auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    for (const ir::TensorType& t : k.types) {
      mix(static_cast<size_t>(t.dtype));
      for (int64_t d : t.shape.vec()) mix(static_cast<size_t>(d));
    }
    for (const auto& [name, value] : k.attrs.items()) {  // the values: a slice's bounds differ per call
      std::visit(
          [&](const auto& x) {
            using X = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<X, std::vector<int64_t>>) {
              for (int64_t d : x) mix(static_cast<size_t>(d));
            } else if constexpr (std::is_same_v<X, double>) {
              mix(std::hash<double>()(x));
            } else {
              mix(static_cast<size_t>(x));
            }
          },
          value);
    }
    return h;
  }
};

GradReads Examine(const ir::Node& node) {
  GradReads r;
  r.inputs.assign(node.inputs().size(), false);
  r.outputs.assign(node.outputs().size(), false);
  try {
    ir::Graph g;
    std::vector<ir::Value*> xs;
    for (const ir::Value* v : node.inputs()) xs.push_back(g.AddInput("x", v->type()));
    ir::Node* n = g.AddNode(node.op(), xs, node.attrs());
    std::vector<ir::Value*> ys, dys, diff;
    for (ir::Value* y : n->outputs())
      if (IsFloat(y->dtype())) ys.push_back(y), dys.push_back(g.AddInput("dy", y->type()));
    for (ir::Value* x : xs)
      if (IsFloat(x->dtype())) diff.push_back(x);
    if (ys.empty() || diff.empty()) return r;  // nothing flows back through it
    const size_t first = g.nodes().size();
    std::vector<ir::Value*> grads = passes::BuildGradients(g, ys, dys, diff);
    std::vector<ir::Value*> roots;
    for (ir::Value* gv : grads)
      if (gv) roots.push_back(gv);
    std::vector<bool> live = passes::LiveNodes(g, roots);
    for (size_t i = first; i < g.nodes().size(); ++i) {
      if (!live[i]) continue;
      for (const ir::Value* v : g.nodes()[i]->inputs()) {
        for (size_t k = 0; k < xs.size(); ++k) r.inputs[k] = r.inputs[k] || v == xs[k];
        for (size_t k = 0; k < n->outputs().size(); ++k) r.outputs[k] = r.outputs[k] || v == n->output(static_cast<int>(k));
      }
    }
    // A gradient that is an input or output itself (identity-like rules) is read as such.
    for (ir::Value* gv : grads)
      for (size_t k = 0; k < n->outputs().size(); ++k) r.outputs[k] = r.outputs[k] || gv == n->output(static_cast<int>(k));
  } catch (const std::exception&) {
    r.all = true;  // not differentiable here, or a rule that needs more than the node: hold all
  }
  return r;
}

const GradReads& ReadsOf(const ir::Node& n) {
  thread_local std::unordered_map<ReadsKey, GradReads, ReadsKeyHash> cache;
  ReadsKey key{n.op(), n.attrs(), {}};
  key.types.reserve(n.inputs().size());
  for (const ir::Value* v : n.inputs()) key.types.push_back(v->type());
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 4096) cache.clear();  // bounded: programs of many shapes
  GradReads r = Examine(n);
  return cache.emplace(std::move(key), std::move(r)).first->second;
}

void RecordOn(const std::shared_ptr<Tape>& tape, ir::OpId op, const ir::Attrs& attrs,
              std::span<const Tensor> inputs, std::span<const Tensor> outputs, bool keep_all) {
  std::vector<ir::Value*> in;
  in.reserve(inputs.size());
  for (const Tensor& t : inputs) in.push_back(ValueOn(tape, t));
  ir::Node* n = tape->graph.AddNode(op, std::move(in), attrs);
  if (op == op::kCallGraph) tape->graphs.emplace(n, ir::FindGraph(attrs.Int("graph_id")));
  // A compiled call's extra outputs are what its backward saved: held, as everything of an op
  // whose gradient rule could not be examined.
  // Its inputs too: a compiled call's backward reads every one of them.
  const GradReads* reads = keep_all || op == op::kCallGraph ? nullptr : &ReadsOf(*n);
  if (reads && reads->all) reads = nullptr;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ir::Value* v = n->inputs()[i];
    if ((reads && !reads->inputs[i]) || tape->data.count(v)) continue;
    tape->unsaved.erase(v);
    tape->data.emplace(v, Detached(inputs[i]));  // the tensor this op read holds the value's data
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    ir::Value* v = n->output(static_cast<int>(i));
    if (reads && !reads->outputs[i]) {
      auto view = std::make_shared<TensorImpl>(*outputs[i].impl());
      view->autograd.reset();
      std::weak_ptr<Storage> storage = view->storage;
      view->storage->KeepIdentity();  // known weakly from here on: never reused while alive
      view->storage.reset();
      tape->unsaved.emplace(v, Tape::Unsaved{std::move(view), std::move(storage)});
    } else {
      tape->data.emplace(v, Detached(outputs[i]));
    }
    auto meta = std::make_shared<AutogradMeta>();
    meta->tape = tape;
    meta->value = v;
    meta->version = VersionOf(*tape, outputs[i]);
    outputs[i].impl()->autograd = std::move(meta);
  }
}
}  // namespace

namespace {
// A write into a leaf this recording used (or a view of it), such as an optimizer step taken inside
// the record scope: the write itself is not differentiated (the leaf stays a leaf), the values saved
// before it are kept, and later uses read a second graph input for the leaf holding its new value
// (Backward adds the gradients of both). False when no used leaf lives in dst's storage.
bool WriteIntoLeaf(const std::shared_ptr<Tape>& tape, const Tensor& dst) {
  const Storage* s = dst.storage().get();
  std::vector<std::shared_ptr<TensorImpl>> hit;
  for (auto& [v, w] : tape->leaves)
    if (auto impl = w.lock(); impl && impl->storage.get() == s && IsLeaf(Tensor(impl)) &&
                              impl->autograd->tape == tape)
      hit.push_back(impl);
  if (hit.empty()) return false;
  PreserveSaved(tape, dst);
  for (auto& impl : hit) {
    Tensor leaf(impl);
    ir::Value* v = tape->graph.AddInput("leaf", {leaf.shape(), leaf.dtype()});
    tape->data.emplace(v, Detached(leaf));  // a view of the storage: it holds the written values
    impl->autograd->value = v;
    tape->leaves.emplace_back(v, impl);
  }
  tape->written.erase(s);
  // Views of the leaf taken before the write read its new value when next used.
  Tensor leaf(hit[0]);
  const int64_t n = static_cast<int64_t>(s->nbytes() / DTypeSize(leaf.dtype()));
  if (leaf.offset() == 0 && leaf.is_contiguous() && leaf.numel() == n && IsFloat(leaf.dtype())) {
    Tensor flat = OpOn(tape, op::kReshape, {leaf}, {{"shape", std::vector<int64_t>{n}}});
    tape->written[s] = Tape::Written{flat.impl()->autograd->value, ++tape->writes, dst.storage()};
    dst.storage()->KeepIdentity();  // known by address from here on: never reused while alive
  }
  return true;
}
}  // namespace

void RecordWrite(const Tensor& src, const Tensor& dst) {
  const std::shared_ptr<Tape>& tape = tls_tape;
  if (!tls_recording || !tape) return;
  const Storage* s = dst.storage().get();
  if (WriteIntoLeaf(tape, dst) || IsLeaf(dst)) return;  // a leaf not used yet is simply overwritten
  const size_t es = DTypeSize(dst.dtype());
  const int64_t n = static_cast<int64_t>(s->nbytes() / es);
  const Tape::Written* wit = tape->Find(dst);
  ir::Value* full = nullptr;  // a recorded op's output that covers the whole storage
  if (!wit) {
    for (auto& [v, d] : tape->data)
      if (d.storage().get() == s && v->node() && d.dtype() == dst.dtype() && d.offset() == 0 && d.is_contiguous() &&
          d.numel() == n) {
        full = const_cast<ir::Value*>(v);
        break;
      }
    if (!full)
      for (auto& [v, u] : tape->unsaved) {
        StoragePtr st = u.storage.lock();
        if (st.get() != s || !v->node()) continue;
        auto impl = std::make_shared<TensorImpl>(*u.view);
        impl->storage = std::move(st);
        const Tensor d(std::move(impl));
        if (d.dtype() == dst.dtype() && d.offset() == 0 && d.is_contiguous() && d.numel() == n) {
          full = const_cast<ir::Value*>(v);
          break;
        }
      }
  }
  const bool same_device = src.device() == dst.device();
  const bool record = IsFloat(dst.dtype()) && (wit || full ||
                                               (same_device && NeedsRecordOn(*tape, src)));
  if (!record) {
    // Nothing differentiable flows through this storage: later readers take its contents as
    // constants. Only the values saved from it must keep their old contents.
    tape->written.erase(s);
    PreserveSaved(tape, dst);
    return;
  }
  for (int d = 0; d < dst.rank(); ++d)
    if (dst.strides()[d] == 0 && dst.shape()[d] > 1)
      KILN_THROW(ValueError) << "autograd.record(): the destination of shape " << dst.shape().str()
                             << " is a broadcast view (a zero stride): its elements overlap and cannot be written";
  Tensor old_flat;
  if (wit) {
    old_flat = TensorOf(tape, wit->flat);
  } else if (full) {
    old_flat = TensorOf(tape, full);
    if (old_flat.rank() != 1) old_flat = OpOn(tape, op::kReshape, {old_flat}, {{"shape", std::vector<int64_t>{n}}});
  } else {  // the storage holds constants so far (a buffer made before recording)
    auto impl = std::make_shared<TensorImpl>(*dst.impl());
    impl->autograd.reset();
    impl->offset = 0;
    impl->shape = Shape{n};
    impl->strides = impl->shape.ContiguousStrides();
    ir::Value* v = tape->graph.AddInput("const", {impl->shape, dst.dtype()});
    tape->data.emplace(v, Tensor(std::move(impl)));
    old_flat = TensorOf(tape, v);
  }
  Tensor from = src;
  if (!same_device) {
    PauseScope pause(IsTraining());
    from = src.Detach().To(dst.device());
  }
  Tensor new_flat;
  if (dst.offset() == 0 && dst.is_contiguous() && dst.numel() == n) {  // y[:] = ...: every element
    new_flat = OpOn(tape, op::kReshape, {from}, {{"shape", std::vector<int64_t>{n}}});
  } else {
    std::vector<int64_t> pos = Positions(dst);
    std::vector<bool> mask(static_cast<size_t>(n), false);
    for (int64_t p : pos) mask[static_cast<size_t>(p)] = true;
    Tensor idx = Tensor::FromVector(pos, Shape{dst.numel()}, dst.device());
    Tensor cond = Tensor::FromVector(mask, Shape{n}, dst.device());
    Tensor vals = OpOn(tape, op::kReshape, {from}, {{"shape", std::vector<int64_t>{dst.numel()}}});
    Tensor scattered = OpOn(tape, op::kTakeGrad, {vals, idx}, {{"axis", int64_t{0}}, {"dim", n}});
    new_flat = OpOn(tape, op::kWhere, {cond, scattered, old_flat}, {});
  }
  tape->written[s] = Tape::Written{new_flat.impl()->autograd->value, ++tape->writes, dst.storage()};
  dst.storage()->KeepIdentity();  // known by address from here on: never reused while alive
  PreserveSaved(tape, dst);
}

namespace {

// Builds gradient nodes on the heads' tape, evaluates them, and returns the gradients of
// `xs` (undefined where no path leads to them). Rolls the tape back afterwards.
// ---- compiled backward -------------------------------------------------------------------------
// A backward through a hybridized block's training graph (a call_graph_backward node on the tape)
// runs its gradient nodes as one compiled plan instead of one task each: the loss's gradient ops,
// the head gradient's ones, and the block's backward graph inlined, so that fusion spans them and
// on a GPU one CUDA graph replays them all. The gradients of leaves with grad_req "write" are the
// plan's outputs, written in place. Compiled once per shape of the gradient nodes and cached with
// the block's training variant; KILN_COMPILED_BACKWARD=0 runs the nodes one by one.

// The training variant's backward graph of every call_graph_backward node among the live gradient
// nodes; empty when there is none or one has no compiled backward of its own.
std::unordered_map<const ir::Node*, const ir::Graph*> CompiledBodies(const ir::Graph& g, size_t mark,
                                                                     const std::vector<bool>& live) {
  std::unordered_map<const ir::Node*, const ir::Graph*> bodies;
  for (size_t i = mark; i < g.nodes().size(); ++i) {
    const ir::Node& n = *g.nodes()[i];
    if (!live[i] || n.op() != op::kCallGraphBackward) continue;
    const ir::Graph* body = TrainingBackwardBody(n.attrs().Int("graph_id"));
    if (!body) return {};
    bodies.emplace(&n, body);
  }
  return bodies;
}

bool RunCompiledBackward(const ir::Graph& g, size_t mark, const std::vector<bool>& live,
                         const std::vector<ir::Value*>& grads,
                         const std::vector<std::pair<ir::Value*, Tensor>>& seeds, Tape& tape,
                         const std::unordered_map<const ir::Value*, Tensor>& write_into,
                         const std::unordered_set<const ir::Value*>& releasable,
                         std::unordered_map<const ir::Value*, Tensor>& local) {
  static const bool on = env::GetInt("KILN_COMPILED_BACKWARD") != 0;
  if (!on) return false;
  const auto bodies = CompiledBodies(g, mark, live);
  if (bodies.empty()) return false;
  // K: the gradient nodes as recorded (its text is the cache key); inputs: the values they read
  // that no gradient node computes (saved forward values, given head gradients).
  auto k = std::make_unique<ir::Graph>();
  ir::ValueMap to_k;
  std::vector<Tensor> inputs;
  std::vector<bool> spent;  // per input: a saved value this backward spends (the tape drops it after)
  std::optional<Device> device;
  std::unordered_map<const ir::Value*, const Tensor*> seed_of;
  for (const auto& [dv, hg] : seeds) seed_of[dv] = &hg;
  auto place = [&](const ir::Value* v) -> bool {
    if (to_k.count(v)) return true;
    const Tensor* t = nullptr;
    bool saved = false;  // a value on the tape (not a given head gradient)
    if (auto s = seed_of.find(v); s != seed_of.end()) {
      if (!s->second->defined()) {  // ones: a fill in the graph
        ir::Builder b(*k);
        to_k[v] = b.Op(op::kFull, {}, {{"shape", v->shape().vec()}, {"value", 1.0}, {"dtype", v->dtype()}});
        return true;
      }
      t = s->second;
    } else if (auto d = tape.data.find(v); d != tape.data.end()) {
      t = &d->second;
      saved = true;
    } else if (v->node() && v->node()->inputs().empty()) {  // a constant: made in the graph
      const size_t id = static_cast<size_t>(v->node()->id());
      ir::CopyNodes(g, *k, to_k, id, id + 1);
      return true;
    } else {
      return false;  // freed or never saved: the eager path says which
    }
    if (!device) device = t->device();
    if (!(t->device() == *device)) return false;  // heads on several devices: one backward each
    to_k[v] = k->AddInput("in" + std::to_string(inputs.size()), v->type());
    inputs.push_back(*t);
    spent.push_back(saved && releasable.count(v) > 0);
    return true;
  };
  for (size_t i = mark; i < g.nodes().size(); ++i) {
    const ir::Node& n = *g.nodes()[i];
    if (!live[i] || n.inputs().empty()) continue;
    for (const ir::Value* v : n.inputs())
      if (!place(v)) return false;
    ir::CopyNodes(g, *k, to_k, i, i + 1);
  }
  std::vector<ir::Value*> outs;
  std::vector<const ir::Value*> out_values;  // in g, per output of K
  for (const ir::Value* gv : grads) {
    if (!gv || std::find(out_values.begin(), out_values.end(), gv) != out_values.end()) continue;
    if (!place(gv)) return false;
    outs.push_back(to_k.at(gv));
    out_values.push_back(gv);
  }
  if (outs.empty() || !device) return false;
  k->SetOutputs(outs);
  std::string key = device->str() + "\n" + ir::PrintGraph(*k);

  const ir::Node* first = nullptr;
  for (size_t i = mark; i < g.nodes().size() && !first; ++i)
    if (bodies.count(g.nodes()[i].get())) first = g.nodes()[i].get();
  // The compiled graph: K with each call_graph_backward replaced by its backward graph's nodes.
  auto make = [&] {
    auto c = std::make_unique<ir::Graph>();
    ir::ValueMap to_c;
    for (ir::Value* x : k->inputs()) to_c[x] = c->AddInput(x->name(), x->type());
    for (size_t i = 0; i < k->nodes().size(); ++i) {
      const ir::Node& n = *k->nodes()[i];
      if (n.op() != op::kCallGraphBackward) {
        ir::CopyNodes(*k, *c, to_c, i, i + 1);
        continue;
      }
      const ir::Graph& body = *TrainingBackwardBody(n.attrs().Int("graph_id"));
      ir::ValueMap inner;
      for (size_t j = 0; j < body.inputs().size(); ++j) inner[body.inputs()[j]] = to_c.at(n.input(static_cast<int>(j)));
      ir::CopyNodes(body, *c, inner);
      for (size_t j = 0; j < n.outputs().size(); ++j) to_c[n.output(static_cast<int>(j))] = inner.at(body.outputs()[j]);
    }
    std::vector<ir::Value*> couts;
    for (ir::Value* o : k->outputs()) couts.push_back(to_c.at(o));
    c->SetOutputs(couts);
    return c;
  };
  std::vector<Tensor> out;
  for (size_t j = 0; j < out_values.size(); ++j) {
    const ir::Value* gv = out_values[j];
    auto w = write_into.find(gv);
    out.push_back(w != write_into.end() && w->second.device() == *device ? w->second
                                                                           : Tensor::Empty(gv->shape(), gv->dtype(), *device));
  }
  // The forward calls still held (deferred.h) run with it, as one plan: the step's only one.
  if (deferred::RunJoined(key, *device, inputs, spent, out, make)) {
    for (size_t j = 0; j < out_values.size(); ++j) local[out_values[j]] = out[j];
    return true;
  }
  std::shared_ptr<CachedGraph> cg;
  try {
    cg = CompanionGraph(first->attrs().Int("graph_id"), key, [&] {
      std::unique_ptr<ir::Graph> c = make();
      const int num_inputs = static_cast<int>(c->inputs().size());
      return CachedGraph::FromGraph(std::move(c), num_inputs, {}, *device);
    });
  } catch (const InternalError&) {
    throw;
  } catch (const DeferredDeviceError&) {
    throw;  // the user's bad input from before, raised by a wait while compiling
  } catch (const Error&) {
    return false;  // not compilable (an op without a kernel in plans): the nodes run one by one
  }
  InvokeInto(op::kCallGraph, inputs,
             {{"graph_id", cg->graph_id()}, {"num_outputs", static_cast<int64_t>(out.size())}}, out);
  for (size_t j = 0; j < out_values.size(); ++j) local[out_values[j]] = out[j];
  return true;
}

// `into`: per x, the tensor its gradient is written into by the node that computes it (a leaf's
// grad buffer with grad_req "write"), or undefined; such a gradient is returned as that tensor.
std::vector<Tensor> Differentiate(const std::vector<Tensor>& heads, const std::vector<Tensor>& head_grads,
                                  const std::vector<ir::Value*>& xs, const std::shared_ptr<Tape>& tape,
                                  bool retain_graph, const std::vector<Tensor>& into = {}) {
  PauseScope pause(IsTraining());
  ir::Graph& g = tape->graph;
  ir::Graph::Mark mark = g.GetMark();
  size_t mark_nodes = mark.nodes;
  // Gradient nodes are not part of the forward record: drop them on every exit, errors included,
  // so a failed backward leaves the tape's graph as it was (the saved values it already spent
  // stay freed: a second try is refused as a second backward would be).
  struct RollbackGuard {
    ir::Graph& g;
    ir::Graph::Mark m;
    ~RollbackGuard() { g.Rollback(m); }
  } rollback{g, mark};
  std::vector<ir::Value*> ys, dys;
  std::vector<std::pair<ir::Value*, Tensor>> seeds;
  for (size_t i = 0; i < heads.size(); ++i) {
    const Tensor& h = heads[i];
    ys.push_back(h.impl()->autograd->value);
    Tensor hg = i < head_grads.size() ? head_grads[i] : Tensor();
    if (hg.defined()) {
      if (!(hg.shape() == h.shape()))
        KILN_THROW(ShapeError) << "backward: head gradient of shape " << hg.shape().str()
                               << " does not match the output's shape " << h.shape().str();
      if (hg.dtype() != h.dtype()) hg = hg.AsType(h.dtype());
    }  // else ones, made by the compiled backward or before the eager one runs
    ir::Value* dv = g.AddInput("head_grad", {h.shape(), h.dtype()});
    dys.push_back(dv);
    seeds.emplace_back(dv, hg);
  }
  if (!tape->spent.empty()) {  // a backward already ran through (part of) this computation
    std::vector<bool> from = passes::LiveNodes(g, ys);
    for (size_t i = 0; i < mark_nodes; ++i)
      if (from[i] && tape->spent.count(g.nodes()[i].get())) KILN_THROW(StateError) << kFreedMessage;
  }
  std::vector<ir::Value*> grads = passes::BuildGradients(g, ys, dys, xs);

  // Evaluate the appended nodes in order.
  std::unordered_map<const ir::Value*, Tensor> local;
  for (auto& [v, t] : seeds) local.emplace(v, t);
  auto lookup = [&](const ir::Value* v) -> const Tensor& {
    auto it = local.find(v);
    if (it != local.end()) return it->second;
    auto jt = tape->data.find(v);
    KILN_CHECK(jt != tape->data.end()) << "value %" << v->id() << " has no data on the tape";
    return jt->second;
  };
  // Only the gradient nodes the requested gradients depend on run (not, e.g., the gradient of a
  // convolution's data input).
  std::vector<ir::Value*> roots;
  for (ir::Value* gv : grads)
    if (gv) roots.push_back(gv);
  std::vector<bool> live = passes::LiveNodes(g, roots);
  for (size_t i = mark_nodes; i < g.nodes().size(); ++i)
    if (live[i])
      for (ir::Value* v : g.nodes()[i]->inputs())
        if (tape->freed.count(v)) KILN_THROW(StateError) << kFreedMessage;
  // A node without inputs (a constant fill) has no device of its own: heads on several devices
  // (one loss per device in data-parallel training) share one backward. It runs when first read,
  // on the device of the node that reads it, once per device.
  std::unordered_map<const ir::Value*, std::vector<Tensor>> per_device;
  auto constant = [&](const ir::Value* v, Device d) -> const Tensor& {
    std::vector<Tensor>& made = per_device[v];
    for (const Tensor& t : made)
      if (t.device() == d) return t;
    const ir::Node& c = *v->node();
    made.push_back(Invoke(c.op(), {}, c.attrs(), d)[static_cast<size_t>(v->index())]);
    return made.back();
  };
  auto deferred = [&](const ir::Value* v) {
    return !local.count(v) && !tape->data.count(v) && v->node() && v->node()->inputs().empty();
  };
  // Memory is given back as the backward goes, as PyTorch's does: a gradient once its last reader
  // ran (the requested ones stay), and, unless the graph is retained, a saved forward value once
  // the last gradient node that reads it ran (it is marked freed, as the end of this function
  // marks the rest: a second backward through it is refused, also after an error here).
  std::unordered_map<const ir::Value*, size_t> last_use;
  for (size_t i = mark_nodes; i < g.nodes().size(); ++i)
    if (live[i])
      for (ir::Value* v : g.nodes()[i]->inputs()) last_use[v] = i;
  std::unordered_set<const ir::Value*> keep(grads.begin(), grads.end());
  // The nodes the heads were computed from, and those that other recorded computations on this
  // tape also come from (two losses sharing a hidden layer): a later backward from those must
  // still find their values. Without retain_graph, the rest is spent by this backward.
  std::vector<bool> forward, shared;
  std::unordered_set<const ir::Value*> releasable;  // saved values this backward spends
  if (!retain_graph) {
    forward = passes::LiveNodes(g, ys);
    std::vector<ir::Value*> others;
    for (size_t i = 0; i < mark_nodes; ++i)
      if (!forward[i])
        for (ir::Value* v : g.nodes()[i]->outputs()) others.push_back(v);
    shared = passes::LiveNodes(g, others);
    for (size_t i = 0; i < mark_nodes; ++i)
      if (forward[i] && !shared[i])
        for (ir::Value* v : g.nodes()[i]->outputs()) releasable.insert(v);
  }
  // The gradient nodes write the leaves' gradients straight into their buffers (no copy, no
  // temporary to free after): the output of a node that is the gradient of exactly one x with a
  // buffer, of that buffer's type.
  std::unordered_map<const ir::Value*, Tensor> write_into;
  if (!into.empty()) {
    std::unordered_map<const ir::Value*, int> uses;
    for (ir::Value* gv : grads)
      if (gv) ++uses[gv];
    // A buffer the gradient nodes also read (a forward that used the gradient itself) is written
    // after the backward, as before: writing it early would change what they read.
    std::unordered_set<const Storage*> read;
    for (size_t j = mark_nodes; j < g.nodes().size(); ++j)
      if (live[j])
        for (const ir::Value* v : g.nodes()[j]->inputs())
          if (auto d = tape->data.find(v); d != tape->data.end()) read.insert(d->second.impl()->storage.get());
    for (const auto& [dv, hg] : seeds)
      if (hg.defined()) read.insert(hg.impl()->storage.get());
    for (size_t i = 0; i < into.size() && i < grads.size(); ++i) {
      const ir::Value* gv = grads[i];
      if (!into[i].defined() || !gv || uses[gv] != 1 || !gv->node() || gv->node()->inputs().empty() ||
          static_cast<size_t>(gv->node()->id()) < mark_nodes || !(into[i].shape() == gv->shape()) ||
          into[i].dtype() != gv->dtype() || !into[i].is_contiguous() || into[i].numel() == 0 ||
          read.count(into[i].impl()->storage.get()))
        continue;
      write_into.emplace(gv, into[i]);
    }
  }
  const bool compiled = RunCompiledBackward(g, mark_nodes, live, grads, seeds, *tape, write_into, releasable, local);
  for (size_t i = 0; i < seeds.size() && !compiled; ++i) {
    auto& [dv, hg] = seeds[i];
    if (hg.defined()) continue;
    const Tensor& h = heads[i];
    hg = Invoke1("full", {}, {{"shape", h.shape().vec()}, {"value", 1.0}, {"dtype", h.dtype()}}, h.device());
    local[dv] = hg;
  }
  for (size_t i = mark_nodes; i < g.nodes().size() && !compiled; ++i) {
    if (!live[i]) continue;
    const ir::Node& n = *g.nodes()[i];
    if (n.inputs().empty()) continue;  // a constant: made where it is read
    struct Release {  // after the node ran (or threw): what it read last
      size_t i;
      const ir::Node& n;
      std::unordered_map<const ir::Value*, size_t>& last_use;
      std::unordered_set<const ir::Value*>& keep;
      std::unordered_set<const ir::Value*>& releasable;
      std::unordered_map<const ir::Value*, Tensor>& local;
      Tape& tape;
      ~Release() {
        for (ir::Value* v : n.inputs()) {
          auto lu = last_use.find(v);
          if (lu == last_use.end() || lu->second != i || keep.count(v)) continue;
          if (local.erase(v)) continue;
          if (releasable.count(v) && tape.data.erase(v)) tape.freed.insert(v);
        }
      }
    } release{i, n, last_use, keep, releasable, local, *tape};
    std::optional<Device> dev;
    for (ir::Value* v : n.inputs())
      if (!deferred(v)) dev = dev ? dev : std::optional<Device>(lookup(v).device());
    std::vector<Tensor> in;
    for (ir::Value* v : n.inputs())
      in.push_back(deferred(v) ? constant(v, dev.value_or(heads[0].device())) : lookup(v));
    std::vector<Tensor> out;
    bool into_buffers = false;
    for (ir::Value* v : n.outputs()) into_buffers |= write_into.count(v) > 0;
    if (into_buffers) {
      // Outputs that are no buffer's: fresh tensors of the node's types on its inputs' device.
      const Device d = dev.value_or(heads[0].device());
      for (ir::Value* v : n.outputs()) {
        auto w = write_into.find(v);
        if (w != write_into.end() && w->second.device() == d) out.push_back(w->second);
        else out.push_back(Tensor::Empty(v->shape(), v->dtype(), d));
      }
      InvokeInto(n.op(), in, n.attrs(), out);
    } else {
      out = Invoke(n.op(), in, n.attrs(), std::nullopt);
    }
    for (size_t k = 0; k < out.size(); ++k) local.emplace(n.output(static_cast<int>(k)), out[k]);
  }
  std::vector<Tensor> result;
  for (size_t i = 0; i < grads.size(); ++i) {
    ir::Value* gv = grads[i];
    if (gv && deferred(gv)) {  // a constant gradient: made on its variable's device
      auto x = tape->data.find(xs[i]);
      result.push_back(constant(gv, x != tape->data.end() ? x->second.device() : heads[0].device()));
    } else {
      result.push_back(gv ? lookup(gv) : Tensor());
    }
  }
  if (!retain_graph) {
    // Release the values saved by the spent nodes (forward, not shared; computed above).
    // Graph inputs (leaves, data) stay.
    bool all = true;
    for (size_t i = 0; i < mark_nodes; ++i) {
      if (!forward[i] || shared[i]) {
        all = false;
        continue;
      }
      tape->spent.insert(g.nodes()[i].get());
      tape->graphs.erase(g.nodes()[i].get());
      for (ir::Value* v : g.nodes()[i]->outputs()) {
        tape->data.erase(v);
        tape->unsaved.erase(v);
        tape->freed.insert(v);
      }
    }
    // Recording goes on in a fresh tape if this one is spent and belongs to a still-open scope.
    if (all && tls_tape == tape) tls_tape = std::make_shared<Tape>();
  }
  return result;
}

std::shared_ptr<Tape> HeadsTape(const std::vector<Tensor>& heads) {
  if (heads.empty()) KILN_THROW(ValueError) << "backward: no output tensors were given";
  std::shared_ptr<Tape> tape;
  for (const Tensor& h : heads) {
    if (!OnTape(h) || IsLeaf(h))
      KILN_THROW(StateError) << "backward: this tensor was not computed under autograd.record() from "
                                "tensors that have gradients; call x.attach_grad() on the inputs and "
                                "compute the output inside `with autograd.record():`";
    if (tape && h.impl()->autograd->tape != tape)
      KILN_THROW(StateError) << "backward: the outputs were recorded in different autograd.record() "
                                "scopes; compute them in one scope";
    tape = h.impl()->autograd->tape;
  }
  for (const Tensor& h : heads) ValueOn(tape, h);  // a head written in place since: its current value
  return tape;
}

}  // namespace

void Backward(const std::vector<Tensor>& heads, const std::vector<Tensor>& head_grads, bool retain_graph) {
  std::shared_ptr<Tape> tape = HeadsTape(heads);
  std::vector<ir::Value*> xs;
  std::vector<std::shared_ptr<TensorImpl>> leaves;
  // Every leaf the heads were computed from, even if a later record scope has since used it too
  // (its meta then points at that tape, but this tape's value for it is still `v`). Leaves of
  // other computations on the tape (another device's loss) are left alone.
  std::unordered_set<const ir::Value*> used;
  {
    std::vector<ir::Value*> ys;
    for (const Tensor& h : heads) ys.push_back(h.impl()->autograd->value);
    std::vector<bool> live = passes::LiveNodes(tape->graph, ys);
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i])
        for (ir::Value* v : tape->graph.nodes()[i]->inputs()) used.insert(v);
  }
  for (auto& [v, w] : tape->leaves)
    if (auto impl = w.lock(); impl && impl->autograd && impl->autograd->req != GradReq::kNull && used.count(v)) {
      xs.push_back(const_cast<ir::Value*>(v));
      leaves.push_back(impl);
    }
  std::vector<Tensor> into;  // the buffers the gradient nodes may write directly
  {
    std::unordered_set<const TensorImpl*> seen;
    for (const auto& impl : leaves) {
      const AutogradMeta& m = *impl->autograd;
      const bool first = seen.insert(impl.get()).second;
      into.push_back(first && m.req == GradReq::kWrite && m.grad.defined() ? m.grad : Tensor());
    }
  }
  std::vector<Tensor> grads = Differentiate(heads, head_grads, xs, tape, retain_graph, into);
  PauseScope pause(IsTraining());  // writing the gradient buffers is no part of any record
  // A leaf written in place while recording has two graph inputs (see WriteIntoLeaf): the
  // gradients of the second and later ones are added to the first's.
  std::unordered_set<const TensorImpl*> done;
  for (size_t i = 0; i < leaves.size(); ++i) {
    AutogradMeta& m = *leaves[i]->autograd;
    Tensor g = grads[i];
    m.fresh = true;  // the heads used it: its gradient is written (zero where nothing flows back)
    const bool again = !done.insert(leaves[i].get()).second;
    if (!g.defined()) {
      if (m.req == GradReq::kWrite && !again) {
        Tensor outs[1] = {m.grad};
        InvokeInto(op::kFull, {}, {{"shape", m.grad.shape().vec()}, {"value", 0.0},
                                            {"dtype", m.grad.dtype()}}, outs);
      }
      continue;
    }
    if (m.req == GradReq::kWrite && !again) {
      if (g.impl() != m.grad.impl()) g.CopyTo(m.grad);  // else the gradient node wrote it there
    } else {
      Tensor gs[2] = {m.grad, g};
      Tensor outs[1] = {m.grad};
      InvokeInto(op::kAdd, gs, {}, outs);
    }
  }
}

bool GradFresh(const Tensor& t) { return t.impl()->autograd && t.impl()->autograd->fresh; }

void SetGradFresh(const Tensor& t, bool fresh) {
  AutogradMeta* m = t.impl()->autograd.get();
  if (!m || m->req == GradReq::kNull) {
    if (!fresh) return;
    KILN_THROW(StateError) << "this array has no gradient buffer to mark as written; call attach_grad() first";
  }
  m->fresh = fresh;
}

std::vector<Tensor> Grad(const std::vector<Tensor>& heads, const std::vector<Tensor>& variables,
                         const std::vector<Tensor>& head_grads, bool retain_graph) {
  std::shared_ptr<Tape> tape = HeadsTape(heads);
  std::vector<ir::Value*> xs;
  for (const Tensor& v : variables) {
    if (!v.impl()->autograd || v.impl()->autograd->tape != tape)
      KILN_THROW(StateError) << "grad: a variable was not used in the recorded computation; call "
                                "attach_grad() on it before recording";
    xs.push_back(v.impl()->autograd->value);
  }
  std::vector<Tensor> out = Differentiate(heads, head_grads, xs, tape, retain_graph);
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].defined()) out[i] = Invoke1("full", {}, {{"shape", variables[i].shape().vec()}, {"value", 0.0},
                                                         {"dtype", variables[i].dtype()}}, variables[i].device());
  return out;
}

}  // namespace autograd

// ---- Tensor's autograd methods -------------------------------------------------------------------

void Tensor::AttachGrad(GradReq req) {
  auto meta = std::make_shared<AutogradMeta>();
  meta->req = req;
  if (req != GradReq::kNull) {
    meta->grad = Invoke1("full", {}, {{"shape", shape().vec()}, {"value", 0.0}, {"dtype", dtype()}}, device());
  }
  impl_->autograd = std::move(meta);
}

Tensor Tensor::grad() const { return impl_->autograd ? impl_->autograd->grad : Tensor(); }
GradReq Tensor::grad_req() const { return impl_->autograd ? impl_->autograd->req : GradReq::kNull; }

void Tensor::Backward(const Tensor& head_grad, bool retain_graph) const {
  autograd::Backward({*this}, {head_grad}, retain_graph);
}

Tensor Tensor::Detach() const {
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->autograd.reset();
  return Tensor(std::move(impl));
}

}  // namespace kiln
