// The compile report's text (CompileReport::str, what KILN_REPORT=1 and compile_report() print):
// per plan, the passes that ran, the fused groups, kernels, bytes moved, memory, streams, time and
// the codegen cache. Not here: building the figures (plan.cc).
#include <cstdio>
#include <sstream>
#include <string>

#include "kiln/frontend/cached_graph.h"

namespace kiln {

namespace {
std::string HumanBytes(int64_t b) {
  char buf[32];
  if (b < 10 * 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < 10 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024 * 1024));
  return buf;
}

std::string Ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", ms);
  return buf;
}
}  // namespace

double CompileReport::total_ms() const {
  double ms = 0;
  for (const PlanReport& p : plans) ms += p.total_ms();
  return ms;
}

std::string CompileReport::str() const {
  std::ostringstream os;
  os << "compile report, graph " << graph_id << " (" << plans.size()
     << (plans.size() == 1 ? " plan, " : " plans, ") << Ms(total_ms()) << "):\n";
  for (const PlanReport& p : plans) {
    os << p.name << ":\n  passes:";
    if (p.pipeline_ran) {
      std::istringstream lines(p.pipeline.str());
      os << "\n";
      for (std::string line; std::getline(lines, line);) os << "    " << line << "\n";
    } else {
      os << " none (built from the optimized forward)\n";
    }
    os << "    fusion: " << p.fusion << "\n";
    if (const auto& f = p.freeze)
      os << "  frozen: " << f->parameters << (f->parameters == 1 ? " parameter" : " parameters")
         << " became constants, " << f->nodes_folded << (f->nodes_folded == 1 ? " node" : " nodes")
         << " folded; the graph reads " << f->constants << (f->constants == 1 ? " constant" : " constants")
         << " (" << HumanBytes(f->constant_bytes) << ")\n";
    for (size_t k = 0; k < p.groups.size(); ++k) {
      const Group& g = p.groups[k];
      os << "  group " << k << ": ";
      for (size_t m = 0; m < g.ops.size(); ++m) os << (m ? ", " : "") << g.ops[m];
      os << " -> 1 kernel (";
      for (int i = 0; i < g.num_inputs; ++i) os << (i ? ", in" : "in") << i;
      os << "), " << g.ops.size() << " ops\n    " << g.expr;
      if (g.expr.rfind("oneDNN ", 0) == 0) os << "\n";  // an epilogue group: a library call, no codegen
      else os << "  [LLVM " << Ms(g.compile_ms) << "]\n";
    }
    os << "  kernels: " << p.kernels_before << " before fusion, " << p.kernels_after << " after\n"
       << "  bytes moved: " << HumanBytes(p.bytes_before) << " before fusion, " << HumanBytes(p.bytes_after)
       << " after\n"
       << "  memory: arena " << HumanBytes(static_cast<int64_t>(p.arena_bytes)) << " at peak ("
       << HumanBytes(static_cast<int64_t>(p.unshared_bytes)) << " unshared); " << p.in_place << " of "
       << p.intermediates << " intermediates in place\n"
       << "  streams: " << p.streams
       << (p.concurrent                   ? ", run concurrently"
           : p.concurrent_extra_bytes > 0 ? ", run one after another (running them concurrently needs " +
                                                HumanBytes(static_cast<int64_t>(p.concurrent_extra_bytes)) +
                                                " more arena)"
           : p.streams > 1                ? ", run one after another (too little work apart)"
                                          : "")
       << "; estimated critical path " << static_cast<int>(p.critical_fraction * 100 + 0.5) << "% of the serial time\n"
       << "  time: " << Ms(p.total_ms()) << " (pipeline " << Ms(p.pipeline_ms) << ", planning "
       << Ms(p.plan_ms) << ", codegen " << Ms(p.codegen_ms) << ")\n";
    if (!p.codegen_cache.empty()) {
      os << "  codegen cache:";
      for (size_t k = 0; k < p.codegen_cache.size(); ++k)
        os << (k ? ", " : " ") << p.codegen_cache[k].second << " " << p.codegen_cache[k].first;
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace kiln
