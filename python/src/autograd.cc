// kiln._C autograd: record/pause scopes (driven by the context managers of kiln/autograd.py),
// backward over several heads, and grad.
#include "bind.h"
#include "kiln/frontend/autograd.h"

namespace kiln::py {

namespace {
// A scope object Python enters and exits; holds the C++ RAII scope in between.
struct Scope {
  Scope(bool r, bool t) : record(r), train_mode(t) {}
  bool record, train_mode;
  std::unique_ptr<autograd::RecordScope> rec;
  std::unique_ptr<autograd::PauseScope> pause;
};
}  // namespace

KILN_PY_BIND(20) {
  pyb::class_<Scope>(m, "_AutogradScope")
      .def(pyb::init([](bool record, bool train_mode) { return std::make_unique<Scope>(record, train_mode); }))
      .def("__enter__", [](Scope& s) {
        if (s.record) s.rec = std::make_unique<autograd::RecordScope>(s.train_mode);
        else s.pause = std::make_unique<autograd::PauseScope>(s.train_mode);
      })
      .def("__exit__", [](Scope& s, pyb::handle, pyb::handle, pyb::handle) {
        s.rec.reset(), s.pause.reset();
        return false;
      });
  m.def("is_recording", &autograd::IsRecording);
  m.def("is_training", &autograd::IsTraining);
  m.def("_from_compiled_call", &autograd::FromCompiledCall);
  m.def("set_training", &autograd::SetTraining);
  m.def("backward", [](const std::vector<Tensor>& heads, std::optional<std::vector<Tensor>> head_grads,
                       bool retain_graph) {
    pyb::gil_scoped_release nogil;
    autograd::Backward(heads, head_grads.value_or(std::vector<Tensor>{}), retain_graph);
  }, pyb::arg("heads"), pyb::arg("head_grads") = pyb::none(), pyb::arg("retain_graph") = false);
  m.def("grad", [](const std::vector<Tensor>& heads, const std::vector<Tensor>& variables,
                   std::optional<std::vector<Tensor>> head_grads, bool retain_graph) {
    pyb::gil_scoped_release nogil;
    return autograd::Grad(heads, variables, head_grads.value_or(std::vector<Tensor>{}), retain_graph);
  }, pyb::arg("heads"), pyb::arg("variables"), pyb::arg("head_grads") = pyb::none(),
        pyb::arg("retain_graph") = false);
}

}  // namespace kiln::py
