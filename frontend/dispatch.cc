// Invoke: the eager path of every op (see dispatch.h).
#include "kiln/frontend/dispatch.h"
#if KILN_WITH_CODEGEN
#include "kiln/codegen/gpu_emulator.h"
#include "kiln/codegen/gpu_kernels.h"
#endif

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/call_site.h"
#include "kiln/frontend/tracer.h"
#include "kiln/passes/pass.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"

namespace kiln {

// ---- kernel table ------------------------------------------------------------------------------

// The runtime's table has the CPU kernels; the call_graph kernels are the frontend's.
namespace {
const bool kGraphKernelsAdded = KernelTable::AddBinder(&BindGraphKernels);
#if KILN_WITH_CODEGEN
// Simulated GPUs (KILN_GPU_SIM) run kernels' NVPTX IR through codegen's emulator. This file is
// linked into every program that dispatches an op, so the hook is always in place.
const bool kGpuEmulatorInstalled = (codegen::InstallGpuEmulator(), true);
// The GPU kernels codegen generates (the elementwise ops).
const bool kGpuElementwiseAdded = KernelTable::AddBinder(&codegen::BindGpuElementwiseKernels);
#endif
}  // namespace

// ---- constant folding's evaluator -----------------------------------------------------------------

namespace {

// Runs elementwise node `n`'s CPU kernel on one element per input (passes::ScalarEvaluator), so
// that a folded constant is bit for bit what running the node gives.
std::optional<double> EvalScalar(const ir::Node& n, std::span<const double> in) {
  const KernelBinding* kb = KernelTable::Get().Find(n.op(), DeviceType::kCPU);
  if (!kb || !kb->fn || n.outputs().size() != 1 || in.size() != n.inputs().size() || in.size() > 3) return std::nullopt;
  alignas(16) unsigned char bytes[5][16] = {};  // three inputs, the output, and its re-encoding
  std::vector<TensorView> ins;
  for (size_t k = 0; k < in.size(); ++k) {
    ins.push_back(TensorView{bytes[k], n.input(static_cast<int>(k))->dtype(), Shape{}, Strides{}});
    host::Fill(ins.back(), in[k]);  // as the `full` kernel writes it
  }
  TensorView out{bytes[3], n.output()->dtype(), Shape{}, Strides{}};
  try {
    kb->fn(KernelArgs{n.def(), ins, std::span<const TensorView>(&out, 1), n.attrs(), cpu()});
  } catch (const std::exception&) {  // e.g. an integer division by zero: left to fail when run
    return std::nullopt;
  }
  double r = 0;
  KILN_DISPATCH_ALL(out.dtype, r = static_cast<double>(static_cast<compute_t<scalar_t>>(*out.ptr<scalar_t>())));
  // A `full` of r must write exactly these bytes (an int64 beyond 2^53 would not).
  TensorView again{bytes[4], out.dtype, Shape{}, Strides{}};
  host::Fill(again, r);
  if (std::memcmp(bytes[3], bytes[4], DTypeSize(out.dtype)) != 0) return std::nullopt;
  return r;
}

// Installed before main: any pipeline that runs sees it (this file is part of every kiln program).
const bool kScalarEvaluatorInstalled = (passes::SetScalarEvaluator(&EvalScalar), true);

}  // namespace

// ---- random generator state --------------------------------------------------------------------

namespace {
std::atomic<uint64_t> g_seed{static_cast<uint64_t>(env::GetInt("KILN_SEED"))};
std::atomic<uint64_t> g_offset{0};
// A thread's own generator, once it called ManualSeed(seed, /*this_thread=*/true).
struct ThreadGenerator {
  bool own = false;
  uint64_t seed = 0, offset = 0;
};
thread_local ThreadGenerator tls_generator;
thread_local const char* tls_call_site = nullptr;
std::atomic<CallSiteProvider> g_call_site_provider{nullptr};
std::atomic<size_t>& InlineLimit() {
  static std::atomic<size_t> limit{
      static_cast<size_t>(std::max<int64_t>(0, env::GetInt("KILN_ENGINE_INLINE_BYTES")))};
  return limit;
}

}  // namespace

size_t SetInlineLimit(size_t bytes) { return InlineLimit().exchange(bytes); }

namespace {
// Set by RandomReservationScope: the next random op this thread pushes draws from it.
thread_local const RandomReservation* tls_reserved = nullptr;
}  // namespace

RandomReservation ReserveRandom(uint64_t draws) {
  draws = (draws + 3) / 4 * 4;
  if (tls_generator.own) {
    RandomReservation r{tls_generator.seed, tls_generator.offset};
    tls_generator.offset += draws;
    return r;
  }
  return {g_seed.load(), g_offset.fetch_add(draws)};
}

RandomReservationScope::RandomReservationScope(const RandomReservation* r) : old_(tls_reserved) {
  tls_reserved = r;
}
RandomReservationScope::~RandomReservationScope() { tls_reserved = old_; }

void ManualSeed(uint64_t seed, bool this_thread) {
  if (this_thread) {
    tls_generator = {true, seed, 0};
    return;
  }
  g_seed = seed;
  g_offset = 0;
}

void SetCallSite(const char* site) { tls_call_site = site; }

void SetCallSiteProvider(CallSiteProvider provider) { g_call_site_provider.store(provider); }

const char* CurrentCallSite() {
  if (tls_call_site) return tls_call_site;
  CallSiteProvider provider = g_call_site_provider.load(std::memory_order_relaxed);
  return provider ? provider() : nullptr;
}

// ---- invoke ------------------------------------------------------------------------------------

namespace {

Device CommonDevice(const ir::OpDef& def, std::span<const Tensor> inputs, std::optional<Device> device) {
  if (inputs.empty()) {
    Device d = device.value_or(cpu());
    CheckDeviceExists(d);
    return d;
  }
  Device d = inputs[0].device();
  for (size_t i = 1; i < inputs.size(); ++i)
    if (!(inputs[i].device() == d))
      KILN_THROW(DeviceError) << def.name << ": inputs are on different devices (input 0 on "
                              << d.str() << ", input " << i << " on " << inputs[i].device().str()
                              << "); move them to one device with copyto() or as_in_context()";
  if (device && !(*device == d))
    KILN_THROW(DeviceError) << def.name << ": inputs are on " << d.str() << " but the op was asked "
                            << "to run on " << device->str();
  return d;
}

// The inputs as the kernel needs them: `in` itself, unless the kernel wants contiguous inputs and
// one is strided (then contiguous copies are queued into `scratch`).
std::span<const Tensor> KernelInputs(const KernelBinding& kb, std::span<const Tensor> in,
                                     std::vector<Tensor>& scratch) {
  if (!kb.contiguous_inputs) return in;
  bool all = true;
  for (const Tensor& t : in) all &= t.is_contiguous();
  if (all) return in;
  scratch.assign(in.begin(), in.end());
  for (Tensor& t : scratch)
    if (!t.is_contiguous()) t = t.Contiguous();
  return scratch;
}

// Views of the tensors a task touches and references to their storages, built on the pushing
// thread: the worker does not chase TensorImpls this thread just wrote, and the tensors themselves
// die where they were made. Up to kInline tensors live in the block itself.
class TaskTensors {
 public:
  static constexpr size_t kInline = 3;
  void Add(const Tensor& t) {
    if (views_.empty() && n_ < kInline) {
      new (&inline_views_[n_]) TensorView(t.View());  // built in place (TensorView is trivial)
      inline_keep_[n_] = t.storage();
    } else {
      if (views_.empty()) views_.assign(inline_views_, inline_views_ + n_);
      views_.push_back(t.View()), keep_.push_back(t.storage());
    }
    ++n_;
  }
  std::span<const TensorView> All() const {
    if (views_.empty()) return {inline_views_, n_};
    return views_;
  }

 private:
  size_t n_ = 0;
  TensorView inline_views_[kInline];
  StoragePtr inline_keep_[kInline];
  std::vector<TensorView> views_;  // all views, when more than kInline
  std::vector<StoragePtr> keep_;
};

// Everything the kernel needs, in one block. It is the task's function object itself, moved into
// std::function's one allocation: no separate shared block whose count each copy would bump.
struct KernelTask {
  KernelFn fn;
  const ir::OpDef* op;
  ir::Attrs attrs;
  Device device;
  uint64_t seed, offset;
  size_t n_in;
  TaskTensors tensors;
  void operator()() const {
    std::span<const TensorView> all = tensors.All();
    fn(KernelArgs{*op, all.first(n_in), all.subspan(n_in), attrs, device, seed, offset});
  }
};

// Queues the kernel of `def` on `inputs` writing `outputs` (tensors by pointer: the small-op path
// holds no Tensor copies).
void Push(const ir::OpDef& def, const KernelBinding& kb, Device device, const ir::Attrs& attrs,
          std::span<const Tensor* const> inputs, std::span<const Tensor* const> outputs) {
  engine::Var* small[16];
  std::vector<engine::Var*> big;
  engine::Var** vars = small;
  if (inputs.size() + outputs.size() > 16) {
    big.resize(inputs.size() + outputs.size());
    vars = big.data();
  }
  size_t bytes = 0, in_bytes = 0, n = 0;
  for (const Tensor* t : inputs) {
    vars[n++] = t->storage()->var();
    in_bytes += static_cast<size_t>(t->numel()) * DTypeSize(t->dtype());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor* t = outputs[i];
    vars[n++] = t->storage()->var();
    bool counted = false;  // views of one block (a compiled call's saved values): its bytes once
    for (size_t j = 0; j < i && !counted; ++j) counted = outputs[j]->storage() == t->storage();
    if (!counted) bytes += t->storage()->nbytes();
  }
  std::span<engine::Var* const> reads(vars, inputs.size()), writes(vars + inputs.size(), outputs.size());
  uint64_t seed = 0, offset = 0;
  if (def.random) {
    int64_t n = 0;
    if (def.random_numel) n = def.random_numel(attrs);
    else
      for (const Tensor* t : outputs) n += t->numel();
    RandomReservation r = tls_reserved ? *tls_reserved : ReserveRandom(static_cast<uint64_t>(n));
    tls_reserved = nullptr;  // one op's
    seed = r.seed, offset = r.offset;
  }
  engine::TaskOptions opts;
  opts.device = device;
  opts.name = def.name.c_str();
  opts.call_site = CurrentCallSite();
  opts.bytes = bytes;
  opts.may_run_inline = device.is_cpu() && in_bytes + bytes <= InlineLimit().load(std::memory_order_relaxed);
  auto make = [&] {
    KernelTask k{kb.fn, &def, attrs, device, seed, offset, inputs.size(), {}};
    for (const Tensor* t : inputs) k.tensors.Add(*t);
    for (const Tensor* t : outputs) k.tensors.Add(*t);
    return k;
  };
  engine::Engine::Get().Push(std::function<void()>(make()), reads, writes, opts);
}

// Pointers to the tensors of a span (the general path's inputs and outputs).
struct TensorPtrs {
  explicit TensorPtrs(std::span<const Tensor> ts) {
    if (ts.size() > 8) big.resize(ts.size());
    const Tensor** p = ts.size() > 8 ? big.data() : small;
    for (size_t i = 0; i < ts.size(); ++i) p[i] = &ts[i];
    span = {p, ts.size()};
  }
  const Tensor* small[8];
  std::vector<const Tensor*> big;
  std::span<const Tensor* const> span;
};

/// DTypeError when `kb` does not take the dtypes of `inputs` and of `outputs` (tensors or
/// inferred types: what it would write); says which operand, what the kernel takes, and what to do.
DType DTypeOf(const Tensor& t) { return t.dtype(); }
DType DTypeOf(const ir::TensorType& t) { return t.dtype; }

template <class Outputs>
void CheckKernelDTypes(const ir::OpDef& def, const KernelBinding& kb, Device device, std::span<const Tensor> inputs,
                       const Outputs& outputs) {
  if (!kb.dtypes) return;
  auto refuse = [&](const char* what, size_t i, DType t) {
    std::string takes;
    for (int d = 0; d < 32; ++d)
      if (kb.dtypes & (uint32_t{1} << d)) takes += (takes.empty() ? "" : ", ") + std::string(DTypeName(static_cast<DType>(d)));
    KILN_THROW(DTypeError) << def.name << ": the " << (device.is_cpu() ? "CPU" : "GPU") << " kernel takes " << takes
                           << " only; " << what << " " << i << " is " << DTypeName(t) << ". "
                           << (std::string(what) == "input" ? "Cast it (astype) or run" : "Run") << " the op on "
                           << (device.is_cpu() ? "a GPU" : "kiln.cpu()");
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!(kb.dtypes & DTypeBit(inputs[i].dtype()))) refuse("input", i, inputs[i].dtype());
  for (size_t i = 0; i < outputs.size(); ++i)
    if (!(kb.dtypes & DTypeBit(DTypeOf(outputs[i])))) refuse("output", i, DTypeOf(outputs[i]));
}

const KernelBinding& FindKernel(const ir::OpDef& def, Device device) {
  const KernelBinding* kb = KernelTable::Get().Find(def.id, device.type);
  if (!kb)
    KILN_THROW(DeviceError) << def.name << ": no kernel for " << (device.is_cpu() ? "CPU" : "GPU")
                            << " devices in this build; run it on "
                            << (device.is_cpu() ? "a GPU" : "kiln.cpu()");
  return *kb;
}

// ---- the small-op path -----------------------------------------------------------------------
// Most eager calls from Python are elementwise ops without attributes on operands of one shape,
// dtype and device (a + b, x * y, relu(x), x * 2 with the scalar as a 0-d tensor). Their output has
// the inputs' shape (a 0-d operand of a broadcasting op broadcasts to it) and a dtype that depends
// on the input dtype alone, so the dtype is learned from the op's own inference the first time
// (op, dtype) goes through the general path with equal shapes, and read from a table afterwards:
// no inference call, no vectors, no Tensor copies. Everything else (other broadcasting, mixed
// dtypes or devices, attributes, tracing, symbolic inputs, view kernels, strided inputs to kernels
// that want contiguous ones) takes the general path, which raises the errors. Autograd records as
// there.
class SameShapeTable {
 public:
  static constexpr int8_t kUnknown = -1, kNever = -2;
  static SameShapeTable& Get() {
    static SameShapeTable* t = new SameShapeTable();  // leaked: used by engine tasks at exit
    return *t;
  }
  /// The output dtype of `op` on inputs of dtype `in` and one shape, or a negative value.
  int8_t Find(ir::OpId op, DType in) const { return Entry(op, in).load(std::memory_order_relaxed); }
  /// Records what inference said for a call whose inputs all had dtype `in` and one shape.
  void Learn(ir::OpId op, DType in, DType out) {
    std::atomic<int8_t>& e = Entry(op, in);
    if (e.load(std::memory_order_relaxed) == kUnknown) e.store(static_cast<int8_t>(out), std::memory_order_relaxed);
  }

 private:
  SameShapeTable() {
    const ir::OpTable& ops = ir::OpTable::Get();
    out_.reset(new std::atomic<int8_t>[ops.size() * kNumDTypes]);
    for (size_t i = 0; i < ops.size(); ++i) {
      const ir::OpDef& d = ops[static_cast<ir::OpId>(i)];
      bool ok = (d.fusion == ir::FusionKind::kElementwise || d.fusion == ir::FusionKind::kBroadcast) &&
                d.attrs.empty() && !d.random && d.num_outputs == 1 && d.num_inputs >= 1 &&
                d.num_inputs <= kMaxInputs;
      for (int k = 0; k < kNumDTypes; ++k) out_[i * kNumDTypes + k].store(ok ? kUnknown : kNever);
    }
  }
  std::atomic<int8_t>& Entry(ir::OpId op, DType in) const {
    return out_[static_cast<size_t>(op) * kNumDTypes + static_cast<size_t>(in)];
  }
  static constexpr int kMaxInputs = 3;
  std::unique_ptr<std::atomic<int8_t>[]> out_;
};

// Teaches the table from a general-path call (see above).
void LearnSameShape(const ir::OpDef& def, std::span<const Tensor> in, const ir::Attrs& attrs,
                    std::span<const ir::TensorType> out) {
  if (in.empty() || !attrs.empty() || out.size() != 1) return;
  for (const Tensor& t : in)
    if (t.dtype() != in[0].dtype() || !(t.shape() == in[0].shape())) return;
  if (!(out[0].shape == in[0].shape())) return;
  SameShapeTable& table = SameShapeTable::Get();
  table.Learn(def.id, in[0].dtype(), out[0].dtype);
}

// The small-op path; an undefined tensor means "take the general path".
Tensor TrySameShape(const ir::OpDef& def, std::span<const Tensor* const> in) {
  if (in.empty() || static_cast<int>(in.size()) != def.num_inputs) return Tensor();  // arity: general path
  const TensorImpl* x = in[0]->impl();
  if (!x || x->symbol) return Tensor();
  int8_t out = SameShapeTable::Get().Find(def.id, x->dtype);
  if (out < 0) return Tensor();
  Device dev = x->storage->device();
  const Shape* shape = &x->shape;
  bool broadcast = def.fusion == ir::FusionKind::kBroadcast;
  for (size_t i = 1; i < in.size(); ++i) {
    const TensorImpl* y = in[i]->impl();
    if (!y || y->symbol || y->dtype != x->dtype || !(y->storage->device() == dev)) return Tensor();
    if (y->shape == *shape) continue;
    if (!broadcast) return Tensor();
    if (y->shape.rank() == 0) continue;  // a 0-d operand broadcasts to any shape
    if (shape->rank() != 0) return Tensor();  // else every earlier operand was 0-d
    shape = &y->shape;
  }
  if (trace::Active()) return Tensor();
  const KernelBinding* kb = KernelTable::Get().Find(def.id, dev.type);
  if (!kb || !kb->fn || kb->view) return Tensor();
  if (kb->dtypes && (!(kb->dtypes & DTypeBit(x->dtype)) || !(kb->dtypes & DTypeBit(static_cast<DType>(out)))))
    return Tensor();  // the general path refuses it
  if (kb->contiguous_inputs)
    for (const Tensor* t : in)
      if (!t->is_contiguous()) return Tensor();
  Tensor result = Tensor::Empty(*shape, static_cast<DType>(out), dev);
  const Tensor* outs[1] = {&result};
  static const ir::Attrs kNoAttrs;
  Push(def, *kb, dev, kNoAttrs, in, outs);
  if (autograd::IsRecording()) {
    Tensor copies[3];
    for (size_t i = 0; i < in.size(); ++i) copies[i] = *in[i];
    std::span<const Tensor> ins(copies, in.size());
    if (autograd::NeedsRecord(ins)) autograd::Record(def.id, kNoAttrs, ins, {&result, 1});
  }
  return result;
}

}  // namespace

std::vector<Tensor> Invoke(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& given,
                           std::optional<Device> device) {
  const ir::OpDef& def = ir::GetOp(op);
  if (given.empty() && !device && inputs.size() <= 3) {
    TensorPtrs in(inputs);
    if (Tensor t = TrySameShape(def, in.span); t.defined()) return {std::move(t)};
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined())
      KILN_THROW(ValueError) << def.name << ": input " << i << " is an undefined tensor";
  ir::Attrs attrs = def.attrs.empty() && given.empty() ? ir::Attrs() : def.Resolve(given);
  if (trace::Active()) return trace::RecordOp(op, inputs, attrs, device);  // hybridize: record, don't run
  for (const Tensor& t : inputs)
    if (t.impl()->symbol) trace::ThrowSymbolicRead(def.name.c_str());  // kept from a trace: it has no data
  Device dev = CommonDevice(def, inputs, device);

  ir::TensorType in_types[16];
  std::vector<ir::TensorType> big;
  std::span<const ir::TensorType> types;
  if (inputs.size() <= 16) {
    for (size_t i = 0; i < inputs.size(); ++i) in_types[i] = {inputs[i].shape(), inputs[i].dtype()};
    types = {in_types, inputs.size()};
  } else {
    for (const Tensor& t : inputs) big.push_back({t.shape(), t.dtype()});
    types = big;
  }
  std::vector<ir::TensorType> out_types = def.Infer(types, attrs);
  const KernelBinding& kb = FindKernel(def, dev);
  CheckKernelDTypes(def, kb, dev, inputs, out_types);
  LearnSameShape(def, inputs, attrs, out_types);

  std::vector<Tensor> outputs;
  outputs.reserve(out_types.size());
  if (kb.view && inputs.size() == 1) {
    const Tensor& x = inputs[0];
    Layout in{x.offset(), x.shape(), x.strides()}, out;
    if (kb.view(in, attrs, out_types[0].shape, &out)) {
      auto impl = std::make_shared<TensorImpl>();
      impl->storage = x.storage();
      impl->offset = out.offset;
      impl->shape = out.shape;
      impl->strides = out.strides;
      impl->dtype = out_types[0].dtype;
      outputs.emplace_back(std::move(impl));
      if (autograd::NeedsRecord(inputs)) autograd::Record(op, attrs, inputs, outputs);
      return outputs;
    }
  }
  KILN_CHECK(kb.fn) << def.name << " has a view but no copying kernel";

  std::vector<Tensor> scratch;
  std::span<const Tensor> args = KernelInputs(kb, inputs, scratch);
  for (const ir::TensorType& t : out_types) outputs.push_back(Tensor::Empty(t.shape, t.dtype, dev));
  Push(def, kb, dev, attrs, TensorPtrs(args).span, TensorPtrs(outputs).span);
  if (autograd::NeedsRecord(inputs)) autograd::Record(op, attrs, inputs, outputs);
  return outputs;
}

std::vector<Tensor> Invoke(std::string_view op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                           std::optional<Device> device) {
  return Invoke(ir::FindOp(op), inputs, attrs, device);
}

Tensor Invoke1(std::string_view op, std::initializer_list<Tensor> inputs, const ir::Attrs& attrs,
               std::optional<Device> device) {
  std::span<const Tensor> in(inputs.begin(), inputs.size());
  if (!device) return Invoke1(ir::FindOp(op), TensorPtrs(in).span, attrs);
  std::vector<Tensor> out = Invoke(ir::FindOp(op), in, attrs, device);
  KILN_CHECK(out.size() == 1) << op << " has " << out.size() << " outputs; use Invoke";
  return std::move(out[0]);
}

Tensor Invoke1(ir::OpId op, std::span<const Tensor* const> inputs, const ir::Attrs& attrs) {
  const ir::OpDef& def = ir::GetOp(op);
  if (attrs.empty())
    if (Tensor t = TrySameShape(def, inputs); t.defined()) return t;
  Tensor small[4];
  std::vector<Tensor> big;
  std::span<const Tensor> in;
  if (inputs.size() <= 4) {
    for (size_t i = 0; i < inputs.size(); ++i) small[i] = *inputs[i];
    in = {small, inputs.size()};
  } else {
    for (const Tensor* t : inputs) big.push_back(*t);
    in = big;
  }
  std::vector<Tensor> out = Invoke(op, in, attrs);
  KILN_CHECK(out.size() == 1) << def.name << " has " << out.size() << " outputs; use Invoke";
  return std::move(out[0]);
}

void InvokeInto(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& given,
                std::span<const Tensor> outputs) {
  const ir::OpDef& def = ir::GetOp(op);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined()) KILN_THROW(ValueError) << def.name << ": input " << i << " is an undefined tensor";
  if (outputs.empty()) KILN_THROW(ValueError) << def.name << ": InvokeInto needs the output tensors to write";
  for (size_t i = 0; i < outputs.size(); ++i)
    if (!outputs[i].defined()) KILN_THROW(ValueError) << def.name << ": output " << i << " is an undefined tensor";
  ir::Attrs attrs = def.attrs.empty() && given.empty() ? ir::Attrs() : def.Resolve(given);
  if (trace::Active()) {
    std::vector<Tensor> out = trace::RecordOp(op, inputs, attrs, outputs[0].device());
    for (size_t i = 0; i < out.size() && i < outputs.size(); ++i) trace::RecordAssign(out[i], outputs[i]);
    return;
  }
  for (const Tensor& t : inputs)
    if (t.impl()->symbol) trace::ThrowSymbolicRead(def.name.c_str());
  for (const Tensor& t : outputs)
    if (t.impl()->symbol) trace::ThrowSymbolicRead(def.name.c_str());
  Device dev = CommonDevice(def, inputs, inputs.empty() ? std::optional<Device>(outputs[0].device())
                                                        : std::nullopt);
  std::vector<ir::TensorType> types;
  for (const Tensor& t : inputs) types.push_back({t.shape(), t.dtype()});
  std::vector<ir::TensorType> out_types = def.Infer(types, attrs);
  if (out_types.size() != outputs.size())
    KILN_THROW(ValueError) << def.name << ": expected " << out_types.size() << " output tensor(s), found "
                           << outputs.size();
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!(outputs[i].shape() == out_types[i].shape) || outputs[i].dtype() != out_types[i].dtype)
      KILN_THROW(ShapeError) << def.name << ": output " << i << " must be "
                             << DTypeName(out_types[i].dtype) << out_types[i].shape.str() << ", found "
                             << DTypeName(outputs[i].dtype()) << outputs[i].shape().str();
    for (int d = 0; d < outputs[i].rank() && outputs[i].numel() > 0; ++d)  // an empty one has nothing to overlap
      if (outputs[i].strides()[d] == 0 && outputs[i].shape()[d] > 1)
        KILN_THROW(ValueError) << def.name << ": output " << i << " is a broadcast view (shape "
                               << outputs[i].shape().str() << " with a zero stride): its elements overlap "
                               << "and cannot be written; write into a contiguous tensor instead";
    if (!(outputs[i].device() == dev))
      KILN_THROW(DeviceError) << def.name << ": output " << i << " is on " << outputs[i].device().str()
                              << " but the inputs are on " << dev.str();
  }
  const KernelBinding& kb = FindKernel(def, dev);
  KILN_CHECK(kb.fn) << def.name;
  CheckKernelDTypes(def, kb, dev, inputs, outputs);
  std::vector<Tensor> scratch;
  std::span<const Tensor> args = KernelInputs(kb, inputs, scratch);
  // Kernels write contiguous outputs; a strided destination gets a contiguous temporary.
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  std::vector<std::pair<Tensor, Tensor>> copy_back;
  for (Tensor& o : outs)
    if (!o.is_contiguous()) {
      Tensor tmp = Tensor::Empty(o.shape(), o.dtype(), dev);
      copy_back.emplace_back(tmp, o);
      o = tmp;
    }
  Push(def, kb, dev, attrs, TensorPtrs(args).span, TensorPtrs(outs).span);
  for (auto& [tmp, dst] : copy_back) tmp.CopyTo(dst);
}

}  // namespace kiln
