// What building one plan did (DESIGN.md sections 8 and 9): the pipeline's passes, the fused groups
// and their kernels, kernel and byte counts before and after fusion, memory, streams and times.
// Kernel counts, bytes and memory are what the plan will do, worked out from the graph, not
// measured; the times are measured. frontend's CompileReport (one per compiled graph) holds one
// per plan and prints them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/passes/pass.h"

namespace kiln {

struct PlanReport {
  struct Group {
    std::vector<std::string> ops;  ///< op names of the members, in graph order (the last is the root)
    int num_inputs = 0;
    std::string expr;              ///< the generated kernel's expression, e.g. "relu(add(in0, in1))"
    double compile_ms = 0;         ///< LLVM time of the kernel, when it was first compiled
  };
  struct Freeze {
    int parameters = 0;          ///< captured tensors that became constants
    int nodes_folded = 0;        ///< nodes computed once, at compile time
    int constants = 0;           ///< constant inputs the frozen graph reads
    int64_t constant_bytes = 0;  ///< their bytes
  };
  std::string name;              ///< "forward", "backward", "training forward", "training backward"
  bool pipeline_ran = false;     ///< false: built from an optimized graph (a backward made on first use)
  passes::PipelineReport pipeline;
  std::string fusion;            ///< "1 group of 3 ops", "no fusable group", "disabled"...
  std::vector<Group> groups;
  int kernels_before = 0;        ///< live nodes: one kernel each without fusion
  int kernels_after = 0;         ///< kernels the plan launches
  int64_t bytes_before = 0;      ///< bytes those kernels read (inputs) and write (outputs)
  int64_t bytes_after = 0;
  size_t arena_bytes = 0;        ///< planned peak: the one arena every intermediate lives in
  size_t unshared_bytes = 0;     ///< the intermediates' blocks summed, as if none shared memory
  int intermediates = 0;         ///< values placed in the arena
  int in_place = 0;              ///< of those, outputs written over an input that dies there
  int streams = 1;               ///< streams the kernels were assigned to
  bool concurrent = false;       ///< whether they run concurrently (enough independent work)
  double critical_fraction = 1;  ///< estimated time with streams concurrent / one after another
  /// Not concurrent on a CPU although the work would be: the concurrent memory layout's arena
  /// would be this many bytes larger than the serial one's (0: not why).
  size_t concurrent_extra_bytes = 0;
  /// What freeze_fold did, for a frozen graph (hybridize(freeze=True)); empty otherwise.
  std::optional<Freeze> freeze;
  double pipeline_ms = 0, plan_ms = 0, codegen_ms = 0;  ///< plan_ms excludes codegen_ms
  /// Codegen kernel cache counters while this plan was built ("compiled", "cache hits"...).
  std::vector<std::pair<std::string, int64_t>> codegen_cache;
  double total_ms() const { return pipeline_ms + plan_ms + codegen_ms; }
};

}  // namespace kiln
