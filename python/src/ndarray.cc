// kiln._C.NDArray (the C++ Tensor) and the eager ops of kiln::nd. Operators are CPython number
// slots written here, so that `a + b` from Python costs a type check on top of the C++ dispatch;
// they also apply the Python-side dtype rules nd:: cannot see (the kind of a scalar operand, true
// division). Their results are made, and NDArrays freed, without pybind11's per-object type
// lookups; the elementwise module functions (nd.relu, nd.add, ...) likewise bypass pybind11's
// dispatcher for plain calls. Indexing and the friendlier signatures live in
// python/kiln/ndarray.py; DLPack in dlpack.cc.
#include <cstdint>
#include <cstring>
#include <string>

#include "bind.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/error.h"

namespace kiln::py {
namespace {

using nd::Axes;

// ---- operators: CPython number slots, bypassing pybind11's overload dispatch ----
// `a + b` is the hottest call from Python. The NDArray type's nb_add (etc.) slots point straight at
// the functions below: no argument loaders, no overload resolution, one type check per operand
// and one pybind11 instance per result. The dunder methods stay defined (they call the same code)
// so that `a.__add__(b)`, NumPy's deferral (__array_priority__) and Python subclasses work.

PyTypeObject* g_ndarray_type = nullptr;
const pyb::detail::type_info* g_ndarray_tinfo = nullptr;
PyObject* g_numpy_generic = nullptr;  // numpy.generic: NumPy scalars count as Python scalars

bool g_simple_layout = false;  // NDArray instances have pybind11's simple layout (InstallOperatorSlots)

const Tensor* AsTensor(PyObject* o) {
  if (Py_TYPE(o) == g_ndarray_type && g_simple_layout)  // the value pointer, as get_value_and_holder reads it
    return static_cast<const Tensor*>(reinterpret_cast<pyb::detail::instance*>(o)->simple_value_holder[0]);
  if (Py_TYPE(o) != g_ndarray_type && !PyType_IsSubtype(Py_TYPE(o), g_ndarray_type)) return nullptr;
  auto* inst = reinterpret_cast<pyb::detail::instance*>(o);
  return inst->get_value_and_holder(g_ndarray_tinfo, false).value_ptr<Tensor>();
}

// The result of an operator as a new NDArray. pybind11's own cast looks the type up by its C++
// type name twice (init_instance) and by its Python type once (allocate_layout) per object, and
// registers the object in a global hash map; NDArray has the simple layout (one C++ type, its
// holder inline), so the instance is set up here directly, as those functions would, without the
// registration. That map serves only to hand back the same Python object when C++ returns a
// reference to the very Tensor a wrapper owns; no kiln binding does (copyto returns its argument).
using Holder = std::unique_ptr<Tensor>;

// Results are not entered in pybind11's registered-instance map (a tenth of the per-op cost):
// a binding that returns a reference or pointer to a Tensor a Python object already owns would
// get a new object (or a dangling one); return the owning Python object itself instead, as
// copyto does.
PyObject* Wrap(Tensor&& t) {
  if (!g_simple_layout) {
    auto move = [](const void* p) -> void* {
      return new Tensor(std::move(*const_cast<Tensor*>(static_cast<const Tensor*>(p))));
    };
    return pyb::detail::type_caster_generic::cast(&t, pyb::return_value_policy::move, nullptr,
                                                  g_ndarray_tinfo, nullptr, move)
        .ptr();
  }
  Holder holder(new Tensor(std::move(t)));
  PyObject* self = g_ndarray_type->tp_alloc(g_ndarray_type, 0);  // zeroed: no weakrefs, no patients
  if (!self) throw pyb::error_already_set();
  auto* inst = reinterpret_cast<pyb::detail::instance*>(self);
  Tensor* value = holder.get();
  inst->simple_layout = true;
  inst->owned = true;
  inst->simple_value_holder[0] = value;
  new (&inst->simple_value_holder[1]) Holder(std::move(holder));
  inst->simple_holder_constructed = true;
  return self;
}

// tp_dealloc of NDArray: pybind11_object_dealloc without its type lookups, for instances Wrap or
// pybind11 made with the simple layout; anything else (subclasses, a pending Python error that the
// destructor must not see, weak references, kept-alive patients) goes to pybind11's own.
destructor g_pybind11_dealloc = nullptr;

void NDArrayDealloc(PyObject* self) {
  auto* inst = reinterpret_cast<pyb::detail::instance*>(self);
  PyTypeObject* type = Py_TYPE(self);
  if (type != g_ndarray_type || !inst->simple_layout || !inst->simple_holder_constructed || inst->weakrefs ||
      inst->has_patients || PyErr_Occurred())
    return g_pybind11_dealloc(self);
  void* value = inst->simple_value_holder[0];
  if (inst->simple_instance_registered && !pyb::detail::deregister_instance(inst, value, g_ndarray_tinfo))
    pyb::pybind11_fail("pybind11_object_dealloc(): Tried to deallocate unregistered instance!");
  reinterpret_cast<Holder*>(&inst->simple_value_holder[1])->~Holder();
  type->tp_free(self);
  Py_DECREF(type);
}

// Python bool/int/float and NumPy scalars of those kinds (value-based, as NumPy 1.x treats them).
enum class ScalarKind { kNone, kBool, kInt, kFloat };
PyObject* g_numpy_bool = nullptr;
PyObject* g_numpy_integer = nullptr;
PyObject* g_numpy_floating = nullptr;

ScalarKind AsScalar(PyObject* o, double* v) {
  if (PyFloat_Check(o)) {  // also numpy.float64
    *v = PyFloat_AS_DOUBLE(o);
    return ScalarKind::kFloat;
  }
  if (PyLong_Check(o)) {
    *v = PyLong_AsDouble(o);
    if (*v == -1.0 && PyErr_Occurred()) return ScalarKind::kNone;
    return PyBool_Check(o) ? ScalarKind::kBool : ScalarKind::kInt;
  }
  if (!g_numpy_generic || PyObject_IsInstance(o, g_numpy_generic) != 1) return ScalarKind::kNone;
  ScalarKind kind = PyObject_IsInstance(o, g_numpy_floating) == 1  ? ScalarKind::kFloat
                    : PyObject_IsInstance(o, g_numpy_integer) == 1 ? ScalarKind::kInt
                    : PyObject_IsInstance(o, g_numpy_bool) == 1    ? ScalarKind::kBool
                                                                   : ScalarKind::kNone;
  if (kind == ScalarKind::kNone) return kind;
  *v = PyFloat_AsDouble(o);
  if (*v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return ScalarKind::kNone;
  }
  return kind;
}

// NumPy arrays, lists and tuples become tensors on the other operand's device.
bool IsArrayLike(PyObject* o) {
  return PyList_Check(o) || PyTuple_Check(o) || PyObject_HasAttrString(o, "__array_interface__");
}

PyObject* Raise() {
  // The translators pybind11 applies to its own functions (kiln's typed errors among them).
  if (pyb::detail::apply_exception_translators(pyb::detail::get_local_internals().registered_exception_translators))
    return nullptr;
  if (pyb::detail::apply_exception_translators(pyb::detail::get_internals().registered_exception_translators))
    return nullptr;
  PyErr_SetString(PyExc_SystemError, "kiln: an unknown C++ exception escaped an NDArray operator");
  return nullptr;
}

enum class Op { kAdd, kSub, kMul, kDiv, kPow, kEq, kNe, kLt, kLe, kGt, kGe, kMod, kFloorDiv };

// True division of integers gives float32 (kiln's default float, as for `int_array * 2.5`);
// nd::divide itself divides integers as C++ does.
Tensor ForDivision(const Tensor& t) { return IsFloat(t.dtype()) ? t : t.AsType(DType::kFloat32); }

// `a // b` and `a % b` with NumPy's (and Python's) semantics: the quotient rounds toward minus
// infinity and the remainder takes the sign of the divisor, so a == (a // b) * b + a % b. Composed
// of kiln's ops (no kernel of their own), so they differentiate, hybridize and run on every device
// as those do: floats as floor(a / b) and a - floor(a / b) * b (b == 0 gives inf/nan, as NumPy);
// integers from C++'s truncating division, one step down where the remainder's sign differs from
// the divisor's (b == 0 is the integer division's ValueError). bool operands count as int64.
Tensor Numeric(const Tensor& t) { return t.dtype() == DType::kBool ? t.AsType(DType::kInt64) : t; }
double Numeric(double v) { return v; }
bool FloatOperand(const Tensor& t) { return IsFloat(t.dtype()); }
bool FloatOperand(double) { return false; }  // a float scalar has already made the tensor float
Tensor SignOf(const Tensor& t) { return nd::sign(t); }
double SignOf(double v) { return static_cast<double>((v > 0) - (v < 0)); }

template <class A, class B>
Tensor FloorDivMod(bool want_mod, const A& a_in, const B& b_in) {
  auto a = Numeric(a_in);
  auto b = Numeric(b_in);
  if (FloatOperand(a) || FloatOperand(b)) {
    Tensor q = nd::stop_gradient(nd::floor(nd::divide(a, b)));  // floor's gradient is zero
    return want_mod ? nd::subtract(a, nd::multiply(q, b)) : q;
  }
  Tensor q = nd::divide(a, b);  // truncated toward zero
  Tensor r = nd::subtract(a, nd::multiply(q, b));
  // One step down where the remainder is nonzero and its sign differs from the divisor's.
  Tensor down = nd::less(nd::multiply(nd::sign(r), SignOf(b)), 0.0).AsType(q.dtype());
  return want_mod ? nd::add(r, nd::multiply(down, b)) : nd::subtract(q, down);
}

template <class A, class B>
Tensor Apply(Op op, const A& a, const B& b) {
  switch (op) {
    case Op::kMod: return FloorDivMod(true, a, b);
    case Op::kFloorDiv: return FloorDivMod(false, a, b);
    case Op::kAdd: return nd::add(a, b);
    case Op::kSub: return nd::subtract(a, b);
    case Op::kMul: return nd::multiply(a, b);
    case Op::kDiv: return nd::divide(a, b);
    case Op::kPow: return nd::power(a, b);
    case Op::kEq: return nd::equal(a, b);
    case Op::kNe: return nd::not_equal(a, b);
    case Op::kLt: return nd::less(a, b);
    case Op::kLe: return nd::less_equal(a, b);
    case Op::kGt: return nd::greater(a, b);
    case Op::kGe: return nd::greater_equal(a, b);
  }
  KILN_CHECK(false) << "unknown operator";
  return Tensor();
}

// The tensor operand of `tensor op scalar`, converted as NumPy's kinds order them (bool < int <
// float): a float scalar makes an integer tensor float32 (kiln's default float, as in PyTorch), an
// int scalar makes a bool tensor int64. nd:: would look at the value only (int32 + 2.0 -> int32).
Tensor ForScalar(Op op, const Tensor& t, ScalarKind kind) {
  if (op == Op::kDiv || (kind == ScalarKind::kFloat && !IsFloat(t.dtype()))) return ForDivision(t);
  if (kind == ScalarKind::kInt && t.dtype() == DType::kBool) return t.AsType(DType::kInt64);
  return t;
}

// kiln.IntegerOverflowError: an ArgumentError (ValueError) that is also an OverflowError, as
// NumPy 2 raises for a Python integer that does not fit an integer array's dtype (NEP 50).
PyObject* g_integer_overflow = nullptr;

// Sets IntegerOverflowError and returns false when `o` is a Python int (not bool) outside the
// range of the integer dtype `dt` (what it would silently wrap to). Floats and comparisons are
// left alone: NumPy 2 compares out-of-range integers exactly and converts for floats.
bool IntegerFits(PyObject* o, DType dt, const char* what) {
  if (!PyLong_Check(o) || PyBool_Check(o) || IsFloat(dt) || dt == DType::kBool) return true;
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return false;
  long long lo = 0, hi = 0;
  switch (dt) {
    case DType::kInt32: lo = INT32_MIN, hi = INT32_MAX; break;
    case DType::kInt64: lo = INT64_MIN, hi = INT64_MAX; break;
    case DType::kUInt8: lo = 0, hi = 255; break;
    default: return true;
  }
  if (overflow == 0 && v >= lo && v <= hi) return true;
  pyb::str text = pyb::str(pyb::handle(o));
  PyErr_Format(g_integer_overflow,
               "Python integer %s out of bounds for %s: %s with an %s array needs a value in [%lld, %lld]; "
               "cast the array to a wider dtype first (e.g. .astype('int64') or 'float64')",
               text.cast<std::string>().c_str(), DTypeName(dt), what, DTypeName(dt), lo, hi);
  return false;
}

bool IsArithmetic(Op op) {
  return op == Op::kAdd || op == Op::kSub || op == Op::kMul || op == Op::kPow || op == Op::kMod ||
         op == Op::kFloorDiv;
}

const char* OpWord(Op op) {
  switch (op) {
    case Op::kAdd: return "adding it";
    case Op::kSub: return "subtracting it";
    case Op::kMul: return "multiplying by it";
    case Op::kPow: return "raising to it";
    case Op::kMod: return "taking the remainder by it";
    case Op::kFloorDiv: return "dividing by it";
    default: return "combining it";
  }
}

Tensor ApplyTT(Op op, const Tensor& a, const Tensor& b) {
  if (op == Op::kDiv && !IsFloat(a.dtype()) && !IsFloat(b.dtype())) return Apply(op, ForDivision(a), ForDivision(b));
  return Apply(op, a, b);
}

// The result of `l op r`, or NotImplemented when neither side is something kiln computes with.
PyObject* BinarySlot(Op op, PyObject* l, PyObject* r) {
  try {
    const Tensor* a = AsTensor(l);
    const Tensor* b = AsTensor(r);
    if (a && b) return Wrap(ApplyTT(op, *a, *b));
    double v;
    ScalarKind kind;
    if (a && (kind = AsScalar(r, &v)) != ScalarKind::kNone) {
      Tensor t = ForScalar(op, *a, kind);
      if (IsArithmetic(op) && !IntegerFits(r, t.dtype(), OpWord(op))) return nullptr;
      return Wrap(Apply(op, t, v));
    }
    if (b && (kind = AsScalar(l, &v)) != ScalarKind::kNone) {
      Tensor t = ForScalar(op, *b, kind);
      if (IsArithmetic(op) && !IntegerFits(l, t.dtype(), OpWord(op))) return nullptr;
      return Wrap(Apply(op, v, t));
    }
    if (PyErr_Occurred()) return nullptr;
    if (a && IsArrayLike(r)) return Wrap(ApplyTT(op, *a, ToTensor(r, a->device())));
    if (b && IsArrayLike(l)) return Wrap(ApplyTT(op, ToTensor(l, b->device()), *b));
  } catch (...) {
    return Raise();
  }
  Py_RETURN_NOTIMPLEMENTED;
}

// In place as in MXNet: the result is written into a's storage (a keeps its identity; a view
// writes through to its base array).
PyObject* InplaceSlot(Op op, PyObject* l, PyObject* r) {
  const Tensor* a = AsTensor(l);
  if (!a) Py_RETURN_NOTIMPLEMENTED;
  PyObject* res = BinarySlot(op, l, r);
  if (!res || res == Py_NotImplemented) return res;
  try {
    Tensor out = *AsTensor(res);
    Py_DECREF(res);
    if (out.shape() != a->shape())
      KILN_THROW(ShapeError) << "in-place operator: the result has shape " << out.shape().str()
                             << ", which cannot be written into the left operand of shape " << a->shape().str()
                             << "; use the out-of-place operator";
    out.AsType(a->dtype()).CopyTo(*a);
  } catch (...) {
    return Raise();
  }
  Py_INCREF(l);
  return l;
}

#define KILN_SLOT(name, op)                                                \
  PyObject* name(PyObject* l, PyObject* r) { return BinarySlot(op, l, r); } \
  PyObject* name##_inplace(PyObject* l, PyObject* r) { return InplaceSlot(op, l, r); }
KILN_SLOT(SlotAdd, Op::kAdd) KILN_SLOT(SlotSub, Op::kSub) KILN_SLOT(SlotMul, Op::kMul) KILN_SLOT(SlotDiv, Op::kDiv)
KILN_SLOT(SlotMod, Op::kMod) KILN_SLOT(SlotFloorDiv, Op::kFloorDiv)
#undef KILN_SLOT

PyObject* SlotPow(PyObject* l, PyObject* r, PyObject* mod) {
  if (mod != Py_None) Py_RETURN_NOTIMPLEMENTED;
  return BinarySlot(Op::kPow, l, r);
}

// divmod(a, b): (a // b, a % b).
PyObject* SlotDivmod(PyObject* l, PyObject* r) {
  PyObject* q = BinarySlot(Op::kFloorDiv, l, r);
  if (!q || q == Py_NotImplemented) return q;
  PyObject* m = BinarySlot(Op::kMod, l, r);
  if (!m || m == Py_NotImplemented) {
    Py_DECREF(q);
    return m;
  }
  PyObject* t = PyTuple_Pack(2, q, m);
  Py_DECREF(q), Py_DECREF(m);
  return t;
}

PyObject* SlotCompare(PyObject* l, PyObject* r, int cmp) {
  static constexpr Op kOps[] = {Op::kLt, Op::kLe, Op::kEq, Op::kNe, Op::kGt, Op::kGe};  // Py_LT .. Py_GE
  return BinarySlot(kOps[cmp], l, r);
}

pyb::object Steal(PyObject* p) {
  if (!p) throw pyb::error_already_set();
  return pyb::reinterpret_steal<pyb::object>(p);
}

void InstallOperatorSlots(pyb::class_<Tensor>& cls) {
  g_ndarray_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  g_ndarray_tinfo = pyb::detail::get_type_info(g_ndarray_type);
  pyb::module_ np = pyb::module_::import("numpy");
  g_numpy_generic = pyb::object(np.attr("generic")).release().ptr();
  g_numpy_bool = pyb::object(np.attr("bool_")).release().ptr();
  g_numpy_integer = pyb::object(np.attr("integer")).release().ptr();
  g_numpy_floating = pyb::object(np.attr("floating")).release().ptr();
  // Wrap's and NDArrayDealloc's preconditions, as pybind11's allocate_layout decides the layout.
  g_simple_layout = pyb::detail::all_type_info(g_ndarray_type).size() == 1 &&
                    g_ndarray_tinfo->holder_size_in_ptrs <= pyb::detail::instance_simple_holder_in_ptrs() &&
                    g_ndarray_tinfo->simple_ancestors && g_ndarray_type->tp_dictoffset == 0 &&
                    !PyType_HasFeature(g_ndarray_type, Py_TPFLAGS_HAVE_GC);
  if (g_simple_layout) {
    g_pybind11_dealloc = g_ndarray_type->tp_dealloc;
    g_ndarray_type->tp_dealloc = NDArrayDealloc;
  }
  PyNumberMethods* n = g_ndarray_type->tp_as_number;
  n->nb_add = SlotAdd, n->nb_subtract = SlotSub, n->nb_multiply = SlotMul, n->nb_true_divide = SlotDiv;
  n->nb_inplace_add = SlotAdd_inplace, n->nb_inplace_subtract = SlotSub_inplace;
  n->nb_inplace_multiply = SlotMul_inplace, n->nb_inplace_true_divide = SlotDiv_inplace;
  n->nb_power = SlotPow;
  n->nb_remainder = SlotMod, n->nb_floor_divide = SlotFloorDiv, n->nb_divmod = SlotDivmod;
  n->nb_inplace_remainder = SlotMod_inplace, n->nb_inplace_floor_divide = SlotFloorDiv_inplace;
  g_ndarray_type->tp_richcompare = SlotCompare;
  PyType_Modified(g_ndarray_type);
}

// ---- module functions without pybind11's dispatcher ----
// nd.relu(x), nd.add(a, b) and the like: pybind11's dispatcher (argument loaders, overload
// resolution, the generic result cast) costs more than a tiny op itself. Each of these functions is
// replaced by a vectorcall builtin that serves the plain call (positional NDArray operands) itself
// and hands any other call to the pybind11 function it replaces, so conversions, keyword
// arguments and error messages stay exactly as they were.
struct FastFunction {
  PyMethodDef def{};
  PyObject* fallback = nullptr;  // the pybind11 function (a reference held for the process)
  Tensor (*unary)(const Tensor&) = nullptr;
  Op binary = Op::kAdd;  // when `unary` is null
};

PyObject* CallFast(PyObject* self, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  auto* f = static_cast<FastFunction*>(PyCapsule_GetPointer(self, nullptr));
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (f && !kwnames) {
    if (f->unary && n == 1) {
      if (const Tensor* x = AsTensor(args[0])) {
        try {
          return Wrap(f->unary(*x));
        } catch (...) {
          return Raise();
        }
      }
    } else if (!f->unary && n == 2 && (AsTensor(args[0]) || AsTensor(args[1]))) {
      PyObject* r = BinarySlot(f->binary, args[0], args[1]);
      if (r != Py_NotImplemented) return r;
      Py_DECREF(r);  // the pybind11 function raises the error
    }
  }
  if (!f) return nullptr;
  return PyObject_Vectorcall(f->fallback, args, nargsf, kwnames);
}

void InstallFast(pyb::module_& m, const char* name, FastFunction* f) {
  pyb::object fallback = m.attr(name);
  pyb::object doc = fallback.attr("__doc__");
  f->fallback = fallback.release().ptr();
  f->def.ml_name = name;
  f->def.ml_meth = reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&CallFast));
  f->def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
  f->def.ml_doc = doc.is_none() ? nullptr : strdup(doc.cast<std::string>().c_str());  // lives as long
  pyb::object self = Steal(PyCapsule_New(f, nullptr, nullptr));
  m.attr(name) = Steal(PyCFunction_NewEx(&f->def, self.ptr(), m.attr("__name__").ptr()));
}

// item() as a Python number, exact for int64 (Tensor::Item goes through double).
pyb::object ItemObject(const Tensor& t) {
  if (t.numel() != 1)
    KILN_THROW(ShapeError) << "item(): the array has " << t.numel() << " elements " << t.shape().str()
                           << "; item() needs exactly one";
  alignas(8) unsigned char buf[8] = {};
  {
    pyb::gil_scoped_release nogil;
    t.CopyToHost(buf);
  }
  auto get = [&](auto v) {
    std::memcpy(&v, buf, sizeof(v));
    return v;
  };
  switch (t.dtype()) {
    case DType::kFloat32: return pyb::float_(get(float{}));
    case DType::kFloat64: return pyb::float_(get(double{}));
    case DType::kFloat16: return pyb::float_(static_cast<float>(get(Half{})));
    case DType::kBFloat16: return pyb::float_(static_cast<float>(get(BFloat16{})));
    case DType::kInt32: return pyb::int_(get(int32_t{}));
    case DType::kInt64: return pyb::int_(get(int64_t{}));
    case DType::kUInt8: return pyb::int_(buf[0]);
    case DType::kBool: return pyb::bool_(buf[0] != 0);
  }
  return pyb::none();
}

Axes AxesOrAll(pyb::handle axis) {
  if (axis.is_none()) return {};
  return ToInts(axis);
}

pyb::array AsNumpy(const Tensor& t) {
  std::vector<ssize_t> dims(t.shape().begin(), t.shape().end());
  pyb::array out(NumpyDType(t.dtype()), dims);
  Tensor src = t.dtype() == DType::kBFloat16 ? t.AsType(DType::kFloat32) : t;
  {
    pyb::gil_scoped_release nogil;
    src.CopyToHost(out.mutable_data());
  }
  return out;
}

}  // namespace

KILN_PY_BIND(10) {
  {
    pyb::tuple bases = pyb::make_tuple(m.attr("ArgumentError"), pyb::module_::import("builtins").attr("OverflowError"));
    g_integer_overflow = PyErr_NewException("kiln.IntegerOverflowError", bases.ptr(), nullptr);
    m.attr("IntegerOverflowError") = pyb::handle(g_integer_overflow);  // the module keeps a reference
  }
  pyb::class_<Tensor> cls(m, "NDArray", R"(An n-dimensional array on a device. Ops on it are queued on the
engine and return at once; asnumpy(), item() and wait_to_read() wait for the result.)");
  cls.def_property_readonly("shape", [](const Tensor& t) {
       pyb::tuple s(t.rank());
       for (int i = 0; i < t.rank(); ++i) s[i] = t.shape()[i];
       return s;
     })
      .def_property_readonly("_dtype_name", [](const Tensor& t) { return DTypeName(t.dtype()); })
      .def_property_readonly("device", &Tensor::device)
      .def_property_readonly("context", &Tensor::device)
      .def_property_readonly("ctx", &Tensor::device)
      .def_property_readonly("ndim", &Tensor::rank)
      .def_property_readonly("size", &Tensor::numel)
      .def_property_readonly("grad", [](const Tensor& t) -> pyb::object {
        Tensor g = t.grad();
        return g.defined() ? pyb::cast(g) : pyb::none();
      })
      .def_property("_fresh_grad", [](const Tensor& t) { return autograd::GradFresh(t); },
                    [](const Tensor& t, bool fresh) { autograd::SetGradFresh(t, fresh); },
                    "True once a backward wrote this array's gradient, until a Trainer step consumes it "
                    "(code that writes .grad itself may set it, as in Gluon).")
      .def_property_readonly("grad_req", [](const Tensor& t) {
        switch (t.grad_req()) {
          case GradReq::kWrite: return "write";
          case GradReq::kAdd: return "add";
          default: return "null";
        }
      })
      .def("asnumpy", &AsNumpy, "Copies the array to a NumPy array (waits for the result).")
      .def("item", &ItemObject, "The value of a one-element array as a Python number (waits).")
      .def("wait_to_read", [](const Tensor& t) {
        pyb::gil_scoped_release nogil;
        t.WaitToRead();
      })
      .def("astype", [](const Tensor& t, pyb::handle dtype, bool copy) {
        DType d = ToDType(dtype);
        if (d != t.dtype()) return t.AsType(d);
        return copy ? t.To(t.device(), /*copy=*/true) : t;
      }, pyb::arg("dtype"), pyb::arg("copy") = true)
      .def("to_device", [](const Tensor& t, const Device& d) { return t.To(d); })
      .def("as_in_context", [](const Tensor& t, const Device& d) { return t.To(d); })
      .def("as_in_ctx", [](const Tensor& t, const Device& d) { return t.To(d); })
      .def("copy", [](const Tensor& t) { return t.To(t.device(), /*copy=*/true); })
      .def("copyto", [](const Tensor& t, pyb::handle dst) -> pyb::object {
        if (pyb::isinstance<Device>(dst)) return pyb::cast(t.To(dst.cast<const Device&>(), true));
        const Tensor& d = dst.cast<const Tensor&>();
        t.CopyTo(d);
        return pyb::reinterpret_borrow<pyb::object>(dst);
      }, "Copies into another NDArray (same shape) or onto a device; returns the destination.")
      .def("attach_grad", [](Tensor& t, const std::string& req) {
        GradReq r = req == "write" ? GradReq::kWrite : req == "add" ? GradReq::kAdd : GradReq::kNull;
        if (req != "write" && req != "add" && req != "null")
          KILN_THROW(ValueError) << "attach_grad: grad_req must be 'write', 'add' or 'null', got '" << req << "'";
        t.AttachGrad(r);
      }, pyb::arg("grad_req") = "write")
      .def("backward", [](const Tensor& t, std::optional<Tensor> out_grad, bool retain_graph, bool train_mode) {
        pyb::gil_scoped_release nogil;
        t.Backward(out_grad.value_or(Tensor()), retain_graph);
      }, pyb::arg("out_grad") = pyb::none(), pyb::arg("retain_graph") = false, pyb::arg("train_mode") = true)
      .def("detach", &Tensor::Detach)
      .def("_reshape", [](const Tensor& t, pyb::handle shape) { return nd::reshape(t, ToInts(shape)); })
      .def("_transpose", [](const Tensor& t, pyb::handle axes) { return nd::transpose(t, AxesOrAll(axes)); })
      // As NumPy: integer sums accumulate in int64 (kiln has no uint64 for uint8), means of
      // integers are floats (float32, kiln's default float, as for true division).
      .def("sum", [](const Tensor& t, pyb::handle axis, bool keepdims) {
        bool narrow = t.dtype() == DType::kInt32 || t.dtype() == DType::kUInt8;
        return nd::sum(narrow ? t.AsType(DType::kInt64) : t, AxesOrAll(axis), keepdims);
      }, pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("mean", [](const Tensor& t, pyb::handle axis, bool keepdims) {
        return nd::mean(IsFloat(t.dtype()) ? t : t.AsType(DType::kFloat32), AxesOrAll(axis), keepdims);
      }, pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("max", [](const Tensor& t, pyb::handle axis, bool keepdims) { return nd::max(t, AxesOrAll(axis), keepdims); },
           pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("min", [](const Tensor& t, pyb::handle axis, bool keepdims) { return nd::min(t, AxesOrAll(axis), keepdims); },
           pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("argmax", [](const Tensor& t, pyb::handle axis, bool keepdims) {
        if (axis.is_none()) return nd::argmax(nd::reshape(t, {-1}), 0, false);
        return nd::argmax(t, axis.cast<int64_t>(), keepdims);
      }, pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("argmin", [](const Tensor& t, pyb::handle axis, bool keepdims) {
        if (axis.is_none()) return nd::argmin(nd::reshape(t, {-1}), 0, false);
        return nd::argmin(t, axis.cast<int64_t>(), keepdims);
      }, pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("_shares_storage", &Tensor::SharesStorage)
      .def("_data_ptr", [](const Tensor& t) {
        return reinterpret_cast<uintptr_t>(t.storage()->data()) + t.offset() * DTypeSize(t.dtype());
      })
      .def("_strides", [](const Tensor& t) {
        pyb::tuple s(t.rank());
        for (int i = 0; i < t.rank(); ++i) s[i] = t.strides()[i];
        return s;
      })
      .def("__repr__", [](const Tensor& t) {
        pyb::gil_scoped_release nogil;
        return t.str();
      })
      .def("__neg__", [](const Tensor& t) { return nd::negative(t); })
      .def("__abs__", [](const Tensor& t) { return nd::abs(t); })
      .def("__invert__", [](const Tensor& t) { return nd::logical_not(t); })
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return nd::matmul(a, b); }, pyb::is_operator())
      .def("__len__", [](const Tensor& t) {
        if (t.rank() == 0) throw pyb::type_error("len() of unsized object: the array is 0-d (a scalar); use .item()");
        return t.shape()[0];
      })
      .def("__iter__", [](pyb::object self) {
        // Lazily self[0], self[1], ... along the first axis, as NumPy; a 0-d array has no axis.
        const Tensor& t = self.cast<const Tensor&>();
        if (t.rank() == 0) throw pyb::type_error("iteration over a 0-d array: it has no axis to iterate; use .item()");
        pyb::module_ b = pyb::module_::import("builtins");
        return b.attr("map")(self.attr("__getitem__"), b.attr("range")(t.shape()[0]));
      })
      .def("__bool__", [](const Tensor& t) {
        if (t.numel() != 1)
          KILN_THROW(ValueError) << "the truth value of an array with " << t.numel()
                                 << " elements is ambiguous; use .sum(), .max() or compare elements";
        return ItemObject(t).cast<double>() != 0;
      })
      .def("__float__", [](const Tensor& t) {
        if (t.numel() != 1) KILN_THROW(ValueError) << "only one-element arrays convert to float, got " << t.numel();
        return ItemObject(t).cast<double>();
      })
      .def("__int__", [](const Tensor& t) {
        if (t.numel() != 1) KILN_THROW(ValueError) << "only one-element arrays convert to int, got " << t.numel();
        return pyb::int_(ItemObject(t));
      })
      .def("__index__", [](const Tensor& t) -> pyb::object {
        if (t.numel() != 1 || IsFloat(t.dtype()))
          KILN_THROW(DTypeError) << "only one-element integer arrays can be used as an index, got "
                                 << t.numel() << " elements of " << DTypeName(t.dtype());
        return pyb::int_(ItemObject(t));
      });
  // The operator methods; `a + b` itself goes through the number slots InstallOperatorSlots sets.
  auto method = [&](const char* name, PyObject* (*fn)(PyObject*, PyObject*), bool reflected) {
    if (reflected)
      cls.def(name, [fn](pyb::handle a, pyb::handle b) { return Steal(fn(b.ptr(), a.ptr())); }, pyb::is_operator());
    else
      cls.def(name, [fn](pyb::handle a, pyb::handle b) { return Steal(fn(a.ptr(), b.ptr())); }, pyb::is_operator());
  };
  method("__add__", SlotAdd, false), method("__radd__", SlotAdd, true), method("__iadd__", SlotAdd_inplace, false);
  method("__sub__", SlotSub, false), method("__rsub__", SlotSub, true), method("__isub__", SlotSub_inplace, false);
  method("__mul__", SlotMul, false), method("__rmul__", SlotMul, true), method("__imul__", SlotMul_inplace, false);
  method("__truediv__", SlotDiv, false), method("__rtruediv__", SlotDiv, true);
  method("__itruediv__", SlotDiv_inplace, false);
  method("__mod__", SlotMod, false), method("__rmod__", SlotMod, true), method("__imod__", SlotMod_inplace, false);
  method("__floordiv__", SlotFloorDiv, false), method("__rfloordiv__", SlotFloorDiv, true);
  method("__ifloordiv__", SlotFloorDiv_inplace, false);
  method("__divmod__", SlotDivmod, false), method("__rdivmod__", SlotDivmod, true);
  cls.def("__pow__", [](pyb::handle a, pyb::handle b) { return Steal(SlotPow(a.ptr(), b.ptr(), Py_None)); },
          pyb::is_operator());
  cls.def("__rpow__", [](pyb::handle a, pyb::handle b) { return Steal(SlotPow(b.ptr(), a.ptr(), Py_None)); },
          pyb::is_operator());
  static constexpr std::pair<const char*, int> kCompare[] = {{"__lt__", Py_LT}, {"__le__", Py_LE}, {"__eq__", Py_EQ},
                                                             {"__ne__", Py_NE}, {"__gt__", Py_GT}, {"__ge__", Py_GE}};
  for (auto [name, cmp] : kCompare)
    cls.def(name, [cmp = cmp](pyb::handle a, pyb::handle b) { return Steal(SlotCompare(a.ptr(), b.ptr(), cmp)); },
            pyb::is_operator());
  cls.attr("__hash__") = pyb::none();
  cls.attr("__array_priority__") = 1000.0;  // NumPy defers `np_array + nd_array` to NDArray
  InstallOperatorSlots(cls);  // last: setting a dunder attribute on the type resets its slot

  // ---- creation and conversion ----
  m.def("array", [](pyb::handle obj, pyb::handle dtype, std::optional<Device> device) {
    Tensor t = ToTensor(obj, device);
    if (!dtype.is_none()) {
      DType d = ToDType(dtype);
      if (d != t.dtype()) t = t.AsType(d);
    }
    return t;
  }, pyb::arg("obj"), pyb::arg("dtype") = pyb::none(), pyb::arg("device") = pyb::none());
  m.def("zeros", [](pyb::handle shape, pyb::handle dtype, Device d) { return nd::zeros(ToShape(shape), ToDType(dtype), d); },
        pyb::arg("shape"), pyb::arg("dtype") = pyb::none(), pyb::arg("device") = cpu());
  m.def("ones", [](pyb::handle shape, pyb::handle dtype, Device d) { return nd::ones(ToShape(shape), ToDType(dtype), d); },
        pyb::arg("shape"), pyb::arg("dtype") = pyb::none(), pyb::arg("device") = cpu());
  m.def("full", [](pyb::handle shape, double v, pyb::handle dtype, Device d) { return nd::full(ToShape(shape), v, ToDType(dtype), d); },
        pyb::arg("shape"), pyb::arg("val"), pyb::arg("dtype") = pyb::none(), pyb::arg("device") = cpu());
  m.def("arange", [](double start, pyb::handle stop, double step, pyb::handle dtype, Device d) {
    if (stop.is_none()) return nd::arange(0, start, step, ToDType(dtype), d);
    return nd::arange(start, stop.cast<double>(), step, ToDType(dtype), d);
  }, pyb::arg("start"), pyb::arg("stop") = pyb::none(), pyb::arg("step") = 1.0, pyb::arg("dtype") = pyb::none(),
        pyb::arg("device") = cpu());
  m.def("random_uniform", [](double lo, double hi, pyb::handle shape, pyb::handle dtype, Device d) {
    return nd::random::uniform(lo, hi, ToShape(shape), ToDType(dtype), d);
  });
  m.def("random_normal", [](double mean, double std, pyb::handle shape, pyb::handle dtype, Device d) {
    return nd::random::normal(mean, std, ToShape(shape), ToDType(dtype), d);
  });
  m.def("random_bernoulli", [](double p, pyb::handle shape, pyb::handle dtype, Device d) {
    return nd::random::bernoulli(p, ToShape(shape), ToDType(dtype), d);
  });

  // ---- every op of the table, by name: invoke("add", [a, b], axes=[1]) ----
  m.def("invoke", [](const std::string& op, const std::vector<Tensor>& inputs, pyb::kwargs kwargs) {
    return Invoke(op, inputs, ToAttrs(kwargs));
  }, pyb::arg("op"), pyb::arg("inputs"));
  m.def("invoke_into", [](const std::string& op, const std::vector<Tensor>& inputs,
                          const std::vector<Tensor>& outputs, pyb::kwargs kwargs) {
    InvokeInto(ir::FindOp(op), inputs, ToAttrs(kwargs), outputs);
  });
  m.def("elementwise_op_names", [] {  // the nd functions of the op list (kiln.nd imports them)
    std::vector<std::string> v;
#define KILN_X(Id, name, nd_name, domain, doc) v.push_back(#nd_name);
    KILN_UNARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Id, name, nd_name, doc) v.push_back(#nd_name);
    KILN_BINARY_OPS(KILN_X)
#undef KILN_X
    return v;
  });
  m.def("op_names", [] {
    std::vector<std::string> v;
    const ir::OpTable& t = ir::OpTable::Get();
    for (size_t i = 0; i < t.size(); ++i) v.push_back(t[static_cast<ir::OpId>(i)].name);
    return v;
  });

  // ---- composites and ops with typed options ----
  // The unary ops of the op list (kiln/runtime/op_list.h), then the composites.
#define KILN_X(Id, name, nd_name, domain, doc) +1
  constexpr size_t kNumListed = 0 KILN_UNARY_OPS(KILN_X);
#undef KILN_X
  static FastFunction fast_unary[kNumListed + 4], fast_binary[13];  // referenced by the builtins for the process
  size_t n_unary = 0;
#define KILN_U(name, doc)                                                           \
  m.def(#name, [](const Tensor& x) { return nd::name(x); }, doc);                   \
  fast_unary[n_unary].unary = [](const Tensor& x) { return nd::name(x); };          \
  InstallFast(m, #name, &fast_unary[n_unary++]);
#define KILN_X(Id, name, nd_name, domain, doc) KILN_U(nd_name, doc)
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
  KILN_U(stop_gradient, "x, with no gradient flowing back")
  KILN_U(sigmoid, "1 / (1 + e^-x)") KILN_U(gelu, "x * Phi(x), the exact form") KILN_U(flatten, "(N, ...) -> (N, -1)")
#undef KILN_U
  KILN_CHECK(n_unary == std::size(fast_unary)) << n_unary << " unary functions";
  // The binary ops of the op list. Those with an operator share its code (true division of
  // integers, NumPy scalars, arrays); the others (maximum, minimum, ...) take NDArrays and numbers.
  static constexpr std::pair<const char*, Op> kOperatorOps[] = {
      {"add", Op::kAdd}, {"subtract", Op::kSub}, {"multiply", Op::kMul}, {"divide", Op::kDiv},
      {"power", Op::kPow}, {"equal", Op::kEq}, {"not_equal", Op::kNe}, {"less", Op::kLt},
      {"less_equal", Op::kLe}, {"greater", Op::kGt}, {"greater_equal", Op::kGe},
      {"mod", Op::kMod}, {"floor_divide", Op::kFloorDiv}};
  auto has_operator = [](const char* name) {
    for (const auto& [n, op] : kOperatorOps)
      if (std::strcmp(n, name) == 0) return true;
    return false;
  };
#define KILN_X(Id, name, nd_name, doc)                                                             \
  if (!has_operator(#nd_name))                                                                     \
    m.def(#nd_name, [](pyb::handle a, pyb::handle b) -> Tensor {                                  \
      if (!pyb::isinstance<Tensor>(a)) {                                                           \
        if (PyFloat_Check(a.ptr()) || PyLong_Check(a.ptr())) {                                     \
          Tensor y = ToTensor(b);                                                                  \
          if (!IntegerFits(a.ptr(), y.dtype(), "combining it")) throw pyb::error_already_set();    \
          return nd::nd_name(PyFloat_AsDouble(a.ptr()), y);                                        \
        }                                                                                          \
      }                                                                                            \
      Tensor x = ToTensor(a);                                                                      \
      if (PyFloat_Check(b.ptr()) || PyLong_Check(b.ptr())) {                                       \
        if (!IntegerFits(b.ptr(), x.dtype(), "combining it")) throw pyb::error_already_set();      \
        return nd::nd_name(x, PyFloat_AsDouble(b.ptr()));                                          \
      }                                                                                            \
      return nd::nd_name(x, ToTensor(b, x.device()));                                              \
    }, doc);
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
  static_assert(std::size(kOperatorOps) == std::size(fast_binary));
  for (size_t i = 0; i < std::size(kOperatorOps); ++i) {
    auto [name, op] = kOperatorOps[i];
    m.def(name, [op = op](pyb::object a, pyb::object b) {
      if (!AsTensor(a.ptr()) && !AsTensor(b.ptr())) a = pyb::cast(ToTensor(a));
      pyb::object r = Steal(BinarySlot(op, a.ptr(), b.ptr()));
      if (r.ptr() == Py_NotImplemented)
        KILN_THROW(DTypeError) << "unsupported operand types " << Py_TYPE(a.ptr())->tp_name << " and "
                               << Py_TYPE(b.ptr())->tp_name << "; pass NDArrays, NumPy arrays or numbers";
      return r;
    }, pyb::arg("lhs"), pyb::arg("rhs"));
    fast_binary[i].binary = op;
    InstallFast(m, name, &fast_binary[i]);
  }
  m.def("where", &nd::where);
  m.def("cast", [](const Tensor& x, pyb::handle d) { return nd::cast(x, ToDType(d)); });
  m.def("clip", &nd::clip);
  m.def("broadcast_to", [](const Tensor& x, pyb::handle s) { return nd::broadcast_to(x, ToInts(s)); });
  m.def("expand_dims", &nd::expand_dims);
  m.def("squeeze", [](const Tensor& x, pyb::handle axis) { return nd::squeeze(x, AxesOrAll(axis)); },
        pyb::arg("x"), pyb::arg("axis") = pyb::none());
  m.def("slice", [](const Tensor& x, pyb::handle b, pyb::handle e, pyb::handle s) {
    return nd::slice(x, ToInts(b), ToInts(e), s.is_none() ? Axes{} : ToInts(s));
  }, pyb::arg("x"), pyb::arg("begin"), pyb::arg("end"), pyb::arg("step") = pyb::none());
  m.def("concat", &nd::concat, pyb::arg("xs"), pyb::arg("axis") = 0);
  m.def("stack", &nd::stack, pyb::arg("xs"), pyb::arg("axis") = 0);
  m.def("split", [](const Tensor& x, pyb::handle sections, int64_t axis) { return nd::split(x, ToInts(sections), axis); },
        pyb::arg("x"), pyb::arg("sections"), pyb::arg("axis") = 0);
  m.def("take", &nd::take, pyb::arg("x"), pyb::arg("indices"), pyb::arg("axis") = 0);
  m.def("one_hot", [](const Tensor& i, int64_t depth, double on, double off, pyb::handle d, bool labels) {
    return nd::one_hot(i, depth, on, off, ToDType(d), labels);
  }, pyb::arg("indices"), pyb::arg("depth"), pyb::arg("on_value") = 1.0, pyb::arg("off_value") = 0.0,
        pyb::arg("dtype") = pyb::none(), pyb::arg("labels") = false);
  m.def("matmul", &nd::matmul, pyb::arg("a"), pyb::arg("b"), pyb::arg("transpose_a") = false,
        pyb::arg("transpose_b") = false);
  m.def("linear", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) { return nd::linear(x, w, b.value_or(Tensor())); },
        pyb::arg("x"), pyb::arg("weight"), pyb::arg("bias") = pyb::none());
  m.def("conv2d", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, pyb::handle stride,
                     pyb::handle padding, pyb::handle dilation, int64_t groups) {
    nd::Conv2dOptions o;
    o.stride = ToInts(stride), o.padding = ToInts(padding), o.dilation = ToInts(dilation), o.groups = groups;
    for (Axes* a : {&o.stride, &o.padding, &o.dilation})
      if (a->size() == 1) a->push_back((*a)[0]);
    return nd::conv2d(x, w, b.value_or(Tensor()), o);
  }, pyb::arg("x"), pyb::arg("weight"), pyb::arg("bias") = pyb::none(), pyb::arg("stride") = 1,
        pyb::arg("padding") = 0, pyb::arg("dilation") = 1, pyb::arg("groups") = 1);
  auto pair = [](pyb::handle h) {
    Axes a = ToInts(h);
    if (a.size() == 1) a.push_back(a[0]);
    return a;
  };
  m.def("max_pool2d", [pair](const Tensor& x, pyb::handle k, pyb::handle s, pyb::handle p) {
    return nd::max_pool2d(x, pair(k), s.is_none() ? pair(k) : pair(s), pair(p));
  }, pyb::arg("x"), pyb::arg("kernel"), pyb::arg("stride") = pyb::none(), pyb::arg("padding") = 0);
  m.def("avg_pool2d", [pair](const Tensor& x, pyb::handle k, pyb::handle s, pyb::handle p, bool count_include_pad) {
    return nd::avg_pool2d(x, pair(k), s.is_none() ? pair(k) : pair(s), pair(p), count_include_pad);
  }, pyb::arg("x"), pyb::arg("kernel"), pyb::arg("stride") = pyb::none(), pyb::arg("padding") = 0,
        pyb::arg("count_include_pad") = true);
  m.def("global_avg_pool2d", &nd::global_avg_pool2d);
  m.def("softmax", &nd::softmax, pyb::arg("x"), pyb::arg("axis") = -1);
  m.def("log_softmax", &nd::log_softmax, pyb::arg("x"), pyb::arg("axis") = -1);
  m.def("softmax_cross_entropy", &nd::softmax_cross_entropy, pyb::arg("logits"), pyb::arg("labels"),
        pyb::arg("axis") = -1, pyb::arg("sparse_label") = true);
  m.def("dropout", &nd::dropout, pyb::arg("x"), pyb::arg("p"), pyb::arg("training"));
  m.def("batch_norm", [](const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& rm, const Tensor& rv,
                         int64_t axis, double eps, double momentum, bool training) {
    nd::BatchNormOptions o;
    o.axis = axis, o.eps = eps, o.momentum = momentum, o.training = training;
    return nd::batch_norm(x, g, b, rm, rv, o);
  }, pyb::arg("x"), pyb::arg("gamma"), pyb::arg("beta"), pyb::arg("running_mean"), pyb::arg("running_var"),
        pyb::arg("axis") = 1, pyb::arg("eps") = 1e-5, pyb::arg("momentum") = 0.9, pyb::arg("training") = true);
}

}  // namespace kiln::py
