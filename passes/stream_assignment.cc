// Stream assignment (see kiln/passes/stream_assignment.h): list scheduling of steps onto streams,
// the waits between streams, and the dependencies memory reuse adds.
#include "kiln/passes/stream_assignment.h"

#include <algorithm>

#include "kiln/passes/graph_steps.h"
#include "kiln/runtime/dtype.h"
#include "kiln/runtime/error.h"

namespace kiln::passes {

StreamSchedule AssignStreams(std::span<const StreamStep> steps, int max_streams) {
  size_t n = steps.size();
  std::vector<int> stream(n, 0);
  std::vector<double> finish(n, 0);
  std::vector<double> free_at; // per stream: when its last step ends
  std::vector<int> tail;       // per stream: its last step
  max_streams = std::max(1, max_streams);
  for (size_t i = 0; i < n; ++i) {
    double ready = 0;
    for (int d : steps[i].deps) {
      KILN_CHECK(d >= 0 && static_cast<size_t>(d) < i) << "step " << i << " depends on step " << d;
      ready = std::max(ready, finish[static_cast<size_t>(d)]);
    }
    // Candidates: every open stream, and a new one while there is room.
    int best = -1;
    double best_start = 0;
    bool best_holds_dep = false;
    for (size_t k = 0; k < free_at.size(); ++k) {
      double start = std::max(ready, free_at[k]);
      bool holds = std::find(steps[i].deps.begin(), steps[i].deps.end(), tail[k]) != steps[i].deps.end();
      if (best < 0 || start < best_start || (start == best_start && holds && !best_holds_dep)) {
        best = static_cast<int>(k), best_start = start, best_holds_dep = holds;
      }
    }
    if (static_cast<int>(free_at.size()) < max_streams && (best < 0 || ready < best_start)) {
      best = static_cast<int>(free_at.size());
      best_start = ready;
      free_at.push_back(0);
      tail.push_back(-1);
    }
    size_t b = static_cast<size_t>(best);
    stream[i] = best;
    finish[i] = best_start + steps[i].cost;
    free_at[b] = finish[i];
    tail[b] = static_cast<int>(i);
  }
  return FinalizeStreams(steps, std::move(stream));
}

StreamSchedule FinalizeStreams(std::span<const StreamStep> steps, std::vector<int> stream) {
  StreamSchedule s;
  size_t n = steps.size();
  KILN_CHECK(stream.size() == n) << stream.size() << " streams for " << n << " steps";
  s.stream = std::move(stream);
  for (int k : s.stream) s.num_streams = std::max(s.num_streams, k + 1);
  s.lists.assign(static_cast<size_t>(s.num_streams), {});
  s.waits.assign(n, {});
  std::vector<double> finish(n, 0), free_at(static_cast<size_t>(s.num_streams), 0);
  for (size_t i = 0; i < n; ++i) {
    size_t k = static_cast<size_t>(s.stream[i]);
    double start = free_at[k];
    // Waits: per other stream, only its latest step this one needs (streams run in order).
    std::vector<int> latest(static_cast<size_t>(s.num_streams), -1);
    for (int d : steps[i].deps) {
      KILN_CHECK(d >= 0 && static_cast<size_t>(d) < i) << "step " << i << " depends on step " << d;
      start = std::max(start, finish[static_cast<size_t>(d)]);
      size_t t = static_cast<size_t>(s.stream[static_cast<size_t>(d)]);
      if (t != k) latest[t] = std::max(latest[t], d);
    }
    for (int d : latest)
      if (d >= 0) s.waits[i].push_back(d);
    finish[i] = free_at[k] = start + steps[i].cost;
    s.lists[k].push_back(static_cast<int>(i));
    s.total += steps[i].cost;
    s.critical = std::max(s.critical, finish[i]);
  }
  return s;
}

void AddReuseDeps(std::span<const ArenaBlock> blocks, std::vector<StreamStep>& steps) {
  for (const ArenaBlock& later : blocks) {
    if (later.writer < 0) continue;
    std::vector<int>& deps = steps[static_cast<size_t>(later.writer)].deps;
    for (const ArenaBlock& earlier : blocks) {
      if (&earlier == &later || earlier.writer < 0 || earlier.writer >= later.writer) continue;
      if (earlier.end <= later.begin || later.end <= earlier.begin) continue; // no overlap
      auto add = [&](int d) {
        if (d < later.writer && std::find(deps.begin(), deps.end(), d) == deps.end()) deps.push_back(d);
      };
      add(earlier.writer);
      for (int r : earlier.readers) add(r);
    }
  }
}

bool WorthConcurrent(const StreamSchedule& s, double min_work) {
  return s.num_streams > 1 && s.total - s.critical >= min_work && s.critical <= 0.9 * s.total;
}

double& MinConcurrentWork() {
  static double bytes = 4 << 20;
  return bytes;
}

bool RunStreamAssignment(ir::Graph& graph, int max_streams) {
  const auto& nodes = graph.nodes();
  const std::vector<int> roots = GroupRoots(graph);
  std::vector<int> step_of(nodes.size(), -1), order;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (roots[i] == static_cast<int>(i)) {
      step_of[i] = static_cast<int>(order.size());
      order.push_back(static_cast<int>(i));
    }
  auto bytes = [](const ir::Value* v) {
    return static_cast<double>(v->shape().numel()) * static_cast<double>(DTypeSize(v->dtype()));
  };
  std::vector<StreamStep> steps(order.size(), StreamStep{{}, 0.0});
  std::vector<bool> library(order.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int k = step_of[static_cast<size_t>(roots[i])];
    StreamStep& st = steps[static_cast<size_t>(k)];
    for (const ir::Value* v : nodes[i]->inputs()) {
      const int d =
          v->node() ? step_of[static_cast<size_t>(roots[static_cast<size_t>(v->node()->id())])] : -1;
      if (d == k) continue; // computed inside the group
      st.cost += bytes(v);
      if (d >= 0 && std::find(st.deps.begin(), st.deps.end(), d) == st.deps.end()) st.deps.push_back(d);
    }
    if (roots[i] == static_cast<int>(i))
      for (const ir::Value* o : nodes[i]->outputs()) st.cost += bytes(o);
    library[static_cast<size_t>(k)] =
        library[static_cast<size_t>(k)] || nodes[i]->def().fusion == ir::FusionKind::kOutEwiseFusable;
  }
  for (size_t k = 0; k < steps.size(); ++k)
    if (library[k]) steps[k].cost *= 4;
  const StreamSchedule s = AssignStreams(steps, max_streams);
  bool changed = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    ir::NodeNote note = nodes[i]->note();
    note.stream = -1;
    note.waits.clear();
    if (const int k = step_of[i]; k >= 0 && s.num_streams > 1) {
      note.stream = s.stream[static_cast<size_t>(k)];
      for (int w : s.waits[static_cast<size_t>(k)])
        note.waits.push_back(nodes[static_cast<size_t>(order[static_cast<size_t>(w)])].get());
    }
    changed |= !(note == nodes[i]->note());
    nodes[i]->note() = std::move(note);
  }
  return changed;
}

} // namespace kiln::passes
