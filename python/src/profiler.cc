// kiln._C._profiler: the profiler's recorder (kiln/runtime/profiler.h) for python/kiln/profiler.py,
// which holds MXNet's API (set_config, set_state, dump, dumps) on top of these few calls.
#include "kiln/runtime/profiler.h"
#include "bind.h"

namespace kiln::py {

KILN_PY_BIND(60) {
  pyb::module_ p = m.def_submodule("_profiler", "The profiler's recorder (use kiln.profiler).");
  p.attr("OPERATOR") = static_cast<uint32_t>(profiler::kOperator);
  p.attr("SYMBOLIC") = static_cast<uint32_t>(profiler::kSymbolic);
  p.attr("MEMORY") = static_cast<uint32_t>(profiler::kMemory);
  p.attr("COMPILE") = static_cast<uint32_t>(profiler::kCompile);
  p.attr("COLLECTIVE") = static_cast<uint32_t>(profiler::kCollective);
  p.attr("GPU") = static_cast<uint32_t>(profiler::kGpu);
  p.attr("ALL") = static_cast<uint32_t>(profiler::kAll);
  p.def("set_recording", &profiler::SetRecording, pyb::arg("mask"),
        "Records the categories in `mask` from now on (0: stop); events so far are kept.");
  p.def("recording", &profiler::Recording, "The categories recorded now (0: off).");
  p.def("clear", &profiler::Clear, "Forgets the events recorded so far and their aggregate statistics.");
  p.def("clear_trace", &profiler::ClearTrace,
        "Forgets the events recorded so far but keeps their aggregate statistics (until clear()).");
  p.def(
      "trace_json",
      [] {
        pyb::gil_scoped_release nogil; // GPU spans are waited for
        return profiler::TraceJson();
      },
      "The trace so far as Chrome trace-event JSON.");
  p.def(
      "write_trace",
      [](const std::string& path) {
        pyb::gil_scoped_release nogil;
        profiler::WriteTrace(path);
      },
      pyb::arg("path"), "Writes the trace so far to `path` (a temporary file, then rename).");
  p.def(
      "aggregate_table",
      [] {
        pyb::gil_scoped_release nogil;
        return profiler::AggregateTable();
      },
      "Count, total, min, max and mean per category and name, in the layout of MXNet's dumps().");
  p.def("event_count", &profiler::EventCount, "Events recorded so far.");
  p.def(
      "name_thread", [](const std::string& name) { profiler::NameThisThread(name); }, pyb::arg("name"),
      "Names the calling thread's lane in the trace.");
}

} // namespace kiln::py
