// DLPack both ways: NDArray.__dlpack__ / __dlpack_device__ export an array to NumPy, PyTorch and
// any other consumer without copying, and kiln._C.from_dlpack wraps memory exported by them. The
// C ABI structs are written out here from the DLPack specification (v0.8, unversioned capsule
// named "dltensor", renamed "used_dltensor" by its consumer).
//
// Not done here: the versioned DLPack 1.0 capsule ("dltensor_versioned"), read-only flags, and
// CUDA stream handshakes: export waits for the array's queued work on the host instead.
#include <Python.h>

#include <mutex>
#include <vector>

#include "bind.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"

namespace kiln::py {
namespace {

// ---- the DLPack C ABI (dlpack.h v0.8) ----
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  ///< in elements; NULL means compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLDataType) == 4 && sizeof(DLDevice) == 8 && sizeof(DLTensor) == 48);

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

DLDataType ToDL(DType t) {
  switch (t) {
    case DType::kFloat32: return {kDLFloat, 32, 1};
    case DType::kFloat64: return {kDLFloat, 64, 1};
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kInt32: return {kDLInt, 32, 1};
    case DType::kInt64: return {kDLInt, 64, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kBool: return {kDLBool, 8, 1};
  }
  KILN_CHECK(false) << "unknown dtype";
  return {};
}

DType FromDL(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
    if (t.code == kDLFloat && t.bits == 64) return DType::kFloat64;
    if (t.code == kDLFloat && t.bits == 16) return DType::kFloat16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
    if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
    if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
    if (t.code == kDLUInt && t.bits == 8) return DType::kUInt8;
    if (t.code == kDLBool && t.bits == 8) return DType::kBool;
  }
  KILN_THROW(DTypeError) << "from_dlpack: DLPack dtype (code " << int(t.code) << ", bits " << int(t.bits)
                         << ", lanes " << t.lanes << ") has no kiln dtype; kiln holds float32/64/16, bfloat16, "
                         << "int32/64, uint8 and bool: convert the array (e.g. .astype) before exporting it";
  return DType::kFloat32;
}

// ---- export ----

// Owns what the consumer sees: a reference to the tensor (keeping its storage alive) and the
// shape and strides arrays the DLTensor points at.
struct Exported {
  DLManagedTensor managed{};
  Tensor tensor;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};

void DeleteExported(DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); }

// Runs when the capsule dies: frees the export unless a consumer took it (and renamed it).
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (m && m->deleter) m->deleter(m);
  else if (!m) PyErr_WriteUnraisable(capsule);
  PyErr_Restore(type, value, traceback);
}

// Blocks until every queued read and write of t's storage is done, so that the consumer may both
// read and write the memory; rethrows the error of a failed op that wrote it.
void WaitForAllUses(const Tensor& t) {
  engine::Engine& e = engine::Engine::Get();
  t.WaitToRead();  // first: a task that writes the variable (the barrier below) would clear its error
  engine::Var* w[1] = {t.storage()->var()};
  engine::TaskOptions o;
  o.name = "__dlpack__";
  o.device = t.device();
  e.Push([] {}, {}, w, o);  // a write orders after every earlier read and write of the storage
  e.WaitForVar(w[0]);
}

pyb::object ToDLPack(const Tensor& t, pyb::handle stream, pyb::handle copy) {
  (void)stream;  // kiln has waited on the host for all the array's work: any consumer stream may read it
  Tensor src = !copy.is_none() && copy.cast<bool>() ? t.To(t.device(), /*copy=*/true) : t;
  for (int i = 0; i < src.rank(); ++i)
    if (src.strides()[i] < 0)  // DLPack allows them, but consumers such as PyTorch abort on them
      throw pyb::buffer_error("__dlpack__: this view has negative strides (a reversed slice), which DLPack "
                              "consumers such as PyTorch cannot take; export x.copy(), or pass copy=True");
  {
    pyb::gil_scoped_release nogil;
    WaitForAllUses(src);
  }
  auto* ex = new Exported();
  ex->tensor = src;
  DLTensor& dl = ex->managed.dl_tensor;
  dl.data = src.View().data;
  dl.device = {src.device().is_cpu() ? kDLCPU : kDLCUDA, static_cast<int32_t>(src.device().index)};
  dl.ndim = src.rank();
  dl.dtype = ToDL(src.dtype());
  for (int i = 0; i < src.rank(); ++i) ex->shape[i] = src.shape()[i], ex->strides[i] = src.strides()[i];
  dl.shape = ex->shape;
  dl.strides = ex->strides;
  dl.byte_offset = 0;
  ex->managed.manager_ctx = ex;
  ex->managed.deleter = &DeleteExported;
  PyObject* capsule = PyCapsule_New(&ex->managed, kCapsuleName, &CapsuleDestructor);
  if (!capsule) {
    delete ex;
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::object>(capsule);
}

pyb::tuple DLPackDevice(const Tensor& t) {
  return pyb::make_tuple(static_cast<int>(t.device().is_cpu() ? kDLCPU : kDLCUDA), t.device().index);
}

// ---- import ----

// The producer's deleter may touch Python objects (NumPy's drops a reference to the array), so it
// runs with the GIL. A storage can die on an engine worker while the main thread holds the GIL and
// waits for that worker (backpressure); such deletes are handed to the main thread instead.
std::mutex g_pending_mu;
std::vector<DLManagedTensor*>* g_pending = new std::vector<DLManagedTensor*>();  // leaked: used at exit
bool g_drain_scheduled = false;

int DrainPending(void*) {
  std::vector<DLManagedTensor*> todo;
  {
    std::lock_guard<std::mutex> g(g_pending_mu);
    todo.swap(*g_pending);
    g_drain_scheduled = false;
  }
  for (DLManagedTensor* m : todo) m->deleter(m);
  return 0;
}

void ReleaseProducer(DLManagedTensor* m) {
  if (!m->deleter) return;
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // at exit the producer may be gone: leak
  if (PyGILState_Check()) {
    m->deleter(m);
    return;
  }
  std::lock_guard<std::mutex> g(g_pending_mu);
  g_pending->push_back(m);
  if (!g_drain_scheduled) g_drain_scheduled = Py_AddPendingCall(&DrainPending, nullptr) == 0;
}

Tensor FromDLPack(pyb::object obj) {
  DrainPending(nullptr);  // also retries deletes whose pending call could not be scheduled
  pyb::object capsule = obj;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (!pyb::hasattr(obj, "__dlpack__"))
      throw pyb::type_error(std::string("from_dlpack: expected an object with __dlpack__ or a DLPack capsule, got ") +
                            Py_TYPE(obj.ptr())->tp_name);
    capsule = obj.attr("__dlpack__")();
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  if (!m) {
    PyErr_Clear();
    KILN_THROW(ValueError) << "from_dlpack: the capsule is not a fresh '" << kCapsuleName
                           << "' capsule (a DLPack capsule can be consumed only once; call __dlpack__() again)";
  }
  if (m->deleter == &DeleteExported) {  // kiln's own export: share the storage and its engine variable
    Tensor t = static_cast<Exported*>(m->manager_ctx)->tensor;
    PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
    m->deleter(m);
    return t;
  }
  const DLTensor& dl = m->dl_tensor;
  // Validate before taking ownership: on error the capsule (and its destructor) stay with the producer.
  Device device;
  if (dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDAHost) device = cpu();
  else if (dl.device.device_type == kDLCUDA) device = gpu(dl.device.device_id);
  else
    KILN_THROW(DeviceError) << "from_dlpack: DLPack device type " << dl.device.device_type
                            << " is not supported; kiln takes CPU (1), CUDA (2) and CUDA host (3) memory";
  DType dtype = FromDL(dl.dtype);
  if (dl.ndim < 0 || dl.ndim > kMaxRank)
    KILN_THROW(ShapeError) << "from_dlpack: the array has " << dl.ndim << " dimensions; kiln tensors have at most "
                           << kMaxRank;
  std::vector<int64_t> shape(dl.shape, dl.shape + dl.ndim), strides(dl.ndim);
  int64_t acc = 1;
  for (int i = dl.ndim - 1; i >= 0; --i) {
    strides[i] = dl.strides ? dl.strides[i] : acc;
    acc *= shape[i];
  }
  // The span of elements the view touches; negative strides start below the first element.
  int64_t numel = 1, lo = 0, hi = 0;
  for (int i = 0; i < dl.ndim; ++i) {
    numel *= shape[i];
    int64_t reach = (shape[i] - 1) * strides[i];
    (reach < 0 ? lo : hi) += reach;
  }
  size_t esize = DTypeSize(dtype);
  char* first = static_cast<char*>(dl.data) + dl.byte_offset;
  char* base = numel == 0 ? first : first + lo * static_cast<int64_t>(esize);
  size_t nbytes = numel == 0 ? 0 : static_cast<size_t>(hi - lo + 1) * esize;

  PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
  auto storage = std::make_shared<Storage>(base, nbytes, device, [m](void*) { ReleaseProducer(m); });
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = -lo;
  impl->shape = Shape(shape);
  impl->strides = Strides(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace

KILN_PY_BIND(15) {
  pyb::object cls = m.attr("NDArray");
  cls.attr("__dlpack__") = pyb::cpp_function(
      [](const Tensor& t, pyb::handle stream, pyb::handle max_version, pyb::handle dl_device, pyb::handle copy) {
        (void)max_version;  // an unversioned capsule is what a v0.8 producer answers
        if (!dl_device.is_none() && !DLPackDevice(t).equal(pyb::tuple(pyb::reinterpret_borrow<pyb::object>(dl_device))))
          throw pyb::buffer_error("__dlpack__: exporting to another device is not supported; use to_device() first");
        return ToDLPack(t, stream, copy);
      },
      pyb::name("__dlpack__"), pyb::is_method(cls), pyb::kw_only(), pyb::arg("stream") = pyb::none(),
      pyb::arg("max_version") = pyb::none(), pyb::arg("dl_device") = pyb::none(), pyb::arg("copy") = pyb::none(),
      R"(A DLPack capsule sharing this array's memory (strided views keep their strides).
Waits for every queued op that reads or writes the array first, and rethrows the error of a failed
one; the capsule keeps the memory alive until its consumer is done with it.)");
  cls.attr("__dlpack_device__") = pyb::cpp_function(&DLPackDevice, pyb::name("__dlpack_device__"),
                                                    pyb::is_method(cls), "(device_type, device_id) as DLPack numbers.");
  m.def("from_dlpack", &FromDLPack, pyb::arg("obj"),
        R"(An NDArray sharing the memory of `obj` (anything with __dlpack__, or a DLPack capsule).
No copy is made: strided and negatively strided sources become strided views. Writes through
either side are visible to the other once kiln's queued ops are done (wait_to_read / waitall).)");
  m.def("to_dlpack", [](const Tensor& t) { return ToDLPack(t, pyb::none(), pyb::none()); }, pyb::arg("x"),
        "The DLPack capsule of x (as x.__dlpack__()).");
}

}  // namespace kiln::py
