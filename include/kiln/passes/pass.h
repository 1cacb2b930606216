// Graph passes and the pass manager (DESIGN.md section 8, STYLE.md conventions 4-6).
// A pass is a free function over a graph that returns whether it changed anything. Graphs have no
// in-place mutation API, so a pass that rewrites builds a new graph (with GraphCopier) and
// replaces the one it was given. RunPipeline runs a flat list of named passes, honours
// KILN_DISABLE_PASS and KILN_DUMP_IR, verifies around every pass when asked and records what
// each pass did. It does not schedule, iterate to a fixed point or cache results.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// A pass: may replace `g`; returns true when the graph changed.
using PassFn = bool (*)(std::unique_ptr<ir::Graph>& g);

/// A pass with the name KILN_DISABLE_PASS, KILN_DUMP_IR and reports use. A pass with options is
/// bound to them here, typed: {"freeze_fold", [&](auto& g) { return RunFreezeFold(g, opts, &out); }}.
struct Pass {
  const char* name;
  std::function<bool(std::unique_ptr<ir::Graph>& g)> fn;
};

struct PipelineOptions {
  /// Run ir::Verify on the input and after every pass, and check that a pass reporting "no
  /// change" left the text of the graph as it was. KILN_VERIFY=1 turns it on as well.
  bool verify = false;
};

/// What one pass of a pipeline did.
struct PassRecord {
  std::string name;
  bool ran = false;     ///< false: switched off by KILN_DISABLE_PASS
  bool changed = false; ///< what the pass returned
  size_t nodes_before = 0;
  size_t nodes_after = 0;
};

/// One record per pipeline entry, in pipeline order (for the compile report).
struct PipelineReport {
  std::vector<PassRecord> passes;
  /// One line per pass: "cse: changed, 7 -> 5 nodes" / "dce: disabled".
  std::string str() const;
};

/// Runs `pipeline` in order over `g` and returns the result.
/// KILN_DISABLE_PASS (comma-separated pass names) skips passes; KILN_DUMP_IR (a pass name or
/// `all`) prints the graph to stderr after that pass. A name in either that is neither in
/// `pipeline` nor in DefaultPipeline() is a ValueError naming the closest pass. With verification
/// on, a broken graph throws InternalError naming the pass that broke it (or the input).
std::unique_ptr<ir::Graph> RunPipeline(std::unique_ptr<ir::Graph> g, std::span<const Pass> pipeline,
                                       const PipelineOptions& options = {}, PipelineReport* report = nullptr);

/// The standard graph-level pipeline: constant_fold, simplify, cse, dce (see pass_manager.cc for why each).
std::span<const Pass> DefaultPipeline();

struct FreezeOptions;
struct FreezeResult;
/// For hybridize(freeze=True): the default pipeline, then freeze_fold with `options`, which writes
/// what it did into `*result` (both must outlive the pipeline's run).
std::vector<Pass> FrozenPipeline(const FreezeOptions& options, FreezeResult* result);

/// The steps that run when a graph becomes an executable plan, after the pipeline: `fusion`
/// (elementwise groups into generated kernels) and `inplace` (an elementwise output reusing the
/// memory of an input that dies there). They are not graph-to-graph passes, but
/// KILN_DISABLE_PASS, KILN_DUMP_IR and the compile report name them like passes.
std::span<const char* const> PlanSteps();

/// Whether KILN_DUMP_IR names a plan step or `all`: the plan builder then prints the graph with
/// its planning decisions once the plan is built (the plan steps run together).
bool PlanDumpRequested();

/// Whether KILN_DISABLE_PASS names `name` (a pass of the default pipeline or a plan step).
/// A misspelled name in the switch is a ValueError naming the closest pass.
bool PassDisabled(std::string_view name);

// ---- the passes (one file each) ----------------------------------------------------------------

/// simplify.cc: algebraic identities (x*1, x+0, neg(neg(x)), transpose pairs, reshape chains,
/// no-op reshape and cast). Leaves the replaced producers dead for DCE.
bool RunSimplify(std::unique_ptr<ir::Graph>& g);
/// cse.cc: merges nodes with the same op, inputs and attributes (never random ops).
bool RunCSE(std::unique_ptr<ir::Graph>& g);
/// dce_pass.cc: drops nodes the graph outputs do not depend on; keeps every graph input.
bool RunDCE(std::unique_ptr<ir::Graph>& g);
/// constant_fold.cc: a node whose inputs are all `full` constants becomes a `full` (data movement
/// of a fill; elementwise arithmetic through the ScalarEvaluator). Leaves the producers for DCE.
bool RunConstantFold(std::unique_ptr<ir::Graph>& g);

// freeze_fold.cc, for hybridize(freeze=True), takes options: see freeze_fold.h.

/// Computes the output element of elementwise node `n` (unary, binary, cast, where) from one
/// element per input (`in[k]` of input k's dtype, as a double), exactly as the op's kernel would;
/// nullopt when it cannot (the kernel fails, or a double cannot hold the result exactly). The
/// frontend supplies it (passes/ do not run kernels, DESIGN.md section 2); without one, constant
/// folding only moves fills.
using ScalarEvaluator = std::optional<double> (*)(const ir::Node& n, std::span<const double> in);
void SetScalarEvaluator(ScalarEvaluator f);

// ---- for writing passes ------------------------------------------------------------------------

/// Builds a new graph from an old one. The constructor copies the graph inputs (same names,
/// types and order: the calling convention); then a pass walks the old nodes in order and for
/// each either copies it (Copy), or maps its outputs to existing new values (Alias), or builds
/// something else from mapped values. Finish sets the outputs (mapped) and returns the graph.
class GraphCopier {
public:
  explicit GraphCopier(const ir::Graph& old);
  ir::Graph& graph() { return *g_; }
  /// The new value standing for old value `v`, which must have been copied or aliased already.
  ir::Value* operator[](const ir::Value* v) const;
  /// The mapped inputs of old node `n`.
  std::vector<ir::Value*> Inputs(const ir::Node& n) const;
  /// Appends a copy of `n` on mapped inputs and maps its outputs; returns the new node.
  ir::Node* Copy(const ir::Node& n);
  /// Maps old value `v` to new value `to`.
  void Alias(const ir::Value* v, ir::Value* to);
  std::unique_ptr<ir::Graph> Finish();

private:
  const ir::Graph& old_;
  std::unique_ptr<ir::Graph> g_;
  std::vector<ir::Value*> map_; // by old value id
};

} // namespace kiln::passes
