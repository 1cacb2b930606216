// Invoke: the eager path of every op (see dispatch.h).
#include "kiln/frontend/dispatch.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/passes/pass.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"

namespace kiln {

// ---- kernel table ------------------------------------------------------------------------------

const KernelTable& KernelTable::Get() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    BindElementwiseKernels(*t);
    BindReduceKernels(*t);
    BindMovementKernels(*t);
    BindNNKernels(*t);
    BindCreationKernels(*t);
    BindGraphKernels(*t);
    return t;
  }();
  return *table;
}

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

const KernelBinding* KernelTable::Find(ir::OpId op, DeviceType device) const {
  const auto& v = table_[static_cast<int>(device)];
  if (op >= v.size() || (!v[op].fn && !v[op].view)) return nullptr;
  return &v[op];
}

void KernelTable::Bind(std::string_view op, DeviceType device, KernelBinding binding) {
  ir::OpId id = ir::FindOp(op);
  auto& v = table_[static_cast<int>(device)];
  if (v.size() <= id) v.resize(ir::OpTable::Get().size());
  KILN_CHECK(!v[id].fn) << "kernel for '" << op << "' bound twice";
  v[id] = binding;
}

// ---- random generator state --------------------------------------------------------------------

namespace {
std::atomic<uint64_t> g_seed{static_cast<uint64_t>(env::GetInt("KILN_SEED"))};
std::atomic<uint64_t> g_offset{0};
thread_local const char* tls_call_site = nullptr;
std::atomic<size_t>& InlineLimit() {
  static std::atomic<size_t> limit{
      static_cast<size_t>(std::max<int64_t>(0, env::GetInt("KILN_ENGINE_INLINE_BYTES")))};
  return limit;
}

}  // namespace

size_t SetInlineLimit(size_t bytes) { return InlineLimit().exchange(bytes); }

void ManualSeed(uint64_t seed) {
  g_seed = seed;
  g_offset = 0;
}

void SetCallSite(const char* site) { tls_call_site = site; }

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

void Push(const ir::OpDef& def, const KernelBinding& kb, Device device, const ir::Attrs& attrs,
          std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  engine::Var* small[16];
  std::vector<engine::Var*> big;
  engine::Var** vars = small;
  if (inputs.size() + outputs.size() > 16) {
    big.resize(inputs.size() + outputs.size());
    vars = big.data();
  }
  size_t bytes = 0, in_bytes = 0, n = 0;
  for (const Tensor& t : inputs) {
    vars[n++] = t.storage()->var();
    in_bytes += static_cast<size_t>(t.numel()) * DTypeSize(t.dtype());
  }
  for (const Tensor& t : outputs) {
    vars[n++] = t.storage()->var();
    bytes += t.storage()->nbytes();
  }
  std::span<engine::Var* const> reads(vars, inputs.size()), writes(vars + inputs.size(), outputs.size());
  uint64_t seed = 0, offset = 0;
  if (def.random) {
    int64_t n = 0;
    if (def.random_numel) n = def.random_numel(attrs);
    else
      for (const Tensor& t : outputs) n += t.numel();
    seed = g_seed.load();
    offset = g_offset.fetch_add(static_cast<uint64_t>((n + 3) / 4 * 4));
  }
  engine::TaskOptions opts;
  opts.device = device;
  opts.name = def.name.c_str();
  opts.call_site = tls_call_site;
  opts.bytes = bytes;
  opts.may_run_inline = device.is_cpu() && in_bytes + bytes <= InlineLimit().load(std::memory_order_relaxed);
  // Everything the kernel needs travels in one block built here, on the pushing thread: the
  // views (so the worker does not chase TensorImpls this thread just wrote) and references to
  // the storages (so tensors themselves die where they were made). The closure is a single
  // pointer and fits std::function's inline buffer.
  // Up to kInline tensors live in the block itself (one allocation per op).
  constexpr size_t kInline = 3;
  struct Closure {
    KernelFn fn;
    const ir::OpDef* op;
    ir::Attrs attrs;
    Device device;
    uint64_t seed, offset;
    size_t n_in, n = 0;
    TensorView inline_views[kInline];
    StoragePtr inline_keep[kInline];
    std::vector<TensorView> views;  // all views, when more than kInline
    std::vector<StoragePtr> keep;
    void Add(const Tensor& t) {
      if (views.empty() && n < kInline) {
        inline_views[n] = t.View(), inline_keep[n] = t.storage();
      } else {
        if (views.empty()) views.assign(inline_views, inline_views + n);
        views.push_back(t.View()), keep.push_back(t.storage());
      }
      ++n;
    }
    std::span<const TensorView> All() const {
      return views.empty() ? std::span<const TensorView>(inline_views, n) : std::span<const TensorView>(views);
    }
  };
  auto c = std::make_shared<Closure>();
  c->fn = kb.fn, c->op = &def, c->attrs = attrs, c->device = device, c->seed = seed, c->offset = offset;
  c->n_in = inputs.size();
  for (const Tensor& t : inputs) c->Add(t);
  for (const Tensor& t : outputs) c->Add(t);
  engine::Engine::Get().Push(
      [c] {
        std::span<const TensorView> all = c->All();
        c->fn(KernelArgs{*c->op, all.first(c->n_in), all.subspan(c->n_in), c->attrs, c->device, c->seed,
                         c->offset});
      },
      reads, writes, opts);
}

const KernelBinding& FindKernel(const ir::OpDef& def, Device device) {
  const KernelBinding* kb = KernelTable::Get().Find(def.id, device.type);
  if (!kb)
    KILN_THROW(DeviceError) << def.name << ": no kernel for " << (device.is_cpu() ? "CPU" : "GPU")
                            << " devices in this build; run it on "
                            << (device.is_cpu() ? "a GPU" : "kiln.cpu()");
  return *kb;
}

}  // namespace

std::vector<Tensor> Invoke(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& given,
                           std::optional<Device> device) {
  const ir::OpDef& def = ir::GetOp(op);
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

  std::vector<Tensor> outputs;
  outputs.reserve(out_types.size());
  if (kb.view && inputs.size() == 1) {
    const Tensor& x = inputs[0];
    Layout in{x.offset(), x.shape(), x.strides()}, out;
    if (kb.view(in, attrs, out_types[0], &out)) {
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
  Push(def, kb, dev, attrs, args, outputs);
  if (autograd::NeedsRecord(inputs)) autograd::Record(op, attrs, inputs, outputs);
  return outputs;
}

std::vector<Tensor> Invoke(std::string_view op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                           std::optional<Device> device) {
  return Invoke(ir::FindOp(op), inputs, attrs, device);
}

Tensor Invoke1(std::string_view op, std::initializer_list<Tensor> inputs, const ir::Attrs& attrs,
               std::optional<Device> device) {
  std::vector<Tensor> out = Invoke(ir::FindOp(op), std::span<const Tensor>(inputs.begin(), inputs.size()),
                                   attrs, device);
  KILN_CHECK(out.size() == 1) << op << " has " << out.size() << " outputs; use Invoke";
  return out[0];
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
    for (int d = 0; d < outputs[i].rank(); ++d)
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
  Push(def, kb, dev, attrs, args, outs);
  for (auto& [tmp, dst] : copy_back) tmp.CopyTo(dst);
}

}  // namespace kiln
