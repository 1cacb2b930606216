"""NDArray against NumPy: operators and dtype promotion, indexing, reductions, movement, conversions.

Where kiln documents a rule of its own, the expected dtype says so (see _kiln_dtype):
  * float with integer/bool keeps the float type (float32 + int64 -> float32, as PyTorch; NumPy
    gives float64), and a float scalar with an integer array gives float32 (NumPy: float64);
  * true division of integers gives float32 (NumPy: float64);
  * there is no int8, so bool ** bool is rejected and bool ** 2 gives int64.
"""
import itertools
import operator

import numpy as np
import pytest

import kiln
from kiln import nd

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"]
FLOATS = {"float32", "float64", "float16"}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "**": operator.pow,
       "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
       ">=": operator.ge}


def _sample(dtype, n=4):
    return (np.arange(n) % 3 + 1).astype(dtype)


def _kiln_dtype(np_result, a_dtype, b_dtype, op):
    """NumPy's result dtype, adjusted by kiln's documented rules (module docstring)."""
    a, b = str(a_dtype), str(b_dtype)
    if op in ("==", "!=", "<", "<=", ">", ">="):
        return "bool"
    if op == "/" and a not in FLOATS and b not in FLOATS:
        return "float32"
    if (a in FLOATS) != (b in FLOATS):
        return a if a in FLOATS else b
    return str(np_result.dtype)


def _skip_numpy_errors(a, b, op):
    if str(a.dtype) == "bool" and str(b.dtype) == "bool" and op in ("-", "/", "**"):
        return True  # NumPy refuses bool - bool; kiln refuses bool / and ** (no int8)
    return False


@pytest.mark.parametrize("op", list(OPS))
def test_binary_array_array_dtypes_and_values(op):
    for da, db in itertools.product(DTYPES, DTYPES):
        a, b = _sample(da), _sample(db)[::-1].copy()
        if _skip_numpy_errors(a, b, op):
            continue
        with np.errstate(all="ignore"):
            expect = OPS[op](a, b)
        got = OPS[op](nd.array(a), nd.array(b))
        assert str(got.dtype) == _kiln_dtype(expect, da, db, op), (da, op, db)
        np.testing.assert_allclose(got.asnumpy().astype(np.float64), expect.astype(np.float64), rtol=2e-3,
                                   err_msg=f"{da} {op} {db}")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("scalar", [2, 2.5, True, np.float32(2.0), np.int64(3)])
def test_binary_array_scalar_both_sides(op, scalar):
    for d in DTYPES:
        a = _sample(d)
        if d == "bool" and op in ("-", "/", "**") and isinstance(scalar, (bool, np.bool_)):
            continue
        for left in (True, False):
            x = nd.array(a)
            with np.errstate(all="ignore"):
                expect = OPS[op](a, scalar) if left else OPS[op](scalar, a)
            got = OPS[op](x, scalar) if left else OPS[op](scalar, x)
            want = str(expect.dtype)
            if op in ("==", "!=", "<", "<=", ">", ">="):
                want = "bool"
            elif d not in FLOATS and (op == "/" or isinstance(scalar, (float, np.floating))):
                want = "float32"
            elif d == "bool" and want == "int8":
                want = "int64"
            elif d in FLOATS:
                want = d  # value-based: a scalar never widens a float array
            assert str(got.dtype) == want, (d, op, scalar, left)
            np.testing.assert_allclose(got.asnumpy().astype(np.float64), expect.astype(np.float64), rtol=2e-3)


def test_bool_power_and_division_of_bools_are_rejected():
    t = nd.array(np.array([True, False]))
    with pytest.raises(kiln.DTypeError, match="bool"):
        t ** t


def test_broadcasting_and_numpy_operands():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10, 20, 30], dtype=np.float32)
    x = nd.array(a)
    np.testing.assert_array_equal((x + b).asnumpy(), a + b)  # NumPy operand on the right
    r = b - x  # NumPy defers to NDArray (__array_priority__)
    assert isinstance(r, kiln.NDArray)
    np.testing.assert_array_equal(r.asnumpy(), b - a)
    np.testing.assert_array_equal((x * [1, 2, 3]).asnumpy(), a * np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal((x[:, :1] * nd.array(b)).asnumpy(), a[:, :1] * b)
    with pytest.raises(kiln.ShapeError, match="broadcast"):
        x + nd.ones((4,))


def test_functional_ops_match_operators():
    a, b = nd.array(np.array([1, 2, 3], np.int32)), nd.array(np.array([2, 2, 2], np.int32))
    assert nd.divide(a, b).dtype == np.float32
    np.testing.assert_allclose(nd.divide(a, b).asnumpy(), [0.5, 1, 1.5])
    np.testing.assert_allclose(nd.add(2, a).asnumpy(), [3, 4, 5])
    np.testing.assert_array_equal(nd.maximum(a, 2).asnumpy(), [2, 2, 3])
    assert nd.less(a, b).dtype == np.bool_


def test_inplace_operators_keep_identity_and_dtype():
    x = nd.array(np.arange(4, dtype=np.float32))
    before = x
    x += 1
    x *= nd.array(np.full(4, 2, np.float32))
    x -= 1
    x /= 2
    assert x is before
    np.testing.assert_allclose(x.asnumpy(), ((np.arange(4) + 1) * 2 - 1) / 2)
    i = nd.array(np.arange(4, dtype=np.int32))
    i += 2
    assert i.dtype == np.int32
    v = x[1:3]
    v += 100  # a view writes through to its base, as in NumPy
    np.testing.assert_allclose(x.asnumpy()[1:3], ((np.arange(4)[1:3] + 1) * 2 - 1) / 2 + 100)
    with pytest.raises(kiln.ShapeError, match="in-place"):
        y = nd.ones((3,))
        y += nd.ones((2, 3))


def test_unary_operators():
    a = np.array([-1.5, 0, 2], np.float32)
    x = nd.array(a)
    np.testing.assert_array_equal((-x).asnumpy(), -a)
    np.testing.assert_array_equal(abs(x).asnumpy(), abs(a))
    np.testing.assert_array_equal((~nd.array(a > 0)).asnumpy(), ~(a > 0))


# ---- indexing ----

BASIC_KEYS = [0, -1, 1, slice(None), slice(1, None), slice(None, None, -1), slice(None, None, 2),
              slice(-1, 0, -1), slice(5, -5, -2), (0, 1), (-1, -2, -3), (slice(None), 1), (Ellipsis, 1),
              (None, 1), (1, None, Ellipsis, None), (slice(None), slice(None, None, -2), slice(1, None, 2)),
              (Ellipsis,), (slice(1, 0),), ()]


@pytest.mark.parametrize("key", BASIC_KEYS, ids=repr)
def test_getitem_basic(key):
    a = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    got = nd.array(a)[key]
    assert got.shape == a[key].shape
    np.testing.assert_array_equal(got.asnumpy(), a[key])


def test_getitem_integer_arrays_take_along_axis_0():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = nd.array(a)
    for idx in ([2, 0, 2], np.array([-1, 1]), nd.array(np.array([3, 0], np.int64))):
        np.testing.assert_array_equal(x[idx].asnumpy(), a[np.asarray(idx.asnumpy() if isinstance(idx, kiln.NDArray)
                                                                     else idx)])
    with pytest.raises(IndexError, match="boolean"):
        x[nd.array(np.array([True, False, True, True]))]


def test_getitem_errors():
    x = nd.ones((2, 3))
    with pytest.raises(IndexError, match="out of bounds"):
        x[2]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]


@pytest.mark.parametrize("key,value", [
    ((0,), 7.0), ((slice(None), 1), -1), ((1, 2), 3), ((slice(None, None, -1), 0), [5, 6]),
    ((Ellipsis, slice(0, None, 2)), np.array([[1, 2], [3, 4]])), ((slice(None),), np.array([9, 8, 7])),
    ((), 0.5), ((0, slice(1, None)), np.float64(4.25))], ids=repr)
def test_setitem_scalars_arrays_broadcast(key, value):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = nd.array(a)
    a[key] = value
    x[key] = value
    np.testing.assert_array_equal(x.asnumpy(), a)


def test_setitem_from_ndarray_casts_and_broadcasts():
    x = nd.zeros((2, 3), dtype="int32")
    x[:, 1:] = nd.array(np.array([1.7, 2.2]))
    np.testing.assert_array_equal(x.asnumpy(), [[0, 1, 2], [0, 1, 2]])
    with pytest.raises(IndexError, match="integer-array"):
        x[[0, 1]] = 1


# ---- reductions and movement ----

@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, axis, keepdims):
    a = np.random.rand(2, 3, 4).astype(np.float32)
    got = getattr(nd.array(a), name)(axis=axis, keepdims=keepdims)
    want = getattr(a, name)(axis=axis, keepdims=keepdims)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5)
    np.testing.assert_allclose(getattr(nd, name)(nd.array(a), axis=axis, keepdims=keepdims).asnumpy(), want,
                               rtol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool"])
def test_integer_reductions_widen(dtype):
    a = (np.arange(12) * 50 % 256).reshape(3, 4).astype(dtype)
    x = nd.array(a)
    assert x.sum(axis=1).dtype == np.int64  # NumPy: int64 (uint64 for uint8; kiln has no uint64)
    np.testing.assert_array_equal(x.sum(axis=1).asnumpy(), a.sum(axis=1))
    assert x.mean().dtype == np.float32
    np.testing.assert_allclose(x.mean(axis=0).asnumpy(), a.mean(axis=0), rtol=1e-6)


def test_argmax_argmin():
    a = np.random.rand(3, 5).astype(np.float32)
    x = nd.array(a)
    assert x.argmax().item() == a.argmax()
    np.testing.assert_array_equal(x.argmin(axis=1).asnumpy(), a.argmin(axis=1))
    assert x.argmax(axis=0, keepdims=True).shape == (1, 5)


def test_reshape_transpose():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = nd.array(a)
    for shape in [(-1,), (4, -1), (-1, 2, 3), (24,)]:
        np.testing.assert_array_equal(x.reshape(shape).asnumpy(), a.reshape(shape))
    np.testing.assert_array_equal(x.reshape(6, -1).asnumpy(), a.reshape(6, -1))
    np.testing.assert_array_equal(nd.reshape(x, (3, 8)).asnumpy(), a.reshape(3, 8))
    np.testing.assert_array_equal(x.T.asnumpy(), a.T)
    np.testing.assert_array_equal(x.transpose(1, 0, 2).asnumpy(), a.transpose(1, 0, 2))
    np.testing.assert_array_equal(nd.transpose(x, (2, 0, 1)).asnumpy(), a.transpose(2, 0, 1))
    with pytest.raises(kiln.ShapeError):
        x.reshape(5, -1)


def test_asnumpy_of_noncontiguous_views():
    a = np.arange(60, dtype=np.float64).reshape(3, 4, 5)
    x = nd.array(a)
    for v, w in [(x.T, a.T), (x[:, ::2, 1:], a[:, ::2, 1:]), (x[::-1, :, ::-2], a[::-1, :, ::-2]),
                 (x.transpose(1, 2, 0)[1], a.transpose(1, 2, 0)[1])]:
        assert v.shape == w.shape
        np.testing.assert_array_equal(v.asnumpy(), w)
        np.testing.assert_array_equal(np.asarray(v), w)
        np.testing.assert_array_equal((v + 1).asnumpy(), w + 1)


# ---- conversions ----

@pytest.mark.parametrize("dtype", DTYPES + ["bfloat16"])
def test_astype_roundtrip(dtype):
    a = np.array([0, 1, 2, 3], np.float32)
    y = nd.array(a).astype(dtype)
    assert y._dtype_name == dtype
    back = y.astype("float32").asnumpy()
    np.testing.assert_array_equal(back, a.astype(dtype).astype(np.float32) if dtype != "bfloat16" else a)


def test_astype_accepts_numpy_types_and_copy_flag():
    x = nd.ones((2,))
    assert x.astype(np.float64).dtype == np.float64
    assert x.astype(np.dtype("int32")).dtype == np.int32
    assert x.astype("float32", copy=False)._shares_storage(x)
    assert not x.astype("float32")._shares_storage(x)
    with pytest.raises(kiln.DTypeError, match="int8"):
        x.astype("int8")


def test_copyto_and_copy():
    x = nd.array(np.arange(3, dtype=np.float32))
    y = nd.zeros((3,))
    assert x.copyto(y) is y or x.copyto(y)._shares_storage(y)
    np.testing.assert_array_equal(y.asnumpy(), [0, 1, 2])
    z = x.copyto(kiln.cpu())
    assert not z._shares_storage(x)
    c = x.copy()
    c[0] = 10
    assert x[0].item() == 0
    with pytest.raises(kiln.ShapeError):
        x.copyto(nd.zeros((4,)))
    with pytest.raises(kiln.DTypeError):
        x.copyto(nd.zeros((3,), dtype="int32"))


def test_array_copies_and_keeps_dtypes():
    x = nd.ones((2,))
    y = nd.array(x)
    y[0] = 5
    assert x[0].item() == 1
    assert nd.array([1, 2]).dtype == np.float32
    assert nd.array(np.array([1, 2])).dtype == np.int64
    assert nd.array([True, False]).dtype == np.bool_
    assert nd.array(np.float64(2.5)).shape == ()
    assert nd.array(np.array(3)).shape == ()
    assert nd.array([1, 2], dtype="int32").dtype == np.int32


def test_item_and_python_conversions():
    assert nd.array(np.array([2**53 + 1], np.int64)).item() == 2**53 + 1
    assert isinstance(nd.array(np.array([3], np.int32)).item(), int)
    assert isinstance(nd.array(np.array([3.5])).item(), float)
    assert nd.array(np.array([True])).item() is True
    x = nd.array(np.array([[2.5]], np.float32))
    assert float(x) == 2.5 and int(x) == 2 and bool(x)
    assert not bool(nd.zeros((1,)))
    assert [10, 20, 30][nd.array(np.array(1, np.int64))] == 20  # __index__
    with pytest.raises(ValueError, match="ambiguous"):
        bool(nd.ones((2,)))
    with pytest.raises(ValueError):
        float(nd.ones((2,)))
    with pytest.raises(kiln.ShapeError, match="item"):
        nd.ones((2,)).item()


def test_len_repr_tolist_asarray():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = nd.array(a)
    assert len(x) == 2
    with pytest.raises(TypeError, match="len\\(\\) of unsized object.*0-d"):  # as NumPy
        len(nd.array(np.float32(1)))
    r = repr(x)
    assert "(2, 3)" in r and "float32" in r and "cpu(0)" in r
    assert x.tolist() == a.tolist()
    assert np.asarray(x).dtype == np.float32
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    np.testing.assert_array_equal(np.asarray(x), a)
    assert x.shape == (2, 3) and x.ndim == 2 and x.size == 6 and x.dtype == np.float32
    assert x.device == kiln.cpu() and x.context == kiln.cpu()


def test_creation():
    np.testing.assert_array_equal(nd.arange(5).asnumpy(), np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(nd.arange(1, 7, 2, dtype="int64").asnumpy(), np.arange(1, 7, 2))
    np.testing.assert_array_equal(nd.full((2, 2), 3, dtype="int32").asnumpy(), np.full((2, 2), 3))
    assert nd.zeros_like(nd.ones((2, 3), dtype="float64")).dtype == np.float64
    assert nd.ones(3).shape == (3,)


def test_no_gpu_raises_device_error():
    if kiln.num_gpus() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(kiln.DeviceError, match="gpu\\(0\\) (does not exist|is not available)"):
        nd.zeros((2,), device=kiln.gpu(0))
    with pytest.raises(kiln.DeviceError, match="kiln.cpu"):
        nd.ones((2,)).to_device(kiln.gpu(0))
    with pytest.raises(ValueError):  # DeviceError is a ValueError
        nd.array([1.0], device=kiln.gpu(0))
