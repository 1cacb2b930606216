// kiln._C bindings of hybridize: TraceScope (a context manager) and CachedGraph.
#include "bind.h"
#include "kiln/frontend/cached_graph.h"

namespace kiln::py {

namespace {
struct PyTrace {
  std::unique_ptr<trace::TraceScope> scope;
};
}  // namespace

KILN_PY_BIND(50) {
  m.def("tracing", &trace::Active, "True while a hybridized block is being traced on this thread.");
  m.def("is_symbolic", &trace::IsSymbolic);

  pyb::class_<CachedGraph, std::shared_ptr<CachedGraph>>(m, "CachedGraph")
      .def("__call__", &CachedGraph::Call, pyb::arg("inputs"))
      .def_property_readonly("num_data_inputs", &CachedGraph::num_data_inputs)
      .def_property_readonly("num_outputs", &CachedGraph::num_outputs)
      .def_property_readonly("captured", &CachedGraph::captured)
      .def_property_readonly("arena_bytes", &CachedGraph::arena_bytes)
      .def_property_readonly("graph_id", &CachedGraph::graph_id)
      .def_property_readonly("num_nodes", [](const CachedGraph& g) { return g.graph().nodes().size(); })
      .def("graph_text", [](const CachedGraph& g) { return g.graph().str(); });

  pyb::class_<PyTrace>(m, "TraceScope")
      .def(pyb::init<>())
      .def("__enter__", [](PyTrace& t) -> PyTrace& {
        t.scope = std::make_unique<trace::TraceScope>();
        return t;
      }, pyb::return_value_policy::reference)
      .def("__exit__", [](PyTrace& t, pyb::handle, pyb::handle, pyb::handle) {
        t.scope.reset();
        return false;
      })
      .def("input", [](PyTrace& t, const std::string& name, pyb::handle shape, pyb::handle dtype, const Device& d) {
        if (!t.scope) KILN_THROW(StateError) << "TraceScope.input outside its `with` block";
        return t.scope->Input(name, ToShape(shape), ToDType(dtype), d);
      })
      .def("finish", [](PyTrace& t, const std::vector<Tensor>& outputs) {
        if (!t.scope) KILN_THROW(StateError) << "TraceScope.finish outside its `with` block";
        return t.scope->Finish(outputs);
      });
}

}  // namespace kiln::py
