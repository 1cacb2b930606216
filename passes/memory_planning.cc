// Memory planning (see kiln/passes/memory_planning.h): best-fit placement by liveness over free
// lists (one per stream when streams keep their own blocks), with in-place reuse.
#include "kiln/passes/memory_planning.h"

#include <map>

#include "kiln/runtime/error.h"

namespace kiln::passes {

size_t BlockBytes(DType dtype, int64_t numel) {
  return (static_cast<size_t>(numel) * DTypeSize(dtype) + 63) / 64 * 64;
}

MemoryPlan PlanMemory(std::span<const MemoryStep> steps, std::span<const MemoryValue> values,
                      const MemoryOptions& options) {
  MemoryPlan plan;
  plan.offset.assign(values.size(), -1);
  std::vector<int> last_reader(values.size());
  int num_streams = 1;
  for (size_t v = 0; v < values.size(); ++v) last_reader[v] = values[v].last_reader;
  for (const MemoryStep& s : steps) num_streams = std::max(num_streams, s.stream + 1);
  constexpr int kGone = -3;  // freed already, or handed to an in-place output
  std::vector<std::multimap<size_t, size_t>> free_lists(  // per stream: size -> offset
      static_cast<size_t>(options.per_stream ? num_streams : 1));
  auto bytes = [&](int v) { return BlockBytes(values[static_cast<size_t>(v)].dtype, values[static_cast<size_t>(v)].numel); };
  auto placed = [&](int v) { return plan.offset[static_cast<size_t>(v)] >= 0; };
  size_t end = 0;
  for (int step = 0; step < static_cast<int>(steps.size()); ++step) {
    const MemoryStep& s = steps[static_cast<size_t>(step)];
    std::multimap<size_t, size_t>& free_blocks = free_lists[options.per_stream ? static_cast<size_t>(s.stream) : 0];
    for (int o : s.writes) {
      const MemoryValue& out = values[static_cast<size_t>(o)];
      if (!out.planned || placed(o)) continue;
      size_t need = bytes(o);
      ++plan.intermediates, plan.unshared_bytes += need;
      // In place: an input of this step that dies here, of the output's dtype and size.
      int dying = -1;
      if (options.in_place && s.elementwise && s.writes.size() == 1)
        for (int v : s.reads) {
          const MemoryValue& in = values[static_cast<size_t>(v)];
          if (placed(v) && last_reader[static_cast<size_t>(v)] == step && in.dtype == out.dtype && in.numel == out.numel) {
            dying = v;
            break;
          }
        }
      if (dying >= 0) {
        plan.offset[static_cast<size_t>(o)] = plan.offset[static_cast<size_t>(dying)];
        last_reader[static_cast<size_t>(dying)] = kGone;  // its block now belongs to `o`
        ++plan.in_place;
        continue;
      }
      auto it = free_blocks.lower_bound(need);
      if (it != free_blocks.end()) {
        plan.offset[static_cast<size_t>(o)] = static_cast<int64_t>(it->second);
        if (it->first > need) free_blocks.emplace(it->first - need, it->second + need);
        free_blocks.erase(it);
      } else {
        plan.offset[static_cast<size_t>(o)] = static_cast<int64_t>(end);
        end += need;
      }
    }
    for (int v : s.reads)
      if (placed(v) && last_reader[static_cast<size_t>(v)] == step) {
        free_blocks.emplace(bytes(v), static_cast<size_t>(plan.offset[static_cast<size_t>(v)]));
        last_reader[static_cast<size_t>(v)] = kGone;  // freed once, even when the step reads it twice (a * a)
      }
    for (int o : s.writes)  // outputs nobody reads
      if (placed(o) && last_reader[static_cast<size_t>(o)] == MemoryValue::kNoReader) {
        free_blocks.emplace(bytes(o), static_cast<size_t>(plan.offset[static_cast<size_t>(o)]));
        last_reader[static_cast<size_t>(o)] = kGone;
      }
  }
  plan.arena_bytes = end;
  return plan;
}

}  // namespace kiln::passes
