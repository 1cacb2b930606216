"""DLPack both ways with NumPy and PyTorch: no copies (checked by writing through one side and
reading the other), strided views, dtypes, capsule protocol, and lifetimes (either side may go
first)."""
import gc
import weakref

import numpy as np
import pytest

import kiln
from kiln import nd

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]


# ---- kiln -> consumers ----

def test_dlpack_device():
    assert nd.ones((2,)).__dlpack_device__() == (1, 0)  # kDLCPU, device 0


def test_torch_shares_memory_with_kiln_both_ways():
    x = nd.arange(6).reshape(2, 3)
    t = torch.from_dlpack(x)
    assert t.shape == (2, 3) and t.dtype == torch.float32
    t[0, 0] = 42  # torch writes, kiln reads
    assert x[0, 0].item() == 42
    x[1, 2] = -1  # kiln writes (queued), torch reads after kiln waits
    x.wait_to_read()
    assert t[1, 2].item() == -1
    x += 1
    kiln.waitall()
    assert t[0, 0].item() == 43


def test_numpy_sees_kiln_writes():
    x = nd.zeros((4,), dtype="float64")
    a = np.from_dlpack(x)
    x[1:3] = 7
    x.wait_to_read()
    np.testing.assert_array_equal(a, [0, 7, 7, 0])


def test_export_waits_for_queued_writes():
    x = nd.zeros((1000,))
    for _ in range(20):
        x += 1  # queued; __dlpack__ must wait for all of them
    np.testing.assert_array_equal(np.from_dlpack(x), np.full(1000, 20, np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_roundtrip(dtype):
    a = (np.arange(5) % 3).astype(dtype)
    x = nd.array(a)
    np.testing.assert_array_equal(np.from_dlpack(x), a)
    assert str(np.from_dlpack(x).dtype) == dtype
    assert str(torch.from_dlpack(x).dtype) == "torch." + dtype
    back = nd.from_dlpack(torch.from_dlpack(x))
    assert back.dtype == np.dtype(dtype) and back._shares_storage(x) is False
    np.testing.assert_array_equal(back.asnumpy(), a)


def test_bool_is_exported_as_kDLBool():
    # DLPack v0.8's kDLBool; NumPy 1.24 and torch 1.13 predate it and refuse it, kiln reads it back.
    x = nd.array(np.array([True, False, True]))
    y = nd.from_dlpack(x)
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y.asnumpy(), [True, False, True])


def test_strided_views_export_their_strides():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = nd.array(a)
    for v, w in [(x.T, a.T), (x[1:, ::2], a[1:, ::2]), (x[2:, 1], a[2:, 1])]:
        t = torch.from_dlpack(v)
        np.testing.assert_array_equal(t.numpy(), w)
        assert t.stride() == v._strides()
        np.testing.assert_array_equal(np.from_dlpack(v), w)
    with pytest.raises(BufferError, match="negative strides"):
        x[::-1].__dlpack__()
    np.testing.assert_array_equal(nd.from_dlpack(x[::-1].__dlpack__(copy=True)).asnumpy(), a[::-1])
    t = torch.from_dlpack(x.T)
    t[0, 1] = 100  # the transposed view writes into x[1, 0]
    assert x[1, 0].item() == 100


def test_capsule_protocol():
    x = nd.ones((3,))
    cap = x.__dlpack__()
    assert type(cap).__name__ == "PyCapsule" and "dltensor" in repr(cap)
    y = nd.from_dlpack(cap)
    assert "used_dltensor" in repr(cap)
    assert y._shares_storage(x)  # kiln's own capsule: the same storage, so ops on both stay ordered
    with pytest.raises(kiln.ArgumentError, match="consumed only once"):
        nd.from_dlpack(cap)
    del cap
    gc.collect()
    np.testing.assert_array_equal(y.asnumpy(), [1, 1, 1])
    unused = nd.to_dlpack(x)  # never consumed: its destructor frees the export
    del unused
    gc.collect()


def test_exported_memory_outlives_the_kiln_array():
    x = nd.arange(4)
    t = torch.from_dlpack(x)
    del x
    gc.collect()
    kiln.waitall()
    np.testing.assert_array_equal(t.numpy(), [0, 1, 2, 3])
    t += 1
    np.testing.assert_array_equal(t.numpy(), [1, 2, 3, 4])


# ---- producers -> kiln ----

def test_from_numpy_shares_memory():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    x = nd.from_dlpack(a)
    assert x.shape == (3, 4) and x.dtype == np.float64
    x[0, 0] = 100  # kiln writes into NumPy's memory
    x.wait_to_read()
    assert a[0, 0] == 100
    a[2, 3] = -5  # NumPy writes, kiln reads
    assert x[2, 3].item() == -5


def test_from_torch_shares_memory():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x = nd.from_dlpack(t)
    t[1, 1] = 50
    assert x[1, 1].item() == 50
    x *= 2
    kiln.waitall()
    assert t[1, 1].item() == 100
    y = nd.from_dlpack(t.__dlpack__())  # a capsule works too
    assert y._shares_storage(x) is False and y[0, 1].item() == 2


def test_from_noncontiguous_sources_are_strided_views():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for src, want in [(a[:, ::2], a[:, ::2]), (a.T, a.T), (a[::-1, 1:], a[::-1, 1:])]:
        x = nd.from_dlpack(src)
        np.testing.assert_array_equal(x.asnumpy(), want)
        np.testing.assert_array_equal((x + 1).asnumpy(), want + 1)
    t = torch.arange(10.0).flip(0)  # negative strides
    x = nd.from_dlpack(t)
    np.testing.assert_array_equal(x.asnumpy(), np.arange(10.0)[::-1])
    x[0] = -1
    x.wait_to_read()
    assert t[0].item() == -1
    tt = torch.arange(12.0).reshape(3, 4).t()
    np.testing.assert_array_equal(nd.from_dlpack(tt).asnumpy(), tt.numpy())


def test_producer_may_be_deleted_first():
    a = np.arange(5.0)
    ref = weakref.ref(a) if hasattr(a, "__weakref__") else None
    x = nd.from_dlpack(a)
    del a
    gc.collect()
    np.testing.assert_array_equal((x + 1).asnumpy(), [1, 2, 3, 4, 5])
    t = torch.arange(5.0)
    y = nd.from_dlpack(t)
    del t
    gc.collect()
    np.testing.assert_array_equal(y.asnumpy(), [0, 1, 2, 3, 4])


def test_kiln_releases_the_producer():
    a = np.arange(3.0)
    ref = weakref.ref(a)
    x = nd.from_dlpack(a)
    v = x[1:]  # a view keeps the storage, and so NumPy's array, alive
    del a, x
    gc.collect()
    assert ref() is not None
    assert v.asnumpy().tolist() == [1.0, 2.0]
    w = v + 1  # a queued op holds the storage too; it may be the last holder, on an engine thread
    del v
    kiln.waitall()
    del w
    gc.collect()
    assert ref() is None  # a release deferred from an engine thread ran on the main thread


def test_from_dlpack_rejects_other_objects():
    with pytest.raises(TypeError, match="__dlpack__"):
        nd.from_dlpack([1, 2, 3])
    with pytest.raises(kiln.DTypeError, match="kiln dtype"):
        nd.from_dlpack(np.arange(3, dtype=np.int16))
