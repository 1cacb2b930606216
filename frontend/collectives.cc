// Tensor-level collectives among in-process devices (see include/kiln/frontend/collectives.h).
//
// Everything the user can get wrong is checked here, on the calling thread, with an error that
// names the device index and what differs. Then one engine task, queued on the comm queue of the
// first device, reads and writes the engine variables of every tensor of the call on every
// device and runs the buffer work of runtime/collectives.cc (CPU) or runtime/cuda/nccl.cc (GPU).
// The raw pointers are taken here; the task keeps the storages alive.
#include "kiln/frontend/collectives.h"

#include <algorithm>
#include <memory>
#include <string>

#include "kiln/frontend/call_site.h"
#include "kiln/frontend/tracer.h"
#include "kiln/runtime/collectives.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"

namespace kiln {

const char* ReduceOpName(ReduceOp op) { return coll::ReduceOpName(static_cast<coll::ReduceOp>(op)); }
ReduceOp ParseReduceOp(std::string_view name) { return static_cast<ReduceOp>(coll::ParseReduceOp(name)); }

namespace {

static_assert(static_cast<int>(ReduceOp::kMin) == static_cast<int>(coll::ReduceOp::kMin));

// ---- checks ------------------------------------------------------------------------------------

// One tensor of the call: defined, concrete, contiguous. `what` reads like "tensor 2 of device 1".
void CheckTensor(const char* op, const Tensor& t, const std::string& what) {
  if (!t.defined()) KILN_THROW(ValueError) << op << ": " << what << " is an undefined tensor";
  if (t.impl()->symbol) trace::ThrowSymbolicRead(op);
  if (!t.is_contiguous())
    KILN_THROW(ValueError) << op << ": " << what << " (shape " << t.shape().str()
                           << ") is a non-contiguous view; collectives work in place on contiguous memory: "
                              "pass a contiguous array (.copy()) and copy the result back";
}

// The devices of the call, in order: not empty, all CPU or all GPU, each once, existing.
std::vector<Device> CheckDevices(const char* op, std::span<const Device> devs) {
  if (devs.empty())
    KILN_THROW(ValueError) << op << ": empty list of devices; pass one entry per device (at least one)";
  for (size_t d = 0; d < devs.size(); ++d) {
    CheckDeviceExists(devs[d]);
    if (devs[d].type != devs[0].type)
      KILN_THROW(DeviceError) << op << ": entry " << d << " is on " << devs[d].str() << " but entry 0 is on "
                              << devs[0].str()
                              << "; one call reduces among CPU devices or among GPUs, not both "
                              << "(copy the data to one kind first)";
    for (size_t e = 0; e < d; ++e)
      if (devs[e] == devs[d])
        KILN_THROW(DeviceError) << op << ": entries " << e << " and " << d << " are both on " << devs[d].str()
                                << "; pass one entry per device (sum the arrays of one device first)";
  }
  return {devs.begin(), devs.end()};
}

void CheckDType(const char* op, const Tensor& t, DType want, const std::string& what,
                const std::string& ref) {
  if (t.dtype() != want)
    KILN_THROW(DTypeError) << op << ": " << what << " has dtype " << DTypeName(t.dtype()) << " but " << ref
                           << " has dtype " << DTypeName(want) << "; every device must hold the same dtype";
}

struct Range {
  const char* lo;
  const char* hi;
  std::string what;
};
Range RangeOf(const Tensor& t, std::string what) {
  const char* p = static_cast<const char*>(t.View().data);
  return {p, p + t.numel() * static_cast<int64_t>(DTypeSize(t.dtype())), std::move(what)};
}
// Tensors of one device that the task writes must not overlap each other or what it reads: two
// threads would write the same element, or read an element already overwritten.
void CheckDisjoint(const char* op, std::vector<Range> rs) {
  std::erase_if(rs, [](const Range& r) { return r.lo == r.hi; });
  std::sort(rs.begin(), rs.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  for (size_t i = 1; i < rs.size(); ++i)
    if (rs[i].lo < rs[i - 1].hi)
      KILN_THROW(ValueError) << op << ": " << rs[i - 1].what << " and " << rs[i].what
                             << " share memory; pass distinct arrays (each array once)";
}

std::string Of(size_t k, size_t d) {
  return "tensor " + std::to_string(k) + " of device " + std::to_string(d);
}
std::string Entry(const char* list, size_t d) { return std::string(list) + "[" + std::to_string(d) + "]"; }

// Checks groups (AllReduce, Broadcast) and builds the BufferSet; returns the devices.
std::vector<Device> CheckGroups(const char* op, std::span<const std::vector<Tensor>> groups,
                                coll::BufferSet* b) {
  if (groups.empty())
    KILN_THROW(ValueError) << op << ": empty list of device groups; pass one list of arrays per device";
  const size_t D = groups.size(), K = groups[0].size();
  if (K == 0) KILN_THROW(ValueError) << op << ": device 0 has no arrays; pass at least one array per device";
  std::vector<Device> devs;
  for (size_t d = 0; d < D; ++d) {
    if (groups[d].size() != K)
      KILN_THROW(ValueError) << op << ": device " << d << " has " << groups[d].size()
                             << " arrays but device 0 has " << K
                             << "; every device must hold the same list of arrays";
    for (size_t k = 0; k < K; ++k) CheckTensor(op, groups[d][k], Of(k, d));
    Device dev = groups[d][0].device();
    for (size_t k = 1; k < K; ++k)
      if (!(groups[d][k].device() == dev))
        KILN_THROW(DeviceError) << op << ": " << Of(k, d) << " is on " << groups[d][k].device().str()
                                << " but " << Of(0, d) << " is on " << dev.str()
                                << "; each group must live on one device";
    devs.push_back(dev);
  }
  devs = CheckDevices(op, devs);
  b->dtype = groups[0][0].dtype();
  for (size_t k = 0; k < K; ++k) {
    const Tensor& ref = groups[0][k];
    b->numel.push_back(ref.numel());
    if (k > 0) CheckDType(op, ref, b->dtype, Of(k, 0), Of(0, 0));
    for (size_t d = 1; d < D; ++d) {
      const Tensor& t = groups[d][k];
      if (t.shape() != ref.shape())
        KILN_THROW(ShapeError) << op << ": " << Of(k, d) << " has shape " << t.shape().str() << " but "
                               << Of(k, 0) << " has shape " << ref.shape().str()
                               << "; every device must hold the same shapes";
      CheckDType(op, t, ref.dtype(), Of(k, d), Of(k, 0));
    }
  }
  for (size_t d = 0; d < D; ++d) {
    std::vector<Range> rs;
    for (size_t k = 0; k < K; ++k) {
      rs.push_back(RangeOf(groups[d][k], Of(k, d)));
      b->ptrs.push_back(groups[d][k].View().data);
    }
    CheckDisjoint(op, std::move(rs));
  }
  return devs;
}

// Checks the paired lists of ReduceScatter / AllGather: one input and one output per device,
// output d on the device of input d, one dtype. Returns the devices.
std::vector<Device> CheckPairs(const char* op, std::span<const Tensor> in, std::span<const Tensor> out) {
  if (in.empty()) KILN_THROW(ValueError) << op << ": empty list of inputs; pass one array per device";
  if (in.size() != out.size())
    KILN_THROW(ValueError) << op << ": " << in.size() << " inputs but " << out.size()
                           << " outputs; pass one input and one output per device";
  std::vector<Device> devs;
  for (size_t d = 0; d < in.size(); ++d) {
    CheckTensor(op, in[d], Entry("inputs", d));
    CheckTensor(op, out[d], Entry("outputs", d));
    if (!(out[d].device() == in[d].device()))
      KILN_THROW(DeviceError) << op << ": outputs[" << d << "] is on " << out[d].device().str()
                              << " but inputs[" << d << "] is on " << in[d].device().str()
                              << "; each output lives on its input's device";
    devs.push_back(in[d].device());
  }
  devs = CheckDevices(op, devs);
  DType dt = in[0].dtype();
  for (size_t d = 0; d < in.size(); ++d) {
    if (d > 0) CheckDType(op, in[d], dt, Entry("inputs", d), "inputs[0]");
    CheckDType(op, out[d], dt, Entry("outputs", d), "inputs[0]");
  }
  return devs;
}

// in[d] and out[d] may not overlap, except in place: the smaller of the two (`part`, of the right
// size already) starting exactly at `at`, where its part of the bigger one begins.
void CheckPairDisjoint(const char* op, size_t d, const Tensor& in, const Tensor& out, const Tensor& part,
                       const char* at) {
  Range a = RangeOf(in, Entry("inputs", d)), b = RangeOf(out, Entry("outputs", d));
  if (a.lo == a.hi || b.lo == b.hi || a.hi <= b.lo || b.hi <= a.lo) return;
  if (part.View().data == at) return;
  KILN_THROW(ValueError) << op << ": inputs[" << d << "] and outputs[" << d
                         << "] share memory other than in place (where one is exactly part " << d
                         << " of the other); pass distinct arrays";
}

// ---- the task ----------------------------------------------------------------------------------

template <class Body>
void PushTask(const char* name, Device device, std::span<const Tensor> reads, std::span<const Tensor> writes,
              Body body) {
  std::vector<engine::Var*> r, w;
  std::vector<StoragePtr> keep;
  size_t bytes = 0;
  for (const Tensor& t : reads) r.push_back(t.storage()->var()), keep.push_back(t.storage());
  for (const Tensor& t : writes) {
    w.push_back(t.storage()->var()), keep.push_back(t.storage());
    bytes += static_cast<size_t>(t.numel()) * DTypeSize(t.dtype());
  }
  engine::TaskOptions opts;
  opts.device = device;
  opts.stream = engine::StreamKind::kComm;
  opts.name = name;
  opts.call_site = CurrentCallSite();
  opts.bytes = bytes;
  auto task = std::make_shared<std::pair<Body, std::vector<StoragePtr>>>(std::move(body), std::move(keep));
  engine::Engine::Get().Push([task] { task->first(); }, r, w, opts);
}

std::vector<Tensor> Flatten(std::span<const std::vector<Tensor>> groups) {
  std::vector<Tensor> all;
  for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
  return all;
}

std::vector<const void*> Ptrs(std::span<const Tensor> ts) {
  std::vector<const void*> p;
  for (const Tensor& t : ts) p.push_back(t.View().data);
  return p;
}
std::vector<void*> MutPtrs(std::span<const Tensor> ts) {
  std::vector<void*> p;
  for (const Tensor& t : ts) p.push_back(t.View().data);
  return p;
}

} // namespace

void AllReduce(std::span<const std::vector<Tensor>> groups, ReduceOp op) {
  coll::BufferSet b;
  std::vector<Device> devs = CheckGroups("allreduce", groups, &b);
  coll::CheckReducible("allreduce", b.dtype);
  if (groups.size() == 1) return; // every op of one device is the identity: no task
  std::vector<Tensor> all = Flatten(groups);
  auto cop = static_cast<coll::ReduceOp>(op);
  PushTask("allreduce", devs[0], all, all, [b = std::move(b), devs, cop] {
    if (devs[0].is_gpu())
      coll::NcclAllReduce(devs, b, cop);
    else
      coll::HostAllReduce(b, cop);
  });
}

void Broadcast(std::span<const std::vector<Tensor>> groups, int root) {
  coll::BufferSet b;
  std::vector<Device> devs = CheckGroups("broadcast", groups, &b);
  if (root < 0 || root >= static_cast<int>(groups.size()))
    KILN_THROW(ValueError) << "broadcast: root " << root << " is not a device of the call; expected 0 to "
                           << groups.size() - 1 << " (an index into the list of groups)";
  if (groups.size() == 1) return;
  std::vector<Tensor> all = Flatten(groups);
  std::span<const Tensor> src = groups[static_cast<size_t>(root)];
  PushTask("broadcast", devs[0], src, all, [b = std::move(b), devs, root] {
    if (devs[0].is_gpu())
      coll::NcclBroadcast(devs, b, root);
    else
      coll::HostBroadcast(b, root);
  });
}

void ReduceScatter(std::span<const Tensor> inputs, std::span<const Tensor> outputs, ReduceOp op) {
  const char* name = "reduce_scatter";
  std::vector<Device> devs = CheckPairs(name, inputs, outputs);
  const DType dt = inputs[0].dtype();
  coll::CheckReducible(name, dt);
  const int64_t n = inputs[0].numel();
  std::vector<int64_t> counts = coll::SplitCounts(n, static_cast<int>(inputs.size()));
  int64_t off = 0;
  for (size_t d = 0; d < inputs.size(); ++d) {
    if (inputs[d].numel() != n)
      KILN_THROW(ShapeError) << name << ": inputs[" << d << "] has " << inputs[d].numel()
                             << " elements (shape " << inputs[d].shape().str() << ") but inputs[0] has " << n
                             << " (shape " << inputs[0].shape().str()
                             << "); every device must hold the same number";
    if (outputs[d].numel() != counts[d])
      KILN_THROW(ShapeError) << name << ": outputs[" << d << "] has " << outputs[d].numel()
                             << " elements (shape " << outputs[d].shape().str() << ") but part " << d
                             << " of " << n << " elements over " << inputs.size() << " devices has "
                             << counts[d]
                             << " (np.array_split: the first n % devices parts are one element longer)";
    CheckPairDisjoint(name, d, inputs[d], outputs[d], outputs[d],
                      static_cast<const char*>(inputs[d].View().data) +
                          off * static_cast<int64_t>(DTypeSize(dt)));
    off += counts[d];
  }
  auto cop = static_cast<coll::ReduceOp>(op);
  PushTask(name, devs[0], inputs, outputs, [devs, dt, n, cop, in = Ptrs(inputs), out = MutPtrs(outputs)] {
    if (devs[0].is_gpu())
      coll::NcclReduceScatter(devs, dt, in, n, out, cop);
    else
      coll::HostReduceScatter(dt, in, n, out, cop);
  });
}

void AllGather(std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const char* name = "all_gather";
  std::vector<Device> devs = CheckPairs(name, inputs, outputs);
  const DType dt = inputs[0].dtype();
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const Tensor& t : inputs) counts.push_back(t.numel()), total += t.numel();
  int64_t off = 0;
  for (size_t d = 0; d < inputs.size(); ++d) {
    if (outputs[d].numel() != total)
      KILN_THROW(ShapeError) << name << ": outputs[" << d << "] has " << outputs[d].numel()
                             << " elements (shape " << outputs[d].shape().str()
                             << ") but the inputs add up to " << total
                             << "; each output holds every device's part, in device order";
    CheckPairDisjoint(name, d, inputs[d], outputs[d], inputs[d],
                      static_cast<const char*>(outputs[d].View().data) +
                          off * static_cast<int64_t>(DTypeSize(dt)));
    off += counts[d];
  }
  PushTask(name, devs[0], inputs, outputs, [devs, dt, counts, in = Ptrs(inputs), out = MutPtrs(outputs)] {
    if (devs[0].is_gpu())
      coll::NcclAllGather(devs, dt, in, counts, out);
    else
      coll::HostAllGather(dt, in, counts, out);
  });
}

} // namespace kiln
