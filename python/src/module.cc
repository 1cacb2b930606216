// kiln._C: the module, error translation, devices, dtypes and the conversions every binding uses.
#include <algorithm>
#include <mutex>
#include <new>
#include <set>
#include <string>

#include "bind.h"
#include "kiln/frontend/deferred.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/atomic_file.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/gpu_dnn_autotune.h"
#include "kiln/runtime/math_mode.h"
#include "kiln/runtime/step_counters.h"
#include "kiln/runtime/error.h"

namespace kiln::py {

namespace {
std::vector<std::pair<int, std::function<void(pyb::module_&)>>>& Binders() {
  static auto* b = new std::vector<std::pair<int, std::function<void(pyb::module_&)>>>();
  return *b;
}
}  // namespace

Binder::Binder(int priority, std::function<void(pyb::module_&)> fn) {
  Binders().emplace_back(priority, std::move(fn));
}

DType ToDType(pyb::handle h, DType default_dtype) {
  if (h.is_none()) return default_dtype;
  if (pyb::isinstance<pyb::str>(h)) return ParseDType(h.cast<std::string>());
  // NumPy dtypes and scalar types (np.float32, np.dtype('int64'), float, int, bool)
  pyb::object np = pyb::module_::import("numpy");
  std::string name = pyb::str(np.attr("dtype")(h).attr("name"));
  return ParseDType(name);
}

pyb::dtype NumpyDType(DType t) {
  switch (t) {
    case DType::kBFloat16: return pyb::dtype("float32");
    case DType::kBool: return pyb::dtype("bool");
    default: return pyb::dtype(DTypeName(t));
  }
}

std::vector<int64_t> ToInts(pyb::handle h) {
  if (pyb::isinstance<pyb::int_>(h)) return {h.cast<int64_t>()};
  std::vector<int64_t> v;
  for (pyb::handle x : h) v.push_back(pyb::reinterpret_borrow<pyb::object>(x).cast<int64_t>());
  return v;
}

Shape ToShape(pyb::handle h) {
  std::vector<int64_t> v = ToInts(h);
  if (v.size() > static_cast<size_t>(kMaxRank))
    KILN_THROW(ShapeError) << "shape " << pyb::str(h).cast<std::string>() << " has rank " << v.size()
                           << ", above the maximum " << kMaxRank;
  for (int64_t d : v)
    if (d < 0) KILN_THROW(ValueError) << "shape " << pyb::str(h).cast<std::string>() << " has a negative size";
  return Shape(v);
}

ir::Attrs ToAttrs(const pyb::dict& kwargs) {
  static std::mutex mu;
  static std::set<std::string> names;
  ir::Attrs a;
  for (auto [k, v] : kwargs) {
    const char* name;
    {
      std::lock_guard<std::mutex> g(mu);
      name = names.insert(k.cast<std::string>()).first->c_str();
    }
    ir::AttrValue value;
    if (pyb::isinstance<pyb::bool_>(v)) value = v.cast<bool>();
    else if (pyb::isinstance<pyb::int_>(v)) value = v.cast<int64_t>();
    else if (pyb::isinstance<pyb::float_>(v)) value = v.cast<double>();
    else if (pyb::isinstance<pyb::tuple>(v) || pyb::isinstance<pyb::list>(v)) value = ToInts(v);
    else if (v.is_none()) continue;
    else value = ToDType(v);
    a.items().emplace_back(name, std::move(value));
  }
  return a;
}

Tensor ToTensor(pyb::handle h, std::optional<Device> device) {
  if (pyb::isinstance<Tensor>(h)) {
    const Tensor& t = h.cast<const Tensor&>();
    return device && t.device() != *device ? t.To(*device) : t;
  }
  pyb::object np = pyb::module_::import("numpy");
  pyb::array arr;
  if (pyb::isinstance<pyb::array>(h)) {
    arr = pyb::reinterpret_borrow<pyb::array>(h);
  } else {
    // Python scalars and lists: float32 as MXNet's nd.array does, bool stays bool.
    pyb::object a = np.attr("asarray")(h);
    std::string kind = pyb::str(a.attr("dtype").attr("kind"));
    arr = kind == "b" ? pyb::array(a) : pyb::array(np.attr("asarray")(h, "float32"));
  }
  std::string name = pyb::str(arr.dtype().attr("name"));
  DType dt = ParseDType(name == "float64" || name == "float32" || name == "float16" || name == "int32" ||
                                name == "int64" || name == "uint8" || name == "bool"
                            ? name
                            : std::string("unsupported numpy dtype ") + name);
  // Big-endian (or other non-native) data: the bytes are copied as they are below, so convert to
  // the native order first ('>f4' would otherwise read as garbage little-endian floats).
  if (!arr.dtype().attr("isnative").cast<bool>())
    arr = pyb::array(arr.attr("astype")(arr.dtype().attr("newbyteorder")("=")));
  arr = pyb::array(np.attr("ascontiguousarray")(arr));
  Shape shape;
  std::vector<int64_t> dims(arr.shape(), arr.shape() + arr.ndim());
  shape = Shape(dims);
  return Tensor::FromHost(arr.data(), shape, dt, device.value_or(cpu()));
}

namespace {

pyb::dict StatsDict(const AllocatorStats& s) {
  pyb::dict d;
  d["bytes_in_use"] = s.bytes_in_use, d["peak_bytes_in_use"] = s.peak_bytes_in_use;
  d["bytes_cached"] = s.bytes_cached, d["peak_bytes_cached"] = s.peak_bytes_cached;
  d["bytes_reserved"] = s.bytes_reserved(), d["cache_limit_bytes"] = s.cache_limit_bytes;
  d["bytes_requested"] = s.bytes_requested, d["fragmentation"] = s.fragmentation();
  d["num_allocs"] = s.num_allocs, d["num_system_allocs"] = s.num_system_allocs;
  d["num_frees"] = s.num_frees, d["num_system_frees"] = s.num_system_frees, d["num_trims"] = s.num_trims;
  d["num_ooms"] = s.num_ooms, d["num_cache_flushes"] = s.num_cache_flushes;
  d["num_stream_waits"] = s.num_stream_waits;
  return d;
}

void RegisterErrors(pyb::module_& m) {
  pyb::object builtins = pyb::module_::import("builtins");
  // Every typed error is a KilnError and also the built-in exception a Python user expects.
  pyb::object error = pyb::reinterpret_steal<pyb::object>(
      PyErr_NewException("kiln.KilnError", builtins.attr("Exception").ptr(), nullptr));
  auto make = [&](const char* name, const char* base) {
    pyb::tuple bases = pyb::make_tuple(error, builtins.attr(base));
    return pyb::reinterpret_steal<pyb::object>(
        PyErr_NewException((std::string("kiln.") + name).c_str(), bases.ptr(), nullptr));
  };
  pyb::object shape = make("ShapeError", "ValueError");
  pyb::object dtype = make("DTypeError", "TypeError");
  pyb::object device = make("DeviceError", "ValueError");
  pyb::object format = make("FormatError", "ValueError");
  pyb::object value = make("ArgumentError", "ValueError");
  pyb::object state = make("StateError", "RuntimeError");
  pyb::object memory = make("OutOfMemoryError", "MemoryError");
  pyb::object internal = make("InternalError", "RuntimeError");
  // A file that cannot be written: a FormatError as before, and the OSError a Python user catches.
  pyb::object file = pyb::reinterpret_steal<pyb::object>(PyErr_NewException(
      "kiln.FileError", pyb::make_tuple(format, builtins.attr("OSError")).ptr(), nullptr));
  m.attr("KilnError") = error, m.attr("ShapeError") = shape, m.attr("DTypeError") = dtype;
  m.attr("DeviceError") = device, m.attr("FormatError") = format, m.attr("ArgumentError") = value;
  m.attr("StateError") = state, m.attr("OutOfMemoryError") = memory, m.attr("InternalError") = internal;
  m.attr("FileError") = file;
  // Kept alive by the module; the translator looks them up there.
  pyb::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    pyb::module_ c = pyb::module_::import("kiln._C");
    auto raise = [&](const char* name, const std::exception& e) {
      PyErr_SetString(c.attr(name).ptr(), e.what());
    };
    try {
      std::rethrow_exception(p);
    } catch (const FileError& e) {
      raise("FileError", e);
    } catch (const ShapeError& e) {
      raise("ShapeError", e);
    } catch (const DTypeError& e) {
      raise("DTypeError", e);
    } catch (const DeviceError& e) {
      raise("DeviceError", e);
    } catch (const FormatError& e) {
      raise("FormatError", e);
    } catch (const ValueError& e) {
      raise("ArgumentError", e);
    } catch (const StateError& e) {
      raise("StateError", e);
    } catch (const MemoryError& e) {
      raise("OutOfMemoryError", e);
    } catch (const InternalError& e) {
      raise("InternalError", e);
    } catch (const Error& e) {
      raise("KilnError", e);
    } catch (const std::bad_alloc&) {  // a container's allocation: its size is not known here
      PyErr_SetString(c.attr("OutOfMemoryError").ptr(),
                      "out of memory on cpu: a host allocation failed (std::bad_alloc); free tensors or use "
                      "smaller batches");
    }
  });
}

}  // namespace

KILN_PY_BIND(0) {
  RegisterErrors(m);

  pyb::class_<Device>(m, "Device")
      .def_property_readonly("device_type", [](const Device& d) { return d.is_cpu() ? "cpu" : "gpu"; })
      .def_property_readonly("device_id", [](const Device& d) { return d.index; })
      .def("__eq__", [](const Device& a, pyb::object b) {
        return pyb::isinstance<Device>(b) && a == b.cast<const Device&>();
      })
      .def("__hash__", [](const Device& d) { return static_cast<int>(d.type) * 1024 + d.index; })
      .def("__repr__", [](const Device& d) { return (d.is_cpu() ? "cpu(" : "gpu(") + std::to_string(d.index) + ")"; })
      .def(pyb::pickle([](const Device& d) { return pyb::make_tuple(d.is_cpu(), d.index); },
                       [](pyb::tuple t) { return t[0].cast<bool>() ? cpu(t[1].cast<int>()) : gpu(t[1].cast<int>()); }));
  m.def("cpu", [](int i) { return cpu(i); }, pyb::arg("device_id") = 0);
  m.def("gpu", [](int i) { return gpu(i); }, pyb::arg("device_id") = 0);
  m.def("num_gpus", [] { return NumGPUs(); });
  m.def("built_with_cuda", [] { return cuda::CompiledWithCuda(); });
  m.def("gpu_memory_stats", [](int i) {
    CheckDeviceExists(gpu(i));
    return StatsDict(GetAllocator(gpu(i)).Stats());
  }, pyb::arg("device_id") = 0,
        "The caching allocator's statistics of gpu(device_id): bytes in use (peak), cached, reserved, "
        "fragmentation (share of reserved bytes holding no data), allocation and out-of-memory counts.");
  m.def("cpu_memory_stats", [](int i) { return StatsDict(GetAllocator(cpu(i)).Stats()); },
        pyb::arg("device_id") = 0,
        "The host pool's statistics of cpu(device_id), named as gpu_memory_stats's, with the pool's bound "
        "(cache_limit_bytes: KILN_CPU_POOL_MB) and how often it was trimmed to it (num_trims).");
  m.def("cuda_graph_stats", [] {
    exec::GraphCounters& c = exec::CudaGraphCounters();
    pyb::dict d;
    d["captures"] = c.captures.load(), d["replays"] = c.replays.load();
    d["plain_runs"] = c.plain_runs.load(), d["refused"] = c.refused.load();
    return d;
  }, "Counters of the CUDA graphs of compiled graphs on GPUs, process-wide: graphs captured, calls replayed "
     "from one, calls launched kernel by kernel, plans that stopped capturing (KILN_CUDA_GRAPHS).");
  m.def("dnn_algo_stats", [] {
    gpurt::AutotuneStats s = gpurt::GetAutotuneStats();
    pyb::dict d;
    d["measured"] = s.measured, d["memory_hits"] = s.memory_hits, d["disk_hits"] = s.disk_hits;
    d["disk_writes"] = s.disk_writes, d["heuristic"] = s.heuristic;
    return d;
  }, "How this process chose its GPU convolutions' cuDNN algorithms: problems measured, calls answered "
     "from memory, problems read from the disk cache (KILN_CACHE_DIR/dnn), choices written there, calls "
     "left to cuDNN's heuristics (while capturing, KILN_CUDNN_AUTOTUNE=0, nothing measurable).");
  m.def("set_math_mode", [](std::optional<std::string> conv, std::optional<std::string> matmul) {
    // Both are checked before either changes.
    auto parse = [](const char* what, const std::optional<std::string>& v) -> std::optional<int> {
      if (!v) return std::nullopt;
      if (*v == "tf32") return 1;
      if (*v == "float32") return 0;
      if (*v == "default") return -1;
      KILN_THROW(ValueError) << "set_math_mode(" << what << "='" << *v << "'): expected 'tf32' (TF32 tensor "
                             << "cores allowed), 'float32' (full float32) or 'default' (the environment's "
                             << (std::string(what) == "conv" ? "KILN_CONV_TF32" : "KILN_MATMUL_TF32") << ")";
    };
    const std::optional<int> c = parse("conv", conv), mm = parse("matmul", matmul);
    if (c) gpurt::SetTf32(gpurt::MathOp::kConv, *c);
    if (mm) gpurt::SetTf32(gpurt::MathOp::kMatmul, *mm);
  }, pyb::arg("conv") = pyb::none(), pyb::arg("matmul") = pyb::none(),
     "Which float32 math GPU convolutions and matmuls may use, as PyTorch's torch.backends.cudnn.allow_tf32 "
     "and torch.backends.cuda.matmul.allow_tf32: 'tf32' (TF32 tensor cores: inputs rounded to 10 mantissa "
     "bits, relative error ~1e-3), 'float32' (full float32) or 'default' (back to KILN_CONV_TF32, default "
     "tf32, and KILN_MATMUL_TF32, default float32); None leaves it. Later calls use it; a compiled plan "
     "captured as a CUDA graph under another mode is captured again.");
  m.def("math_mode", [] {
    pyb::dict d;
    d["conv"] = gpurt::Tf32Allowed(gpurt::MathOp::kConv) ? "tf32" : "float32";
    d["matmul"] = gpurt::Tf32Allowed(gpurt::MathOp::kMatmul) ? "tf32" : "float32";
    return d;
  }, "The float32 math GPU convolutions and matmuls use now: {'conv': 'tf32' or 'float32', 'matmul': ...}.");
  m.def("step_counters", [] {
    StepCounters c;
    {
      pyb::gil_scoped_release nogil;
      c = ReadStepCounters();  // waits for the work queued so far: it has run and been counted
    }
    pyb::dict d;
    for (const auto& [name, value] : c.Named()) d[name] = value;
    return d;
  }, "Process-wide step counters (kiln/runtime/step_counters.h) once the queued work has run: "
     "kiln.gpu_step_stats() reports their change over a step.");
  m.def("empty_cache", [] {
    pyb::gil_scoped_release nogil;
    engine::Engine::Get().Drain();  // tensors already dropped are given back by queued tasks
    EmptyAllCaches();
  }, "Waits for queued work (which gives back the memory of tensors already dropped), then gives the cached "
     "free blocks of every pool back to the system: the CPU devices', pinned host memory's and the GPUs' "
     "(tensors in use are untouched).");
  m.def("waitall", [] {
    pyb::gil_scoped_release nogil;
    engine::Engine::Get().WaitForAll();
  }, "Blocks until all queued work is done; raises the first error a task stored since the last waitall.");
  m.def("_drop_held_calls", [] { deferred::Drop(); },
        "Drops the compiled calls held back to be joined (frontend/deferred.h) without running them: at exit, "
        "after a wait that could not run them (out of memory).");
  m.def("seed", [](uint64_t s, bool this_thread) { ManualSeed(s, this_thread); }, pyb::arg("seed"),
        pyb::arg("this_thread") = false);
  m.def("env_switch", [](const std::string& name) { return env::Get(name.c_str()); }, pyb::arg("name"),
        "The value of a KILN_* switch declared in runtime/env.cc's table, or its default.");
  m.def("engine_stats", [] {
    engine::EngineStats s = engine::Engine::Get().Stats();
    pyb::dict d;
    d["pushed"] = s.pushed, d["completed"] = s.completed, d["pending"] = s.pending;
    d["peak_pending"] = s.peak_pending, d["pending_bytes"] = s.pending_bytes;
    d["peak_pending_bytes"] = s.peak_pending_bytes;
    return d;
  });
  m.def("dtype_names", [] {
    std::vector<std::string> v;
    for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                    DType::kInt64, DType::kUInt8, DType::kBool})
      v.push_back(DTypeName(t));
    return v;
  });
}

}  // namespace kiln::py

PYBIND11_MODULE(_C, m) {
  m.doc() = "kiln's C++ core: tensors, eager ops, autograd, the engine";
  auto& b = kiln::py::Binders();
  std::stable_sort(b.begin(), b.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& [priority, fn] : b) fn(m);
}
