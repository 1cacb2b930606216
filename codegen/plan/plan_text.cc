// The text of a plan (see plan.h, PlanText): the graph's IR text with each node's planning
// decisions as a comment at the end of its line, so that golden tests and KILN_DUMP_IR show what
// fusion, stream assignment and memory planning decided. Comments are skipped by the IR parser, so
// the text still parses as the graph (without the decisions). AnnotatedGraph records the same
// decisions as typed notes on a copy of the graph instead (printed `#group= #stream= @arena+N`).
#include <string>
#include <unordered_map>

#include "kiln/ir/text.h"
#include "kiln/runtime/error.h"
#include "kiln/codegen/plan.h"

namespace kiln {

std::string PlanText(const Plan& p) {
  const ir::Graph& g = *p.graph;
  std::unordered_map<const ir::Value*, int> num; // the printer's numbering
  for (const ir::Value* v : g.inputs()) num.emplace(v, static_cast<int>(num.size()));
  for (const auto& n : g.nodes())
    for (const ir::Value* v : n->outputs()) num.emplace(v, static_cast<int>(num.size()));
  std::vector<int> group(g.nodes().size(), -1), step(g.nodes().size(), -1);
  int groups = 0;
  for (size_t i = 0; i < p.fused.size(); ++i)
    if (p.fused[i]) {
      for (int m : p.fused[i]->members) group[static_cast<size_t>(m)] = groups;
      ++groups;
    }
  for (size_t k = 0; k < p.step_nodes.size(); ++k)
    step[static_cast<size_t>(p.step_nodes[k])] = static_cast<int>(k);
  auto place = [&](const ir::Value* v, const std::vector<Slot>& slots) {
    const Slot& s = slots[static_cast<size_t>(v->id())];
    switch (s.kind) {
    case Slot::kInput: return "in" + std::to_string(s.index);
    case Slot::kOutput: return "out" + std::to_string(s.index);
    case Slot::kArena: return std::to_string(s.index);
    default: return std::string("-");
    }
  };
  std::string text = ir::PrintGraph(g), out;
  size_t pos = 0, line = 0;
  const size_t first_node = g.inputs().size();
  for (; pos < text.size(); ++line) {
    size_t end = text.find('\n', pos);
    out += text.substr(pos, end - pos);
    if (line >= first_node && line < first_node + g.nodes().size()) {
      const size_t i = line - first_node;
      const Plan::Fused* f = p.fused[i].get();
      out += "  # ";
      if (step[i] >= 0) {
        const size_t k = static_cast<size_t>(step[i]);
        out += "step " + std::to_string(k);
        if (f)
          out += ", group " + std::to_string(group[i]) +
                 (f->epilogue          ? " epilogue"
                  : f->outputs.empty() ? " elementwise"
                                       : " row");
        if (p.schedule.num_streams > 1) {
          out += ", stream " + std::to_string(p.schedule.stream[k]);
          for (size_t w = 0; w < p.schedule.waits[k].size(); ++w)
            out += (w ? ", " : ", waits for step ") + std::to_string(p.schedule.waits[k][w]);
        }
        // Where what it writes lives: a byte offset in the arena (then the per-stream layout's).
        std::vector<const ir::Value*> writes(g.nodes()[i]->outputs().begin(), g.nodes()[i]->outputs().end());
        if (f && !f->outputs.empty()) writes = f->outputs;
        out += "; writes";
        for (const ir::Value* v : writes) {
          out += " %" + std::to_string(num.at(v)) + "@" + place(v, p.slots);
          if (p.concurrent) out += "/" + place(v, p.stream_slots);
        }
      } else if (p.fused_member[i]) {
        out += "in group " + std::to_string(group[i]);
      } else {
        out += "does not run";
      }
    }
    out += '\n';
    pos = end + 1;
  }
  out += "# arena " + std::to_string(p.arena_bytes) + " bytes, " + std::to_string(p.schedule.num_streams) +
         (p.schedule.num_streams == 1 ? " stream" : " streams");
  if (p.concurrent) out += " run concurrently (arena " + std::to_string(p.stream_arena_bytes) + " bytes)";
  return out + "\n";
}

std::unique_ptr<ir::Graph> AnnotatedGraph(const Plan& p) {
  ir::ValueMap map;
  std::unique_ptr<ir::Graph> copy = ir::CopyGraph(*p.graph, &map);
  const auto& src = p.graph->nodes();
  const auto& dst = copy->nodes();
  KILN_CHECK(src.size() == dst.size())
      << "AnnotatedGraph: the copy has " << dst.size() << " nodes, not " << src.size();
  int groups = 0;
  for (size_t i = 0; i < p.fused.size(); ++i)
    if (p.fused[i]) {
      for (int m : p.fused[i]->members) dst[static_cast<size_t>(m)]->note().group = groups;
      ++groups;
    }
  if (p.schedule.num_streams > 1)
    for (size_t k = 0; k < p.step_nodes.size(); ++k) {
      ir::NodeNote& note = dst[static_cast<size_t>(p.step_nodes[k])]->note();
      note.stream = p.schedule.stream[k];
      for (int w : p.schedule.waits[k])
        note.waits.push_back(dst[static_cast<size_t>(p.step_nodes[static_cast<size_t>(w)])].get());
    }
  for (const auto& n : src)
    for (const ir::Value* v : n->outputs())
      if (const Slot& s = p.slots[static_cast<size_t>(v->id())]; s.kind == Slot::kArena)
        map.at(v)->note().offset = s.index;
  return copy;
}

} // namespace kiln
