// kiln._C bindings of hybridize: TraceScope (a context manager), CachedGraph, and the bounded
// SignatureCache a HybridBlock keeps its compiled graphs in; the graphs read from
// NAME-symbol.json (LoadedGraph), re-shaped for other input shapes before they are compiled.
#include <optional>

#include "bind.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/signature_cache.h"
#include "kiln/ir/serialize.h"
#include "kiln/ir/text.h"
#include "kiln/passes/inline_calls.h"
#include "kiln/passes/reshape_inputs.h"

namespace kiln::py {

namespace {
struct PyTrace {
  std::unique_ptr<trace::TraceScope> scope;
};

// A graph read from NAME-symbol.json, not yet bound to parameters.
struct PyLoadedGraph {
  ir::LoadedGraph loaded;
};

ir::OutputStructure ToStructure(pyb::handle h) {
  if (pyb::isinstance<pyb::int_>(h)) return ir::OutputStructure::Leaf(h.cast<int>());
  std::vector<ir::OutputStructure> items;
  for (pyb::handle x : h) items.push_back(ToStructure(x));
  return ir::OutputStructure::List(std::move(items));
}

pyb::object FromStructure(const ir::OutputStructure& s) {
  if (s.is_leaf()) return pyb::int_(s.index);
  pyb::list l;
  for (const auto& x : s.items) l.append(FromStructure(x));
  return l;
}

pyb::list Types(const std::vector<ir::Value*>& vs, size_t begin, size_t end) {
  pyb::list out;
  for (size_t i = begin; i < end; ++i) {
    pyb::tuple shape(vs[i]->shape().rank());
    for (int d = 0; d < vs[i]->shape().rank(); ++d) shape[d] = vs[i]->shape()[d];
    out.append(pyb::make_tuple(shape, DTypeName(vs[i]->dtype())));
  }
  return out;
}

// The compile report as plain Python values (CompileReport's fields, same names).
pyb::dict ReportDict(const CompileReport& r) {
  pyb::list plans;
  for (const CompileReport::PlanReport& p : r.plans) {
    pyb::list passes, groups;
    for (const passes::PassRecord& x : p.pipeline.passes)
      passes.append(pyb::dict(pyb::arg("name") = x.name, pyb::arg("ran") = x.ran,
                              pyb::arg("changed") = x.changed, pyb::arg("nodes_before") = x.nodes_before,
                              pyb::arg("nodes_after") = x.nodes_after));
    for (const CompileReport::Group& g : p.groups)
      groups.append(pyb::dict(pyb::arg("ops") = g.ops, pyb::arg("num_inputs") = g.num_inputs,
                              pyb::arg("expr") = g.expr, pyb::arg("compile_ms") = g.compile_ms));
    pyb::dict cache;
    for (const auto& [name, count] : p.codegen_cache) cache[pyb::str(name)] = count;
    pyb::dict d;
    d["name"] = p.name, d["pipeline_ran"] = p.pipeline_ran, d["passes"] = passes, d["fusion"] = p.fusion;
    d["groups"] = groups, d["kernels_before"] = p.kernels_before, d["kernels_after"] = p.kernels_after;
    d["bytes_before"] = p.bytes_before, d["bytes_after"] = p.bytes_after;
    d["arena_bytes"] = p.arena_bytes, d["unshared_bytes"] = p.unshared_bytes;
    d["intermediates"] = p.intermediates, d["in_place"] = p.in_place;
    d["streams"] = p.streams, d["concurrent"] = p.concurrent, d["critical_fraction"] = p.critical_fraction;
    d["concurrent_extra_bytes"] = p.concurrent_extra_bytes;
    d["freeze"] = p.freeze ? pyb::object(pyb::dict(pyb::arg("parameters") = p.freeze->parameters,
                                                   pyb::arg("nodes_folded") = p.freeze->nodes_folded,
                                                   pyb::arg("constants") = p.freeze->constants,
                                                   pyb::arg("constant_bytes") = p.freeze->constant_bytes))
                           : pyb::none();
    d["pipeline_ms"] = p.pipeline_ms, d["plan_ms"] = p.plan_ms, d["codegen_ms"] = p.codegen_ms;
    d["total_ms"] = p.total_ms(), d["codegen_cache"] = cache;
    plans.append(d);
  }
  return pyb::dict(pyb::arg("graph_id") = r.graph_id, pyb::arg("total_ms") = r.total_ms(),
                   pyb::arg("plans") = plans);
}

// A cache key as kiln.nn.block writes it: (training, frozen, *args), each argument either
// (shape, dtype name, device) or ("const", repr).
CallSignature ToSignature(pyb::handle key) {
  if (!pyb::isinstance<pyb::tuple>(key) || pyb::len(key) < 2)
    KILN_THROW(ValueError) << "SignatureCache: a key is a tuple (training, frozen, *arguments)";
  auto t = pyb::reinterpret_borrow<pyb::tuple>(key);
  CallSignature sig;
  sig.training = t[0].cast<bool>();
  sig.frozen = t[1].cast<bool>();
  for (size_t i = 2; i < t.size(); ++i) {
    auto a = pyb::reinterpret_borrow<pyb::tuple>(t[i]);
    CallSignature::Arg arg;
    if (a.size() == 2 && pyb::isinstance<pyb::str>(a[0]) && a[0].cast<std::string>() == "const") {
      arg.is_tensor = false;
      arg.constant = a[1].cast<std::string>();
    } else {
      if (a.size() != 3)
        KILN_THROW(ValueError) << "SignatureCache: argument " << i - 2
                                  << " of a key must be (shape, dtype, device) or ('const', text)";
      arg.shape = ToShape(a[0]);
      arg.dtype = ToDType(a[1]);
      arg.device = a[2].cast<Device>();
    }
    sig.args.push_back(std::move(arg));
  }
  return sig;
}

pyb::tuple FromSignature(const CallSignature& sig) {
  pyb::list items;
  items.append(pyb::bool_(sig.training));
  items.append(pyb::bool_(sig.frozen));
  for (const CallSignature::Arg& a : sig.args) {
    if (!a.is_tensor) {
      items.append(pyb::make_tuple("const", a.constant));
      continue;
    }
    pyb::tuple shape(a.shape.rank());
    for (int d = 0; d < a.shape.rank(); ++d) shape[d] = a.shape[d];
    items.append(pyb::make_tuple(shape, DTypeName(a.dtype), a.device));
  }
  return pyb::tuple(items);
}

// A Python object kept in a C++ cache entry; released with the GIL.
std::shared_ptr<void> Hold(pyb::object o) {
  return std::shared_ptr<void>(new pyb::object(std::move(o)), [](void* p) {
    pyb::gil_scoped_acquire gil;
    delete static_cast<pyb::object*>(p);
  });
}

// What export writes of a compiled graph: the graph with its parameter inputs in `order` (indices
// into the captured tensors; empty: as traced), and calls of other compiled graphs (a SymbolBlock
// inside a hybridized block) inlined.
std::string ExportJson(const CachedGraph& g, const ir::GraphManifest& m, const std::vector<int>& order) {
  const ir::Graph& src = g.graph();
  std::unique_ptr<ir::Graph> copy;
  if (!order.empty()) {
    size_t n = static_cast<size_t>(g.num_data_inputs());
    size_t np = src.inputs().size() - n;
    std::vector<bool> seen(np, false);
    if (order.size() != np)
      KILN_THROW(ValueError) << "export: param_order has " << order.size() << " entries for " << np << " parameters";
    copy = std::make_unique<ir::Graph>();
    ir::ValueMap map;
    for (size_t i = 0; i < n; ++i) map[src.inputs()[i]] = copy->AddInput(src.inputs()[i]->name(), src.inputs()[i]->type());
    for (int k : order) {
      if (k < 0 || static_cast<size_t>(k) >= np || seen[static_cast<size_t>(k)])
        KILN_THROW(ValueError) << "export: param_order must be a permutation of 0.." << np - 1;
      seen[static_cast<size_t>(k)] = true;
      const ir::Value* v = src.inputs()[n + static_cast<size_t>(k)];
      map[v] = copy->AddInput(v->name(), v->type());
    }
    ir::CopyNodes(src, *copy, map);
    std::vector<ir::Value*> outs;
    for (const ir::Value* v : src.outputs()) outs.push_back(map.at(v));
    copy->SetOutputs(std::move(outs));
  }
  const ir::Graph& ordered = copy ? *copy : src;
  if (!passes::HasCalls(ordered)) return ir::GraphToJson(ordered, m);
  return ir::GraphToJson(*passes::InlineCalls(ordered, RegisteredGraphBody), m);
}

ir::GraphManifest Manifest(const std::vector<std::string>& inputs, const std::vector<std::string>& params,
                           pyb::handle structure) {
  ir::GraphManifest m;
  m.inputs = inputs;
  m.params = params;
  m.output_structure = ToStructure(structure);
  return m;
}
}  // namespace

KILN_PY_BIND(50) {
  m.def("tracing", &trace::Active, "True while a hybridized block is being traced on this thread.");
  m.def("is_symbolic", &trace::IsSymbolic);
  // `with _C.TracePause():` runs its body eagerly inside a trace (deferred parameter initialization).
  struct PyPause {
    std::optional<trace::PauseScope> scope;
  };
  pyb::class_<PyPause>(m, "TracePause")
      .def(pyb::init<>())
      .def("__enter__", [](PyPause& p) { p.scope.emplace(); })
      .def("__exit__", [](PyPause& p, pyb::args) { p.scope.reset(); });
  m.def("live_graphs", &NumLiveGraphs,
        "Compiled graphs alive now (forward graphs and training variants), after freeing those whose "
        "last holder went away while the engine was busy, if it is idle now.");

  pyb::class_<SignatureCache>(m, "SignatureCache",
                              "A HybridBlock's compiled graphs by call signature, least recently used "
                              "dropped beyond `capacity` (0: KILN_GRAPH_CACHE_SIZE).")
      .def(pyb::init<size_t>(), pyb::arg("capacity") = 0)
      // A copied block (copy.deepcopy, pickle) starts with no compiled graphs: it traces again.
      .def("__copy__", [](const SignatureCache& c) { return SignatureCache(c.capacity()); })
      .def("__deepcopy__", [](const SignatureCache& c, pyb::handle) { return SignatureCache(c.capacity()); })
      .def(pyb::pickle([](const SignatureCache& c) { return pyb::make_tuple(c.capacity()); },
                       [](pyb::tuple t) { return SignatureCache(t[0].cast<size_t>()); }))
      .def("get", [](SignatureCache& c, pyb::handle key) -> pyb::object {
        const SignatureCache::Entry* e = c.Find(ToSignature(key));
        if (!e) return pyb::none();
        return pyb::make_tuple(e->graph, *static_cast<pyb::object*>(e->extra.get()));
      }, pyb::arg("key"), "(graph, structure) for `key`, made the most recently used; None when absent.")
      // The hot path of a hybridized call: the key made from the arguments themselves (as
      // HybridBlock._signature makes it, without building the Python tuple), and the graph called.
      .def("call", [](SignatureCache& c, bool training, bool frozen, pyb::tuple args) -> pyb::object {
        CallSignature sig;
        sig.training = training, sig.frozen = frozen;
        sig.args.reserve(args.size());
        std::vector<Tensor> inputs;
        inputs.reserve(args.size());
        for (pyb::handle a : args) {
          CallSignature::Arg& arg = sig.args.emplace_back();
          if (pyb::isinstance<Tensor>(a)) {
            const Tensor& t = a.cast<const Tensor&>();
            arg.shape = t.shape(), arg.dtype = t.dtype(), arg.device = t.device();
            inputs.push_back(t);
          } else {
            arg.is_tensor = false;
            arg.constant = pyb::repr(a).cast<std::string>();
          }
        }
        const SignatureCache::Entry* e = c.Find(sig);
        if (!e) return pyb::none();
        std::shared_ptr<CachedGraph> graph = e->graph;
        pyb::object structure = *static_cast<pyb::object*>(e->extra.get());
        std::vector<Tensor> outs = graph->Call(inputs);
        return pyb::make_tuple(std::move(graph), std::move(structure), std::move(outs));
      }, pyb::arg("training"), pyb::arg("frozen"), pyb::arg("args"),
         "(graph, structure, outputs) of calling the graph cached for these arguments (a key as "
         "HybridBlock._signature makes), made the most recently used; None when absent.")
      .def("__setitem__", [](SignatureCache& c, pyb::handle key, pyb::tuple value) {
        if (value.size() != 2) KILN_THROW(ValueError) << "SignatureCache: a value is (graph, structure)";
        c.Insert(ToSignature(key), {value[0].cast<std::shared_ptr<CachedGraph>>(),
                                    Hold(pyb::reinterpret_borrow<pyb::object>(value[1]))});
      })
      .def("__contains__", [](SignatureCache& c, pyb::handle key) { return c.Find(ToSignature(key)) != nullptr; })
      .def("__len__", &SignatureCache::size)
      .def("keys", [](const SignatureCache& c) {
        pyb::list out;
        for (const CallSignature* k : c.keys()) out.append(FromSignature(*k));
        return out;
      }, "The keys, most recently used first.")
      .def("clear", &SignatureCache::Clear)
      .def_property("capacity", &SignatureCache::capacity, &SignatureCache::set_capacity)
      .def_property_readonly("evictions", &SignatureCache::evictions);

  pyb::class_<CachedGraph, std::shared_ptr<CachedGraph>>(m, "CachedGraph")
      .def("__call__", &CachedGraph::Call, pyb::arg("inputs"))
      .def_property_readonly("num_data_inputs", &CachedGraph::num_data_inputs)
      .def_property_readonly("num_outputs", &CachedGraph::num_outputs)
      .def_property_readonly("captured", &CachedGraph::captured)
      .def_property_readonly("frozen", &CachedGraph::frozen)
      .def_property_readonly("arena_bytes", &CachedGraph::arena_bytes)
      .def_property_readonly("graph_id", &CachedGraph::graph_id)
      .def_property_readonly("num_nodes", [](const CachedGraph& g) { return g.graph().nodes().size(); })
      .def("graph_text", [](const CachedGraph& g) { return ir::PrintGraph(g.graph()); })
      .def("compile_report", [](const CachedGraph& g, bool as_dict) -> pyb::object {
        CompileReport r = g.compile_report();
        if (as_dict) return ReportDict(r);
        return pyb::str(r.str());
      }, pyb::arg("as_dict") = false,
         "What compiling did, per plan built so far: the text KILN_REPORT=1 prints, or its fields as a dict.")
      .def("to_json", [](const CachedGraph& g, const std::vector<std::string>& inputs,
                         const std::vector<std::string>& params, pyb::handle structure, const std::vector<int>& order) {
        return ExportJson(g, Manifest(inputs, params, structure), order);
      }, pyb::arg("input_names"), pyb::arg("param_names"), pyb::arg("output_structure"),
         pyb::arg("param_order") = std::vector<int>{},
         "NAME-symbol.json's text: `param_names` name the parameters in `param_order` (indices into "
         "captured; empty: as traced); calls of other compiled graphs (SymbolBlocks) are inlined.")
      .def("save", [](const CachedGraph& g, const std::string& path, const std::vector<std::string>& inputs,
                      const std::vector<std::string>& params, pyb::handle structure, const std::vector<int>& order) {
        ir::WriteFileAtomic(path, ExportJson(g, Manifest(inputs, params, structure), order));
      }, pyb::arg("path"), pyb::arg("input_names"), pyb::arg("param_names"), pyb::arg("output_structure"),
         pyb::arg("param_order") = std::vector<int>{},
         "Writes to_json()'s text to NAME-symbol.json atomically.");

  pyb::class_<PyLoadedGraph>(m, "LoadedGraph")
      .def_property_readonly("input_names", [](const PyLoadedGraph& g) { return g.loaded.manifest.inputs; })
      .def_property_readonly("param_names", [](const PyLoadedGraph& g) { return g.loaded.manifest.params; })
      .def_property_readonly("input_types", [](const PyLoadedGraph& g) {
        return Types(g.loaded.graph->inputs(), 0, g.loaded.manifest.inputs.size());
      })
      .def_property_readonly("param_types", [](const PyLoadedGraph& g) {
        size_t n = g.loaded.manifest.inputs.size();
        return Types(g.loaded.graph->inputs(), n, n + g.loaded.manifest.params.size());
      })
      .def_property_readonly("output_structure", [](const PyLoadedGraph& g) {
        return FromStructure(g.loaded.manifest.output_structure);
      })
      .def("graph_text", [](const PyLoadedGraph& g) { return ir::PrintGraph(*g.loaded.graph); })
      .def("reshaped", [](const PyLoadedGraph& g, const std::vector<pyb::object>& shapes) {
        if (!g.loaded.graph) KILN_THROW(StateError) << "this loaded graph was already compiled";
        std::vector<Shape> s;
        for (const auto& h : shapes) s.push_back(ToShape(h));
        return PyLoadedGraph{{passes::ReshapeInputs(*g.loaded.graph, s), g.loaded.manifest}};
      }, pyb::arg("input_shapes"),
         "A copy re-shaped for these data input shapes (passes/reshape_inputs.h): ShapeError naming the "
         "node and the input when that cannot be done soundly.")
      .def("compile", [](PyLoadedGraph& g, const std::vector<Tensor>& params, const Device& device) {
        if (!g.loaded.graph) KILN_THROW(StateError) << "this loaded graph was already compiled";
        int n = static_cast<int>(g.loaded.manifest.inputs.size());
        return CachedGraph::FromGraph(std::move(g.loaded.graph), n, params, device);
      }, pyb::arg("params"), pyb::arg("device"),
         "Binds the parameters (in param_names order) and compiles; the graph is consumed.");
  m.def("load_graph", [](const std::string& path) { return PyLoadedGraph{ir::LoadGraph(path)}; },
        "Reads and validates NAME-symbol.json.");
  m.def("parse_graph_json", [](const std::string& text) { return PyLoadedGraph{ir::GraphFromJson(text)}; });

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
      .def("finish", [](PyTrace& t, const std::vector<Tensor>& outputs, bool freeze) {
        if (!t.scope) KILN_THROW(StateError) << "TraceScope.finish outside its `with` block";
        return t.scope->Finish(outputs, freeze);
      }, pyb::arg("outputs"), pyb::arg("freeze") = false,
         "Compiles the trace; freeze=True makes the captured tensors constants (a snapshot), folded in.");
}

}  // namespace kiln::py
