// The pass manager: the default pipeline, read top to bottom, and RunPipeline, which applies the
// environment switches (KILN_DISABLE_PASS, KILN_DUMP_IR, KILN_VERIFY), verifies around passes and
// records what each pass did. Also GraphCopier, the rebuild helper passes share.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include "kiln/ir/text.h"
#include "kiln/ir/verify.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/passes/pass.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/profiler.h"

namespace kiln::passes {

namespace {

const Pass kDefaultPipeline[] = {
    // Fold computations on constants first: the folded values (x * (2 * 0.5) -> x * 1) expose
    // identities to simplify.
    {"constant_fold", RunConstantFold},
    // Rewrite algebraic identities: they expose duplicates to CSE and leave dead nodes.
    {"simplify", RunSimplify},
    // Merge repeated computations (after simplify, which makes more of them look alike).
    {"cse", RunCSE},
    // Drop what simplify and CSE left without users.
    {"dce", RunDCE},
};

// Passes that only some pipelines run, with options of their own (FrozenPipeline); known to the
// switches always.
constexpr const char* kOptionalPasses[] = {
    // hybridize(freeze=True): parameters become constants, folded into what depends on them alone.
    // After the default pipeline, so that constant_fold has turned computations on fills into fills
    // and CSE has merged duplicates; it leaves nothing dead behind.
    "freeze_fold",
};

constexpr const char* kPlanSteps[] = {
    // Elementwise chains and trees into one generated kernel each (codegen/).
    "fusion",
    // A matmul/conv and the elementwise ops after it into one oneDNN call with post-ops (within fusion).
    "epilogue",
    // Memory planning lets an elementwise output take the block of an input that dies there.
    "inplace",
    // Independent branches on separate streams, run concurrently when the branches are big enough.
    "streams",
};

/// The names in a comma-separated switch value, spaces trimmed, empty items skipped. Each must
/// be a known pass (or `all` where `allow_all`); otherwise ValueError with the closest name.
/// `plan_steps`: the plan steps are names too.
std::vector<std::string> PassNames(const char* var, std::span<const Pass> pipeline, bool allow_all, bool plan_steps) {
  std::vector<std::string_view> known;
  for (const Pass& p : pipeline) known.push_back(p.name);
  for (const Pass& p : kDefaultPipeline) known.push_back(p.name);
  for (const char* name : kOptionalPasses) known.push_back(name);
  if (plan_steps)
    for (const char* step : kPlanSteps) known.push_back(step);
  std::string value = env::Get(var);
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos <= value.size()) {
    size_t end = std::min(value.find(',', pos), value.size());
    std::string item = value.substr(pos, end - pos);
    pos = end + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    bool ok = (allow_all && item == "all") ||
              std::find(known.begin(), known.end(), std::string_view(item)) != known.end();
    if (!ok) {
      std::string_view best = known.front();
      for (std::string_view k : known)
        if (env::EditDistance(item, k) < env::EditDistance(item, best)) best = k;
      std::string list;
      for (const Pass& p : kDefaultPipeline) list += (list.empty() ? "" : ", ") + std::string(p.name);
      for (const char* name : kOptionalPasses) list += ", " + std::string(name);
      if (plan_steps)
        for (const char* step : kPlanSteps) list += ", " + std::string(step);
      KILN_THROW(ValueError) << var << ": unknown pass '" << item << "'; did you mean '" << best
                             << "'? The passes are: " << list;
    }
    names.push_back(std::move(item));
  }
  return names;
}

bool Named(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

} // namespace

std::span<const Pass> DefaultPipeline() { return kDefaultPipeline; }

std::vector<Pass> FrozenPipeline(const FreezeOptions& options, FreezeResult* result) {
  std::vector<Pass> pipeline(std::begin(kDefaultPipeline), std::end(kDefaultPipeline));
  pipeline.push_back({kOptionalPasses[0], [&options, result](std::unique_ptr<ir::Graph>& g) {
                        return RunFreezeFold(g, options, result);
                      }});
  return pipeline;
}

std::span<const char* const> PlanSteps() { return kPlanSteps; }

bool PassDisabled(std::string_view name) { return Named(PassNames("KILN_DISABLE_PASS", {}, false, true), name); }

bool PlanDumpRequested() {
  std::vector<std::string> dump = PassNames("KILN_DUMP_IR", {}, true, true);
  if (Named(dump, "all")) return true;
  for (const char* step : kPlanSteps)
    if (Named(dump, step)) return true;
  return false;
}

std::string PipelineReport::str() const {
  std::string s;
  for (const PassRecord& r : passes) {
    s += r.name + ": ";
    if (!r.ran)
      s += "disabled\n";
    else
      s += std::string(r.changed ? "changed" : "unchanged") + ", " + std::to_string(r.nodes_before) + " -> " +
           std::to_string(r.nodes_after) + " nodes\n";
  }
  return s;
}

std::unique_ptr<ir::Graph> RunPipeline(std::unique_ptr<ir::Graph> g, std::span<const Pass> pipeline,
                                       const PipelineOptions& options, PipelineReport* report) {
  KILN_CHECK(g) << "RunPipeline: null graph";
  std::vector<std::string> disabled = PassNames("KILN_DISABLE_PASS", pipeline, false, true);
  std::vector<std::string> dump = PassNames("KILN_DUMP_IR", pipeline, true, true);
  bool verify = options.verify || env::GetInt("KILN_VERIFY") != 0;
  if (verify) {
    try {
      ir::Verify(*g);
    } catch (const InternalError& e) {
      throw InternalError(std::string("the pipeline's input graph is malformed: ") + e.what());
    }
  }
  for (const Pass& pass : pipeline) {
    PassRecord rec{pass.name, false, false, g->nodes().size(), g->nodes().size()};
    if (!Named(disabled, pass.name)) {
      profiler::Scope event(profiler::kCompile,
                            profiler::Enabled(profiler::kCompile) ? "pass " + std::string(pass.name) : std::string(),
                            profiler::Args("nodes_before", static_cast<double>(rec.nodes_before)));
      std::string before = verify ? ir::PrintGraph(*g) : std::string();
      rec.ran = true;
      rec.changed = pass.fn(g);
      KILN_CHECK(g) << "pass '" << pass.name << "' left a null graph";
      rec.nodes_after = g->nodes().size();
      if (verify) {
        ir::Verify(*g, pass.name);
        KILN_CHECK(rec.changed || ir::PrintGraph(*g) == before)
            << "pass '" << pass.name << "' reported no change but changed the graph";
      }
      if (Named(dump, "all") || Named(dump, pass.name))
        std::fprintf(stderr, "# after pass %s (%s, %zu -> %zu nodes)\n%s", pass.name,
                     rec.changed ? "changed" : "unchanged", rec.nodes_before, rec.nodes_after,
                     ir::PrintGraph(*g).c_str());
    }
    if (report) report->passes.push_back(std::move(rec));
  }
  return g;
}

// ---- GraphCopier -------------------------------------------------------------------------------

GraphCopier::GraphCopier(const ir::Graph& old)
    : old_(old), g_(std::make_unique<ir::Graph>()), map_(static_cast<size_t>(old.num_values()), nullptr) {
  for (const ir::Value* v : old.inputs()) Alias(v, g_->AddInput(v->name(), v->type()));
}

ir::Value* GraphCopier::operator[](const ir::Value* v) const {
  KILN_CHECK(v && v->id() >= 0 && static_cast<size_t>(v->id()) < map_.size() && map_[v->id()])
      << "GraphCopier: value " << (v ? v->id() : -1) << " was not mapped before use";
  return map_[static_cast<size_t>(v->id())];
}

std::vector<ir::Value*> GraphCopier::Inputs(const ir::Node& n) const {
  std::vector<ir::Value*> in;
  in.reserve(n.inputs().size());
  for (const ir::Value* v : n.inputs()) in.push_back((*this)[v]);
  return in;
}

ir::Node* GraphCopier::Copy(const ir::Node& n) {
  ir::Node* c = g_->AddNode(n.op(), Inputs(n), n.attrs());
  for (size_t i = 0; i < n.outputs().size(); ++i) Alias(n.outputs()[i], c->outputs()[i]);
  return c;
}

void GraphCopier::Alias(const ir::Value* v, ir::Value* to) {
  KILN_CHECK(v->id() >= 0 && static_cast<size_t>(v->id()) < map_.size())
      << "GraphCopier: value id " << v->id() << " is outside the old graph";
  KILN_CHECK(to->type() == v->type())
      << "GraphCopier: value " << v->id() << " of type " << DTypeName(v->dtype()) << v->shape().str()
      << " mapped to a value of type " << DTypeName(to->dtype()) << to->shape().str();
  map_[static_cast<size_t>(v->id())] = to;
}

std::unique_ptr<ir::Graph> GraphCopier::Finish() {
  std::vector<ir::Value*> outs;
  for (const ir::Value* v : old_.outputs()) outs.push_back((*this)[v]);
  g_->SetOutputs(std::move(outs));
  return std::move(g_);
}

} // namespace kiln::passes
