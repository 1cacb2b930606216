// Memory planning (see kiln/passes/memory_planning.h): best-fit placement by liveness over free
// lists (one per stream when streams keep their own blocks), with in-place reuse; and the pass that
// runs it over a graph's nodes and records the offsets as the values' notes.
#include "kiln/passes/memory_planning.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>

#include "kiln/passes/fusion.h"
#include "kiln/passes/graph_steps.h"
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
  constexpr int kGone = -3;                              // freed already, or handed to an in-place output
  // Free blocks, per stream: by size (best fit) and by offset (neighbours merge when freed, so
  // two freed halves serve a whole block again).
  struct FreeList {
    std::multimap<size_t, size_t> by_size;  // size -> offset
    std::map<size_t, size_t> by_offset;     // offset -> size
    void Erase(std::map<size_t, size_t>::iterator at) {
      auto [lo, hi] = by_size.equal_range(at->second);
      for (auto it = lo; it != hi; ++it)
        if (it->second == at->first) {
          by_size.erase(it);
          break;
        }
      by_offset.erase(at);
    }
    void Add(size_t offset, size_t size) {
      if (size == 0) return;  // a zero-element value holds no block
      auto next = by_offset.lower_bound(offset);
      if (next != by_offset.end() && offset + size == next->first) {
        size += next->second;
        Erase(next);
      }
      auto prev = by_offset.lower_bound(offset);
      if (prev != by_offset.begin() && (--prev, prev->first + prev->second == offset)) {
        offset = prev->first, size += prev->second;
        Erase(prev);
      }
      by_offset.emplace(offset, size);
      by_size.emplace(size, offset);
    }
    // A block of `need` bytes: the smallest free one that holds it, else the free block at the
    // arena's end grown (returns its offset and the growth), else none.
    std::optional<size_t> Take(size_t need, size_t& end) {
      if (need == 0) return 0;  // a zero-element value: any offset, no block
      if (auto it = by_size.lower_bound(need); it != by_size.end()) {
        const size_t size = it->first, offset = it->second;
        Erase(by_offset.find(offset));
        if (size > need) Add(offset + need, size - need);
        return offset;
      }
      if (!by_offset.empty()) {
        auto last = std::prev(by_offset.end());
        if (last->first + last->second == end) {
          const size_t offset = last->first;
          end = offset + need;
          Erase(last);
          return offset;
        }
      }
      return std::nullopt;
    }
  };
  std::vector<FreeList> free_lists(static_cast<size_t>(options.per_stream ? num_streams : 1));
  auto bytes = [&](int v) {
    return BlockBytes(values[static_cast<size_t>(v)].dtype, values[static_cast<size_t>(v)].numel);
  };
  auto placed = [&](int v) { return plan.offset[static_cast<size_t>(v)] >= 0; };
  size_t end = 0;
  for (int step = 0; step < static_cast<int>(steps.size()); ++step) {
    const MemoryStep& s = steps[static_cast<size_t>(step)];
    FreeList& free_blocks =
        free_lists[options.per_stream ? static_cast<size_t>(s.stream) : 0];
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
          if (placed(v) && last_reader[static_cast<size_t>(v)] == step && in.dtype == out.dtype &&
              in.numel == out.numel) {
            dying = v;
            break;
          }
        }
      if (dying >= 0) {
        plan.offset[static_cast<size_t>(o)] = plan.offset[static_cast<size_t>(dying)];
        last_reader[static_cast<size_t>(dying)] = kGone; // its block now belongs to `o`
        ++plan.in_place;
        continue;
      }
      if (std::optional<size_t> at = free_blocks.Take(need, end)) {
        plan.offset[static_cast<size_t>(o)] = static_cast<int64_t>(*at);
      } else {
        plan.offset[static_cast<size_t>(o)] = static_cast<int64_t>(end);
        end += need;
      }
    }
    for (int v : s.reads)
      if (placed(v) && last_reader[static_cast<size_t>(v)] == step) {
        free_blocks.Add(static_cast<size_t>(plan.offset[static_cast<size_t>(v)]), bytes(v));
        last_reader[static_cast<size_t>(v)] = kGone; // freed once, even when the step reads it twice (a * a)
      }
    for (int o : s.writes) // outputs nobody reads
      if (placed(o) && last_reader[static_cast<size_t>(o)] == MemoryValue::kNoReader) {
        free_blocks.Add(static_cast<size_t>(plan.offset[static_cast<size_t>(o)]), bytes(o));
        last_reader[static_cast<size_t>(o)] = kGone;
      }
  }
  plan.arena_bytes = end;
  return plan;
}

bool RunMemoryPlanning(ir::Graph& graph, const MemoryOptions& options, size_t* arena_bytes) {
  const auto& nodes = graph.nodes();
  // A group is one step at its last member; a group of elementwise ops only is elementwise.
  const std::vector<int> runs_in = GroupRoots(graph);
  std::vector<size_t> order; // the nodes that run, in order
  for (size_t i = 0; i < nodes.size(); ++i)
    if (runs_in[i] == static_cast<int>(i)) order.push_back(i);
  std::map<int, bool> group_elementwise;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (const int grp = nodes[i]->note().group; grp >= 0) {
      auto it = group_elementwise.emplace(grp, true).first;
      it->second = it->second && Fusable(*nodes[i]);
    }
  std::vector<int> step_of(nodes.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) step_of[order[k]] = static_cast<int>(k);

  // A member's value read outside its group is written by the group's step (a row group's
  // kernel writes such values); the others never exist.
  std::vector<bool> read_outside(static_cast<size_t>(graph.num_values()), false);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const ir::Value* v : nodes[i]->inputs())
      if (v->node() && runs_in[static_cast<size_t>(v->node()->id())] != runs_in[i])
        read_outside[static_cast<size_t>(v->id())] = true;
  std::vector<MemoryValue> values(static_cast<size_t>(graph.num_values()));
  std::vector<MemoryStep> steps(order.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int k = step_of[static_cast<size_t>(runs_in[i])];
    MemoryStep& st = steps[static_cast<size_t>(k)];
    for (const ir::Value* v : nodes[i]->inputs()) {
      // An operand computed inside the same group is no read of the group's step.
      if (v->node() && runs_in[static_cast<size_t>(v->node()->id())] == runs_in[i] &&
          static_cast<size_t>(v->node()->id()) != i)
        continue;
      st.reads.push_back(v->id());
      values[static_cast<size_t>(v->id())].last_reader = k; // nodes in order: the last one wins
    }
    for (const ir::Value* v : nodes[i]->outputs()) {
      MemoryValue& m = values[static_cast<size_t>(v->id())];
      m.dtype = v->dtype(), m.numel = v->shape().numel();
      m.planned = step_of[i] >= 0 || read_outside[static_cast<size_t>(v->id())];
      if (m.planned) st.writes.push_back(v->id());
    }
  }
  for (const ir::Value* v : graph.inputs()) values[static_cast<size_t>(v->id())].planned = false;
  for (const ir::Value* v : graph.outputs()) values[static_cast<size_t>(v->id())].planned = false;
  for (size_t k = 0; k < order.size(); ++k) {
    const ir::Node& n = *nodes[order[k]];
    const ir::OpDef& d = n.def();
    const int grp = n.note().group;
    steps[k].elementwise = n.outputs().size() == 1 &&
                           (grp >= 0 ? group_elementwise.at(grp)
                                     : d.binary_fn || (d.unary_fn && *d.unary_fn != UnaryFn::kIdentity));
    steps[k].stream = std::max(n.note().stream, 0);
  }
  const MemoryPlan plan = PlanMemory(steps, values, options);
  if (arena_bytes) *arena_bytes = plan.arena_bytes;
  bool changed = false;
  auto record = [&](ir::Value* v) {
    const int64_t offset = plan.offset[static_cast<size_t>(v->id())];
    changed |= v->note().offset != offset;
    v->note().offset = offset;
  };
  for (ir::Value* v : graph.inputs()) record(v);
  for (const auto& n : nodes)
    for (ir::Value* v : n->outputs()) record(v);
  return changed;
}

std::vector<int> GroupRoots(const ir::Graph& graph) {
  const auto& nodes = graph.nodes();
  std::map<int, int> last_of_group;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (const int grp = nodes[i]->note().group; grp >= 0) last_of_group[grp] = static_cast<int>(i);
  std::vector<int> roots(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int grp = nodes[i]->note().group;
    roots[i] = grp >= 0 ? last_of_group.at(grp) : static_cast<int>(i);
  }
  return roots;
}

} // namespace kiln::passes
