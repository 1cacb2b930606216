// The kernel table (kernel.h). Op lookup by name (op_id.h) is in op_id.cc.
#include <mutex>
#include <string>
#include <unordered_map>

#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"

namespace kiln {

namespace {
struct Binders {
  std::mutex mu;
  std::vector<void (*)(KernelTable&)> fns;
  bool built = false;
};
Binders& GetBinders() {
  static Binders* b = new Binders();
  return *b;
}
}  // namespace

bool KernelTable::AddBinder(void (*bind)(KernelTable&)) {
  Binders& b = GetBinders();
  std::lock_guard<std::mutex> lock(b.mu);
  KILN_CHECK(!b.built) << "KernelTable::AddBinder after the table was built";
  b.fns.push_back(bind);
  return true;
}

const KernelTable& KernelTable::Get() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    BindElementwiseKernels(*t);
    BindReduceKernels(*t);
    BindMovementKernels(*t);
    BindNNKernels(*t);
    BindBatchNormKernels(*t);
    BindCreationKernels(*t);
    BindGpuBlasKernels(*t);
    BindGpuDnnKernels(*t);
    Binders& b = GetBinders();
    std::lock_guard<std::mutex> lock(b.mu);
    b.built = true;
    for (auto* bind : b.fns) bind(*t);
    return t;
  }();
  return *table;
}

const KernelBinding* KernelTable::Find(OpId op, DeviceType device) const {
  const auto& v = table_[static_cast<int>(device)];
  if (op >= v.size() || (!v[op].fn && !v[op].view)) return nullptr;
  return &v[op];
}

void KernelTable::Bind(OpId op, DeviceType device, KernelBinding binding) {
  KILN_CHECK(op < op::kNumOps) << "binding a kernel to op id " << op << ", which is no op";
  auto& v = table_[static_cast<int>(device)];
  if (v.size() < op::kNumOps) v.resize(op::kNumOps);
  KILN_CHECK(!v[op].fn) << "kernel for '" << OpName(op) << "' bound twice";
  v[op] = binding;
}

void KernelTable::Bind(std::string_view op, DeviceType device, KernelBinding binding) {
  std::optional<OpId> id = OpIdOf(op);
  KILN_CHECK(id) << "binding a kernel to '" << op << "', which is not in op_list.h";
  Bind(*id, device, binding);
}

}  // namespace kiln
