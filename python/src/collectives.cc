// kiln._C collectives among the devices of one process: allreduce, broadcast, reduce_scatter and
// all_gather over lists of NDArrays (one engine task per call; see frontend/collectives.h).
#include "kiln/frontend/collectives.h"
#include "bind.h"
#include "call_site.h"

namespace kiln::py {

KILN_PY_BIND(30) {
  m.def(
      "allreduce",
      [](const std::vector<std::vector<Tensor>>& groups, const std::string& op) {
        ReduceOp o = ParseReduceOp(op);
        CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
        pyb::gil_scoped_release nogil; // Push may wait for room in the engine's queue
        AllReduce(groups, o);
      },
      pyb::arg("groups"), pyb::arg("op") = "sum",
      R"(In-place allreduce: groups[d] is the list of arrays of device d (same shapes and dtypes on every
device, distinct devices). Each array becomes the reduction ("sum", "mean", "max" or "min") over
devices of the matching arrays, accumulated in device order: bit-identical on every device.
Returns at once; one engine task.)");

  m.def(
      "broadcast",
      [](const std::vector<std::vector<Tensor>>& groups, int root) {
        CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
        pyb::gil_scoped_release nogil;
        Broadcast(groups, root);
      },
      pyb::arg("groups"), pyb::arg("root") = 0,
      R"(In-place broadcast: copies the arrays of groups[root] into the matching arrays of every other group.)");

  m.def(
      "reduce_scatter",
      [](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, const std::string& op) {
        ReduceOp o = ParseReduceOp(op);
        CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
        pyb::gil_scoped_release nogil;
        ReduceScatter(inputs, outputs, o);
      },
      pyb::arg("inputs"), pyb::arg("outputs"), pyb::arg("op") = "sum",
      R"(outputs[d] = the reduction over devices of part d of the flattened inputs (np.array_split into
len(inputs) parts: the first N % D parts one element longer); outputs[d] lives on inputs[d]'s device.)");

  m.def(
      "all_gather",
      [](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
        CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
        pyb::gil_scoped_release nogil;
        AllGather(inputs, outputs);
      },
      pyb::arg("inputs"), pyb::arg("outputs"),
      R"(outputs[d] = the flattened inputs concatenated in device order; outputs[d] lives on inputs[d]'s
device and has as many elements as all inputs together.)");
}

} // namespace kiln::py
