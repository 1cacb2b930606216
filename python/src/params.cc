// kiln._C bindings of the params file (NAME-0000.params, the safetensors layout): writing and
// reading go through ir/params.cc, the one implementation of the format, which C++ deployment
// (kiln::load) reads too. Python only turns arrays into host tensors and back. Also the atomic
// writes of the package's other files (an export's pair, pickled optimizer states).
#include "bind.h"
#include "kiln/ir/serialize.h"
#include "kiln/runtime/atomic_file.h"

namespace kiln::py {

namespace {
ir::HostTensor ToHost(const Tensor& t) {
  ir::HostTensor h{t.dtype(), t.shape(), std::vector<uint8_t>(static_cast<size_t>(t.numel()) * DTypeSize(t.dtype()))};
  pyb::gil_scoped_release nogil;  // waits for the array's value
  t.CopyToHost(h.bytes.data());   // dense, row-major; bfloat16/float16 as their bit patterns
  return h;
}

std::vector<std::pair<std::string, std::string>> Metadata(pyb::dict metadata) {
  std::vector<std::pair<std::string, std::string>> meta;
  for (auto [k, v] : metadata) meta.emplace_back(pyb::str(k).cast<std::string>(), pyb::str(v).cast<std::string>());
  return meta;
}
}  // namespace

KILN_PY_BIND(45) {
  pyb::class_<ir::HostTensor>(m, "HostTensor",
                              "An array's value copied to the host, as the params writer takes it.")
      .def(pyb::init(&ToHost), pyb::arg("array"))
      .def_property_readonly("dtype", [](const ir::HostTensor& h) { return DTypeName(h.dtype); })
      .def_property_readonly("shape", [](const ir::HostTensor& h) {
        pyb::tuple s(h.shape.rank());
        for (int d = 0; d < h.shape.rank(); ++d) s[d] = h.shape[d];
        return s;
      })
      .def_property_readonly("nbytes", [](const ir::HostTensor& h) { return h.bytes.size(); });

  m.def("save_params", [](const std::string& path, std::vector<std::pair<std::string, ir::HostTensor>> params,
                          pyb::dict metadata) {
    std::vector<std::pair<std::string, std::string>> meta = Metadata(metadata);
    pyb::gil_scoped_release nogil;
    ir::SaveParams(path, params, meta);
  }, pyb::arg("path"), pyb::arg("params"), pyb::arg("metadata"),
     "Writes [(name, HostTensor)] in the safetensors layout, atomically; `metadata` becomes the "
     "__metadata__ entry (none when empty).");

  m.def("save_export", [](const std::string& symbol_path, const std::string& symbol_json,
                          const std::string& params_path,
                          std::vector<std::pair<std::string, ir::HostTensor>> params, pyb::dict metadata) {
    std::vector<std::pair<std::string, std::string>> meta = Metadata(metadata);
    pyb::gil_scoped_release nogil;
    std::string blob = ir::ParamsBytes(params, meta, params_path);
    // Both written before either is renamed: a full disk changes neither. The symbol file goes
    // first: a kill between the renames leaves the new graph beside the old (or no) params of this
    // epoch, which SymbolBlock.imports and kiln::load refuse when their parameters differ.
    WriteFilesAtomic({{symbol_path, symbol_json}, {params_path, blob}});
  }, pyb::arg("symbol_path"), pyb::arg("symbol_json"), pyb::arg("params_path"), pyb::arg("params"),
     pyb::arg("metadata"),
     "Writes an export's pair, NAME-symbol.json (the text given) and NAME-0000.params, together "
     "(kiln::WriteFilesAtomic).");

  m.def("write_file_atomic", [](const std::string& path, pyb::bytes data) {
    char* buf = nullptr;
    Py_ssize_t n = 0;
    if (PyBytes_AsStringAndSize(data.ptr(), &buf, &n) != 0) throw pyb::error_already_set();
    std::string_view bytes(buf, static_cast<size_t>(n));  // `data` outlives the call
    pyb::gil_scoped_release nogil;
    WriteFileAtomic(path, bytes);
  }, pyb::arg("path"), pyb::arg("data"),
     "Writes `data` (bytes) to `path` atomically: the old file or the whole new one survives a "
     "kill; FileError (an OSError) when it cannot be written.");

  m.def("load_params", [](const std::string& path, const Device& device) {
    std::map<std::string, std::string> meta;
    std::vector<ir::NamedHostTensor> host;
    {
      pyb::gil_scoped_release nogil;
      host = ir::LoadParams(path, &meta);
    }
    pyb::list arrays;
    for (const auto& [name, t] : host)
      arrays.append(pyb::make_tuple(name, Tensor::FromHost(t.bytes.data(), t.shape, t.dtype, device)));
    pyb::dict metadata;
    for (const auto& [k, v] : meta) metadata[pyb::str(k)] = v;
    return pyb::make_tuple(arrays, metadata);
  }, pyb::arg("path"), pyb::arg("device"),
     "Reads a params file, checking all of it: ([(name, NDArray on device)] in file order, metadata).");
}

}  // namespace kiln::py
