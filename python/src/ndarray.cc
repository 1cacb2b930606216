// kiln._C.NDArray (the C++ Tensor) and the eager ops of kiln::nd. Operators are bound here, in
// C++, so that `a + b` from Python costs one pybind11 call on top of the C++ dispatch; indexing
// and the friendlier signatures live in python/kiln/ndarray.py.
#include <cstring>

#include "bind.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/error.h"

namespace kiln::py {
namespace {

using nd::Axes;

// The second operand of a binary operator: another NDArray or a Python number.
template <class TT, class TS>
pyb::object Binary(const Tensor& a, pyb::handle b, TT tensor_op, TS scalar_op) {
  if (pyb::isinstance<Tensor>(b)) return pyb::cast(tensor_op(a, b.cast<const Tensor&>()));
  if (PyFloat_Check(b.ptr()) || PyLong_Check(b.ptr()) || PyBool_Check(b.ptr()))
    return pyb::cast(scalar_op(a, PyFloat_AsDouble(b.ptr())));
  if (pyb::isinstance<pyb::array>(b) || pyb::isinstance<pyb::list>(b) || pyb::isinstance<pyb::tuple>(b) ||
      pyb::hasattr(b, "dtype"))
    return pyb::cast(tensor_op(a, ToTensor(b, a.device())));
  return pyb::reinterpret_borrow<pyb::object>(Py_NotImplemented);
}

#define KILN_BIN(pyname, fn)                                                                        \
  cls.def(pyname, [](const Tensor& a, pyb::handle b) {                                               \
    return Binary(a, b, [](const Tensor& x, const Tensor& y) { return nd::fn(x, y); },               \
                  [](const Tensor& x, double y) { return nd::fn(x, y); });                            \
  }, pyb::is_operator());
#define KILN_RBIN(pyname, fn)                                                                       \
  cls.def(pyname, [](const Tensor& a, pyb::handle b) {                                               \
    return Binary(a, b, [](const Tensor& x, const Tensor& y) { return nd::fn(y, x); },               \
                  [](const Tensor& x, double y) { return nd::fn(y, x); });                            \
  }, pyb::is_operator());
// In place as in MXNet: the result is written into a's storage (a keeps its identity).
#define KILN_IBIN(pyname, fn)                                                                       \
  cls.def(pyname, [](Tensor& a, pyb::handle b) {                                                     \
    pyb::object r = Binary(a, b, [](const Tensor& x, const Tensor& y) { return nd::fn(x, y); },      \
                           [](const Tensor& x, double y) { return nd::fn(x, y); });                   \
    if (r.ptr() == Py_NotImplemented) return r;                                                      \
    Tensor out = r.cast<Tensor>();                                                                   \
    if (out.shape() != a.shape())                                                                    \
      KILN_THROW(ShapeError) << pyname << ": the result has shape " << out.shape().str()             \
                             << ", which cannot be written into the left operand of shape "         \
                             << a.shape().str() << "; use the out-of-place operator";               \
    out.AsType(a.dtype()).CopyTo(a);                                                                 \
    return pyb::cast(a);                                                                             \
  }, pyb::is_operator());

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
      .def_property_readonly("grad_req", [](const Tensor& t) {
        switch (t.grad_req()) {
          case GradReq::kWrite: return "write";
          case GradReq::kAdd: return "add";
          default: return "null";
        }
      })
      .def("asnumpy", &AsNumpy, "Copies the array to a NumPy array (waits for the result).")
      .def("item", [](const Tensor& t) -> pyb::object {
        double v;
        {
          pyb::gil_scoped_release nogil;
          v = t.Item();
        }
        if (t.dtype() == DType::kBool) return pyb::bool_(v != 0);
        if (IsFloat(t.dtype())) return pyb::float_(v);
        return pyb::int_(static_cast<int64_t>(v));
      })
      .def("wait_to_read", [](const Tensor& t) {
        pyb::gil_scoped_release nogil;
        t.WaitToRead();
      })
      .def("astype", [](const Tensor& t, pyb::handle dtype, bool copy) {
        DType d = ToDType(dtype);
        return d == t.dtype() && !copy ? t : t.AsType(d);
      }, pyb::arg("dtype"), pyb::arg("copy") = true)
      .def("to_device", [](const Tensor& t, const Device& d) { return t.To(d); })
      .def("as_in_context", [](const Tensor& t, const Device& d) { return t.To(d); })
      .def("as_in_ctx", [](const Tensor& t, const Device& d) { return t.To(d); })
      .def("copy", [](const Tensor& t) { return t.To(t.device(), /*copy=*/true); })
      .def("copyto", [](const Tensor& t, pyb::handle dst) -> pyb::object {
        if (pyb::isinstance<Device>(dst)) return pyb::cast(t.To(dst.cast<const Device&>(), true));
        const Tensor& d = dst.cast<const Tensor&>();
        t.CopyTo(d);
        return pyb::cast(d);
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
      .def("sum", [](const Tensor& t, pyb::handle axis, bool keepdims) { return nd::sum(t, AxesOrAll(axis), keepdims); },
           pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
      .def("mean", [](const Tensor& t, pyb::handle axis, bool keepdims) { return nd::mean(t, AxesOrAll(axis), keepdims); },
           pyb::arg("axis") = pyb::none(), pyb::arg("keepdims") = false)
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
        if (t.rank() == 0) KILN_THROW(ValueError) << "len() of a 0-d array";
        return t.shape()[0];
      })
      .def("__bool__", [](const Tensor& t) {
        if (t.numel() != 1)
          KILN_THROW(ValueError) << "the truth value of an array with " << t.numel()
                                 << " elements is ambiguous; use .sum(), .max() or compare elements";
        pyb::gil_scoped_release nogil;
        return t.Item() != 0;
      })
      .def("__float__", [](const Tensor& t) {
        if (t.numel() != 1) KILN_THROW(ValueError) << "only one-element arrays convert to float, got " << t.numel();
        pyb::gil_scoped_release nogil;
        return t.Item();
      })
      .def("__int__", [](const Tensor& t) {
        if (t.numel() != 1) KILN_THROW(ValueError) << "only one-element arrays convert to int, got " << t.numel();
        pyb::gil_scoped_release nogil;
        return static_cast<int64_t>(t.Item());
      });
  KILN_BIN("__add__", add) KILN_RBIN("__radd__", add) KILN_IBIN("__iadd__", add)
  KILN_BIN("__sub__", subtract) KILN_RBIN("__rsub__", subtract) KILN_IBIN("__isub__", subtract)
  KILN_BIN("__mul__", multiply) KILN_RBIN("__rmul__", multiply) KILN_IBIN("__imul__", multiply)
  KILN_BIN("__truediv__", divide) KILN_RBIN("__rtruediv__", divide) KILN_IBIN("__itruediv__", divide)
  KILN_BIN("__pow__", power) KILN_RBIN("__rpow__", power)
  KILN_BIN("__eq__", equal) KILN_BIN("__ne__", not_equal) KILN_BIN("__lt__", less)
  KILN_BIN("__le__", less_equal) KILN_BIN("__gt__", greater) KILN_BIN("__ge__", greater_equal)
  cls.attr("__hash__") = pyb::none();
  cls.attr("__array_priority__") = 1000.0;  // NumPy defers `np_array + nd_array` to NDArray

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
  m.def("op_names", [] {
    std::vector<std::string> v;
    const ir::OpTable& t = ir::OpTable::Get();
    for (size_t i = 0; i < t.size(); ++i) v.push_back(t[static_cast<ir::OpId>(i)].name);
    return v;
  });

  // ---- composites and ops with typed options ----
#define KILN_U(name) m.def(#name, [](const Tensor& x) { return nd::name(x); });
  KILN_U(negative) KILN_U(abs) KILN_U(sign) KILN_U(square) KILN_U(sqrt) KILN_U(rsqrt) KILN_U(reciprocal)
  KILN_U(exp) KILN_U(log) KILN_U(log1p) KILN_U(expm1) KILN_U(sin) KILN_U(cos) KILN_U(tanh) KILN_U(erf)
  KILN_U(relu) KILN_U(floor) KILN_U(ceil) KILN_U(round) KILN_U(logical_not) KILN_U(stop_gradient)
  KILN_U(sigmoid) KILN_U(gelu) KILN_U(flatten)
#undef KILN_U
#define KILN_B(name)                                                                              \
  m.def(#name, [](pyb::handle a, pyb::handle b) -> Tensor {                                        \
    if (!pyb::isinstance<Tensor>(a)) {                                                             \
      if (PyFloat_Check(a.ptr()) || PyLong_Check(a.ptr()))                                          \
        return nd::name(PyFloat_AsDouble(a.ptr()), ToTensor(b));                                   \
    }                                                                                              \
    Tensor x = ToTensor(a);                                                                        \
    if (PyFloat_Check(b.ptr()) || PyLong_Check(b.ptr())) return nd::name(x, PyFloat_AsDouble(b.ptr())); \
    return nd::name(x, ToTensor(b, x.device()));                                                   \
  });
  KILN_B(add) KILN_B(subtract) KILN_B(multiply) KILN_B(divide) KILN_B(power) KILN_B(maximum) KILN_B(minimum)
  KILN_B(equal) KILN_B(not_equal) KILN_B(less) KILN_B(less_equal) KILN_B(greater) KILN_B(greater_equal)
#undef KILN_B
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
  m.def("one_hot", [](const Tensor& i, int64_t depth, double on, double off, pyb::handle d) {
    return nd::one_hot(i, depth, on, off, ToDType(d));
  }, pyb::arg("indices"), pyb::arg("depth"), pyb::arg("on_value") = 1.0, pyb::arg("off_value") = 0.0,
        pyb::arg("dtype") = pyb::none());
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
