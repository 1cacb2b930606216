"""The small-op path of eager dispatch (frontend/dispatch.cc, python/src/ndarray.cc).

Elementwise ops without attributes on operands of one shape, dtype and device skip inference and
run inline through a short path; everything else must fall back to the general path and behave
exactly as before: scalar operands, broadcasting, dtype promotion, errors (shape, dtype, device),
autograd recording, hybridize tracing, NaN/Inf, asynchronous ordering, and the identity of the
Python objects pybind11 hands back.
"""
import gc
import weakref

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn


def _arr(values, dtype="float32", device=None):
    return nd.array(np.asarray(values, dtype=dtype), device=device)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "uint8"])
def test_same_shape_ops_match_numpy_and_repeat(dtype):
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    y = np.array([[6, 5, 4], [3, 2, 1]], dtype=dtype)
    a, b = nd.array(x), nd.array(y)
    for _ in range(3):  # first call teaches the table, later ones take the short path
        np.testing.assert_allclose((a + b).asnumpy(), x + y)
        np.testing.assert_allclose((a * b).asnumpy(), x * y)
        np.testing.assert_allclose((a - b).asnumpy().astype(np.float64), (x - y).astype(np.float64))
        assert (a < b).dtype == np.bool_ and ((a < b).asnumpy() == (x < y)).all()
        assert (a + b).dtype == np.dtype(dtype) and (a + b).shape == (2, 3)


def test_comparison_result_dtype_is_learned_per_input_dtype():
    for dtype in ("float32", "int64", "float32", "int64"):
        a, b = _arr([1, 2, 3], dtype), _arr([3, 2, 1], dtype)
        r = a == b
        assert r.dtype == np.bool_
        assert r.asnumpy().tolist() == [False, True, False]


def test_unary_ops_through_the_short_path():
    x = np.array([-1.5, 0.0, 2.0], dtype=np.float32)
    a = nd.array(x)
    for _ in range(2):
        np.testing.assert_allclose((-a).asnumpy(), -x)
        np.testing.assert_allclose(nd.relu(a).asnumpy(), np.maximum(x, 0))
        np.testing.assert_allclose(nd.exp(a).asnumpy(), np.exp(x), rtol=1e-6)


def test_scalar_operands_keep_the_python_dtype_rules():
    i = _arr([1, 2, 3], "int32")
    for _ in range(2):
        assert (i + 1).dtype == np.int32 and (i + 1).asnumpy().tolist() == [2, 3, 4]
        assert (i * 2.5).dtype == np.float32
        np.testing.assert_allclose((i * 2.5).asnumpy(), [2.5, 5.0, 7.5])
        assert (i / 2).dtype == np.float32  # true division of integers
        np.testing.assert_allclose((2 - i).asnumpy(), [1, 0, -1])
        b = _arr([True, False], "bool")
        assert (b + 1).dtype == np.int64
    f = _arr([1.0, 2.0])
    np.testing.assert_allclose((f + np.float32(0.5)).asnumpy(), [1.5, 2.5])
    np.testing.assert_allclose((3.0 / f).asnumpy(), [3.0, 1.5])


def test_zero_d_operand_broadcasts_on_the_short_path():
    s = nd.array(np.float32(2.0))
    x = _arr([[1, 2], [3, 4]])
    for _ in range(2):
        assert (x * s).shape == (2, 2) and (s * x).shape == (2, 2)
        np.testing.assert_allclose((x * s).asnumpy(), [[2, 4], [6, 8]])
        np.testing.assert_allclose((s - x).asnumpy(), [[1, 0], [-1, -2]])
        assert (s + s).shape == ()


def test_broadcasting_falls_back_and_still_broadcasts():
    x = _arr(np.ones((2, 3)))
    row = _arr([1, 2, 3])
    col = _arr([[10], [20]])
    for _ in range(2):
        np.testing.assert_allclose((x + row).asnumpy(), np.ones((2, 3)) + [1, 2, 3])
        np.testing.assert_allclose((col + row).asnumpy(), np.array([[10], [20]]) + [1, 2, 3])
        one = _arr([5.0])  # shape (1,), not 0-d: the general path broadcasts it
        np.testing.assert_allclose((x * one).asnumpy(), np.full((2, 3), 5.0))


def test_shape_mismatch_raises_the_same_error():
    a, b = _arr([1, 2, 3]), _arr([1, 2])
    a + a  # the table knows (add, float32)
    with pytest.raises(kiln.ShapeError, match="add"):
        a + b
    with pytest.raises(ValueError):
        a * b


def test_dtype_promotion_of_mixed_operands():
    f, i = _arr([1.5, 2.5]), _arr([1, 2], "int64")
    d = _arr([1.0, 2.0], "float64")
    for _ in range(2):
        assert (f + i).dtype == np.float32
        np.testing.assert_allclose((f + i).asnumpy(), [2.5, 4.5])
        assert (f + d).dtype == np.float64
        assert (i + _arr([1, 2], "int32")).dtype == np.int64


def test_bool_arithmetic_errors_are_still_raised():
    b = _arr([True, False], "bool")
    b + b  # allowed (logical or as in NumPy)
    for _ in range(2):
        with pytest.raises(kiln.DTypeError):
            b - b


def test_mismatched_devices_raise_device_error():
    a = _arr([1, 2, 3], device=kiln.cpu(0))
    b = _arr([1, 2, 3], device=kiln.cpu(1))
    a + a
    b + b
    with pytest.raises(kiln.DeviceError, match="different devices"):
        a + b
    c = b * b
    assert c.device == kiln.cpu(1)


def test_nan_and_inf_propagate():
    a = _arr([np.nan, np.inf, -np.inf, 1.0])
    b = _arr([1.0, 1.0, np.inf, 0.0])
    for _ in range(2):
        with np.errstate(all="ignore"):
            x = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
            y = np.array([1, 1, np.inf, 0], np.float32)
            np.testing.assert_array_equal((a + b).asnumpy(), x + y)
            np.testing.assert_array_equal((a / b).asnumpy(), x / y)


def test_autograd_records_through_the_short_path():
    x = _arr([1.0, 2.0, 3.0])
    y = _arr([4.0, 5.0, 6.0])
    x + y  # teach the table first, so that the recorded call takes the short path
    x * y
    x.attach_grad()
    with autograd.record():
        z = (x * y + x) * x
    z.backward()
    xs, ys = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * xs * ys + 2 * xs)
    # Outside record() nothing is recorded: a new backward has nothing to differentiate.
    w = x * y
    with pytest.raises(Exception):
        w.backward()


def test_pause_and_constants_under_record():
    x = _arr([1.0, 2.0])
    c = _arr([3.0, 4.0])
    x.attach_grad()
    with autograd.record():
        k = c * c  # no input needs a gradient: not recorded
        with autograd.pause():
            p = x * c
        z = x * k + p
    z.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [9.0, 16.0])


class _AddMul(nn.HybridBlock):
    def forward(self, x, y):
        return (x + y) * x - y * 2


def test_hybridize_traces_ops_the_short_path_knows():
    x, y = _arr([[1.0, 2.0], [3.0, 4.0]]), _arr([[0.5, 1.5], [2.5, 3.5]])
    net = _AddMul()
    net.initialize()
    eager = net(x, y).asnumpy()
    net.hybridize()
    for _ in range(2):
        np.testing.assert_allclose(net(x, y).asnumpy(), eager)
    xs, ys = x.asnumpy(), y.asnumpy()
    np.testing.assert_allclose(eager, (xs + ys) * xs - ys * 2)


def test_ordering_with_queued_writers():
    # Inputs still being written by queued work: the op must wait for them (not run inline early).
    big = nd.ones((512, 512))
    acc = big * 1.0
    for _ in range(5):
        acc = acc + big
    small = acc[0:1, 0:1]
    out = small + small
    assert out.asnumpy().tolist() == [[12.0]]
    x = _arr([1.0])
    for _ in range(200):
        x = x + x * 0 + 1
    assert x.item() == 201.0


def test_in_place_operators_write_into_the_left_operand():
    a = _arr([1.0, 2.0])
    b = _arr([3.0, 4.0])
    ident = id(a)
    a += b
    a *= b
    assert id(a) == ident
    np.testing.assert_allclose(a.asnumpy(), [12.0, 24.0])


def test_result_objects_identity_and_lifetime():
    a, b = _arr([1.0]), _arr([2.0])
    c = a + b
    d = _arr([0.0])
    assert c.copyto(d) is d  # copyto returns its destination itself
    assert d.copyto(c) is c  # also an operator's result (made outside pybind11's cast)
    r = weakref.ref(c)  # weak references go through pybind11's own dealloc
    del c
    gc.collect()
    assert r() is None
    assert d.item() == 3.0
    for _ in range(1000):  # results die one after another; nothing leaks or double-frees
        e = a + b
    assert e.item() == 3.0


def test_errors_inside_inline_kernels_reach_the_sync_point():
    from kiln import _C
    i, z = _arr([1, 2], "int32"), _arr([0, 0], "int32")
    _C.invoke("div", [i, i])  # teach the table: the failing call takes the short path
    kiln.waitall()
    r = _C.invoke("div", [i, z])[0]  # integer division by zero fails in the kernel, not here
    with pytest.raises(Exception, match="div"):
        r.asnumpy()
    with pytest.raises(Exception, match="div"):
        kiln.waitall()
    ok = i + i  # the engine keeps working
    assert ok.asnumpy().tolist() == [2, 4]


def test_module_functions_serve_plain_calls_and_defer_the_rest():
    x = _arr([-1.0, 2.0])
    for _ in range(2):
        np.testing.assert_allclose(nd.relu(x).asnumpy(), [0.0, 2.0])
        np.testing.assert_allclose(nd.add(x, x).asnumpy(), [-2.0, 4.0])
        np.testing.assert_allclose(nd.multiply(x, 3).asnumpy(), [-3.0, 6.0])
        np.testing.assert_allclose(nd.subtract(1, x).asnumpy(), [2.0, -1.0])
    # Keyword arguments, NumPy operands and wrong arguments take the pybind11 functions.
    np.testing.assert_allclose(nd.add(lhs=x, rhs=2.0).asnumpy(), [1.0, 4.0])
    ones = np.array([1.0, 1.0], np.float32)
    np.testing.assert_allclose(nd.add(ones, ones * 2).asnumpy(), [3.0, 3.0])
    np.testing.assert_allclose(nd.add(ones, x).asnumpy(), [0.0, 3.0])
    with pytest.raises(TypeError, match="incompatible function arguments"):
        nd.relu(np.array([1.0]))
    with pytest.raises(TypeError):
        nd.relu()
    with pytest.raises(TypeError):
        nd.relu(x, x)
    with pytest.raises(kiln.DTypeError, match="unsupported operand types"):
        nd.add("a", x)
    with pytest.raises(kiln.ShapeError):
        nd.add(x, _arr([1.0, 2.0, 3.0]))
    assert "relu" in nd.relu.__doc__ and nd.relu.__name__ == "relu"
