"""Issue 17, found by probing as a user would: shapes whose element or byte count overflows
64 bits (once given a wrapped-around tiny buffer), allocations no machine can satisfy, big-endian
NumPy input (once read as little-endian), and NumPy's boolean and 0-d integer indices."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln import nd
from kiln.gluon import nn

# ---- shapes past 64 bits ---------------------------------------------------------------------


def _shape_error(fn, *parts):
    with pytest.raises(kiln.ShapeError) as info:
        fn()
    msg = str(info.value)
    for p in parts:
        assert p in msg, msg
    return msg


def test_zeros_whose_byte_count_overflows():
    _shape_error(lambda: nd.zeros((2**61,), dtype='float64')[10].asnumpy(),
                 "full: the output shape (2305843009213693952,)", "8-byte elements",
                 "more bytes than fit in 64 bits", "expected a shape of fewer elements")


def test_ones_whose_element_count_overflows():
    _shape_error(lambda: nd.ones((2**62, 4)).sum(axis=1),
                 "(4611686018427387904, 4) has more elements than fit in 64 bits")


def test_full_whose_element_count_overflows():
    _shape_error(lambda: nd.full((1 << 33, 1 << 31), 7.0),
                 "full: the output shape (8589934592, 2147483648) has more elements")


def test_random_normal_whose_element_count_overflows():
    _shape_error(lambda: nd.random.normal(shape=(1 << 32, 1 << 32)),
                 "normal: the output shape (4294967296, 4294967296) has more elements")


def test_negative_dimensions_stay_refused():
    with pytest.raises(ValueError, match="negative"):
        nd.zeros((-1, 3))
    with pytest.raises(kiln.ShapeError, match="negative dimension"):
        nd.broadcast_to(nd.ones((3,)), (-5, 3))


def test_broadcast_and_reshape_that_overflow():
    a = nd.zeros((1, 1))
    col, row = a.broadcast_to((1 << 32, 1)), a.broadcast_to((1, 1 << 32))  # zero-stride views
    _shape_error(lambda: col + row, "add: the output shape (4294967296, 4294967296) has more elements")
    _shape_error(lambda: nd.arange(4).reshape((2**62, 4, -1)),
                 "cannot reshape an array of shape (4,) (4 elements) to (4611686018427387904, 4, -1)")
    _shape_error(lambda: nd.arange(4).reshape((2**32, 2**32, 4)), "(4294967296, 4294967296, 4)")


def test_convolution_and_pooling_windows_that_overflow():
    x, w = nd.ones((1, 1, 5, 5)), nd.ones((1, 1, 3, 3))
    with pytest.raises(ValueError, match=r"conv2d: attribute 'dilation' must be in \[1, 2147483647\], "
                                         r"found \[4611686018427387904, 1\]"):
        nd.conv2d(x, w, dilation=(2**62, 1))
    with pytest.raises(ValueError, match=r"attribute 'padding' must be in \[0, 2147483647\]"):
        nd.conv2d(x, w, padding=(1, 2**62))
    with pytest.raises(ValueError, match=r"attribute 'stride' must be in \[1, 2147483647\]"):
        nd.conv2d(x, w, stride=(2**40, 1))
    _shape_error(lambda: nd.conv2d(x, w, dilation=(2**31 - 1, 1)),
                 "conv2d: the height window (4294967295 with dilation) is larger than the padded input")
    y = nd.conv2d(x, w, stride=(2**31 - 1, 2**31 - 1))  # the largest stride is valid: one window
    assert y.shape == (1, 1, 1, 1) and y.asnumpy().item() == 9.0
    with pytest.raises(kiln.OutOfMemoryError, match=r"out of memory on cpu\(0\) allocating 17592236376100 bytes"):
        nd.conv2d(x, w, padding=(2**20, 2**20)).wait_to_read()  # 16 TiB of output: valid, too big
    with pytest.raises(ValueError, match="attribute 'kernel' must be in"):
        nd.max_pool2d(x, kernel=(2**62, 2))
    _shape_error(lambda: nd.max_pool2d(x, kernel=(2**31 - 1, 2)), "larger than the padded input")
    with pytest.raises(ValueError, match="at most half"):
        nd.max_pool2d(x, kernel=(2, 2), padding=(2**30, 0))


def test_a_valid_size_that_cannot_be_allocated_is_out_of_memory():
    with pytest.raises(kiln.OutOfMemoryError) as info:  # 2**40 bytes: far above this host's memory
        nd.zeros((2**38,)).asnumpy()
    assert "out of memory on cpu(0) allocating 1099511627776 bytes" in str(info.value)
    with pytest.raises(kiln.OutOfMemoryError) as info:  # above 1 EiB: refused before asking the system
        nd.zeros((2**61,), dtype='uint8')
    assert "cannot allocate 2305843009213693952 bytes on cpu(0)" in str(info.value)
    assert nd.ones((3,)).sum().asnumpy().item() == 3.0  # the process stays usable


class _Huge(nn.HybridBlock):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.broadcast_to(self.shape) + 1


def test_hybridized_shapes_that_overflow():
    net = _Huge((1 << 33, 1 << 31))
    net.hybridize()
    _shape_error(lambda: net(nd.ones((1, 1))).asnumpy(), "(8589934592, 2147483648) has more elements")
    net = _Huge((2**38,))  # 2**40 bytes: a valid shape that this host cannot allocate
    net.hybridize()
    with pytest.raises(kiln.OutOfMemoryError, match=r"out of memory on cpu\(0\) allocating 1099511627776 bytes"):
        net(nd.ones((1,))).wait_to_read()
    net = _Huge((2, 3))  # the same block with a sane shape still works once hybridized
    net.hybridize()
    np.testing.assert_array_equal(net(nd.ones((1, 1))).asnumpy(), np.full((2, 3), 2.0))


def test_simulated_gpu_absurd_sizes():
    code = textwrap.dedent("""
        import kiln
        from kiln import nd
        try:
            nd.zeros((2**40,), ctx=kiln.gpu(0)).wait_to_read()    # 4 TiB on a simulated GPU
        except kiln.OutOfMemoryError as e:
            assert "out of memory on gpu(0) allocating 4398046511104 bytes" in str(e), str(e)
        else:
            raise AssertionError("expected OutOfMemoryError")
        try:
            nd.full((1 << 33, 1 << 31), 7.0, ctx=kiln.gpu(1))
        except kiln.ShapeError as e:
            assert "(8589934592, 2147483648) has more elements" in str(e), str(e)
        else:
            raise AssertionError("expected ShapeError")
        assert nd.ones((4,), ctx=kiln.gpu(0)).sum().asnumpy().item() == 4.0
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, KILN_GPU_SIM="2"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# ---- big-endian NumPy input ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [">f4", ">i8", ">f8", ">i4", "<f4", "<i8"])
def test_array_of_non_native_byte_order(dtype):
    ref = np.arange(-3, 9).reshape(3, 4)
    src = ref.astype(dtype)
    x = nd.array(src)
    assert x.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(x.asnumpy(), ref)
    np.testing.assert_array_equal(nd.array(src.T).asnumpy(), ref.T)  # strided as well


def test_big_endian_values_for_setitem_arithmetic_and_indices():
    x = nd.zeros((2, 3))
    x[:] = np.array([[1, 2, 3], [4, 5, 6]], dtype=">f4")
    np.testing.assert_array_equal(x.asnumpy(), [[1, 2, 3], [4, 5, 6]])
    x[0] = np.array(9, dtype=">f8")
    np.testing.assert_array_equal(x.asnumpy()[0], [9, 9, 9])
    np.testing.assert_array_equal((x + np.ones(3, dtype=">f4")).asnumpy(), x.asnumpy() + 1)
    np.testing.assert_array_equal(x[np.array([1, 0], dtype=">i8")].asnumpy(), x.asnumpy()[[1, 0]])


# ---- NumPy's boolean and 0-d integer indices -------------------------------------------------

_KEYS = [True, False, np.True_, np.False_, np.array(True), np.array(False), (True,), (True, 0),
         (0, True), (slice(None), True), (slice(None), True, 0), (True, True), (True, False),
         (0, slice(None), True), (Ellipsis, True), (None, True), (slice(None), 0, slice(None), True),
         np.array(1), np.int64(-1), (np.array(1), 0), (slice(None), np.array(2)),
         (1, slice(None), np.array(2)), (np.array(0), Ellipsis, np.array(-1))]


@pytest.mark.parametrize("key", _KEYS, ids=repr)
def test_getitem_matches_numpy(key):
    ref = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = nd.array(ref)[key]
    want = ref[key]
    assert got.shape == want.shape, (key, got.shape, want.shape)
    np.testing.assert_array_equal(got.asnumpy(), want)


def test_bool_index_adds_an_axis():
    x = nd.arange(3)
    assert x[True].shape == (1, 3) and x[False].shape == (0, 3)
    np.testing.assert_array_equal(x[True].asnumpy(), [[0, 1, 2]])
    s = nd.array(np.float32(5))
    assert s[True].shape == (1,) and s[False].shape == (0,)
    y = x[True]  # a copy, as NumPy's boolean indices make
    y[:] = 7
    np.testing.assert_array_equal(x.asnumpy(), [0, 1, 2])


def test_zero_d_integer_array_drops_the_axis():
    x = nd.arange(6).reshape((2, 3))
    assert x[np.array(1)].shape == (3,)
    np.testing.assert_array_equal(x[np.array(1)].asnumpy(), [3, 4, 5])
    assert x[np.array(1), np.array(2)].shape == ()
    with pytest.raises(IndexError, match="out of bounds"):
        x[np.array(2)]
    with pytest.raises(IndexError, match="valid indices"):
        x[1.0]  # NumPy refuses float indices too


def test_setitem_with_bool_and_zero_d_keys():
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    for key, value in [(True, 5.0), (False, 5.0), (np.array(1), 7.0), ((True, 0), [1, 2, 3]),
                       ((0, True), np.array([[4, 5, 6]], dtype=np.float32)), (np.True_, 1.0)]:
        x, want = nd.array(ref), ref.copy()
        x[key] = value
        want[key] = value
        np.testing.assert_array_equal(x.asnumpy(), want, err_msg=repr(key))


def test_bool_index_is_differentiable_and_traces():
    x = nd.array([1., 2., 3.])
    x.attach_grad()
    with kiln.autograd.record():
        y = (x[True] * nd.array([[1., 2., 3.]])).sum()
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [1, 2, 3])

    class Block(nn.HybridBlock):
        def forward(self, x):
            return x[True] * 2 + x[np.array(0)]

    net = Block()
    eager = net(nd.arange(6).reshape((2, 3))).asnumpy()
    net.hybridize()
    traced = net(nd.arange(6).reshape((2, 3))).asnumpy()
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(eager, ref[True] * 2 + ref[0])
    np.testing.assert_array_equal(traced, eager)
