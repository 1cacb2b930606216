// kiln._C.distributed: the bindings of kiln.distributed (python/kiln/distributed.py wraps them),
// and the Python class of DistributedError (a kiln.StateError, hence a RuntimeError).
#include "kiln/frontend/distributed.h"
#include "bind.h"
#include "call_site.h"
#include "kiln/runtime/error.h"

namespace kiln::py {

namespace {

std::vector<Tensor> ToArrays(pyb::handle arrays, const char* what) {
  std::vector<Tensor> v;
  auto one = [&](pyb::handle h) {
    if (!pyb::isinstance<Tensor>(h))
      KILN_THROW(ValueError) << what << ": expected kiln NDArrays (reduced in place), found "
                             << pyb::str(pyb::type::of(h)).cast<std::string>()
                             << "; convert with kiln.nd.array(...) first";
    v.push_back(h.cast<Tensor>());
  };
  if (pyb::isinstance<Tensor>(arrays))
    one(arrays);
  else
    for (pyb::handle h : arrays) one(h);
  return v;
}

} // namespace

KILN_PY_BIND(60) {
  pyb::object state = m.attr("StateError");
  pyb::object dist_error =
      pyb::reinterpret_steal<pyb::object>(PyErr_NewException("kiln.DistributedError", state.ptr(), nullptr));
  m.attr("DistributedError") = dist_error;
  // Tried before the general translator (later registrations come first).
  pyb::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const DistributedError& e) {
      pyb::module_ c = pyb::module_::import("kiln._C");
      PyErr_SetString(c.attr("DistributedError").ptr(), e.what());
    }
  });

  pyb::module_ d = m.def_submodule("distributed", "collectives across processes launched by mpirun");
  d.def(
      "init",
      [](pyb::object timeout) {
        double t = timeout.is_none() ? 0.0 : timeout.cast<double>();
        if (!timeout.is_none() && !(t > 0))
          KILN_THROW(ValueError) << "init: timeout must be a positive number of seconds, found " << t;
        pyb::gil_scoped_release nogil;
        distributed::Init(t);
      },
      pyb::arg("timeout") = pyb::none());
  d.def("is_initialized", [] { return distributed::IsInitialized(); });
  d.def("is_local_world", [] { return mpi::IsLocalWorld(); });
  d.def("rank", [] { return distributed::Rank(); });
  d.def("size", [] { return distributed::Size(); });
  d.def("local_rank", [] { return distributed::LocalRank(); });
  d.def("timeout", [] { return mpi::Timeout(); });
  d.def("nccl_available", [] { return mpi::NcclAvailable(); });
  d.def("barrier", [] {
    pyb::gil_scoped_release nogil;
    distributed::Barrier();
  });
  d.def(
      "allreduce",
      [](pyb::handle arrays, const std::string& op) {
        std::vector<Tensor> v = ToArrays(arrays, "allreduce");
        mpi::ReduceOp o = mpi::ParseReduceOp(op);
        CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
        pyb::gil_scoped_release nogil; // Push may block on backpressure
        distributed::Allreduce(v, o);
      },
      pyb::arg("arrays"), pyb::arg("op") = "sum");
  d.def(
      "broadcast",
      [](pyb::handle arrays, int root) {
        std::vector<Tensor> v = ToArrays(arrays, "broadcast");
        CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
        pyb::gil_scoped_release nogil;
        distributed::Broadcast(v, root);
      },
      pyb::arg("arrays"), pyb::arg("root") = 0);
  d.def("check_schedule", [](pyb::handle entries) {
    std::vector<distributed::ScheduleEntry> v;
    for (pyb::handle h : entries) {
      pyb::tuple t = pyb::reinterpret_borrow<pyb::object>(h).cast<pyb::tuple>();
      if (t.size() != 3)
        KILN_THROW(ValueError) << "check_schedule: expected (name, shape, dtype) entries, found "
                               << pyb::str(h).cast<std::string>();
      v.push_back({t[0].cast<std::string>(), ToShape(t[1]), ToDType(t[2])});
    }
    pyb::gil_scoped_release nogil;
    distributed::CheckSchedule(v);
  });
  d.def(
      "abort", [](int code, const std::string& why) { mpi::Abort(code, why); }, pyb::arg("code"),
      pyb::arg("why"));
  d.def("finalize", [] {
    pyb::gil_scoped_release nogil;
    distributed::Finalize();
  });
}

} // namespace kiln::py
