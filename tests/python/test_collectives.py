"""kiln._C collectives among in-process CPU devices (allreduce, broadcast, reduce_scatter,
all_gather) against NumPy, with bit-identical results on every device, one engine task per call,
and the argument errors."""
import numpy as np
import pytest

import kiln
from kiln import _C, nd

DEVICES = [kiln.cpu(i) for i in range(4)]


def _arrays(values, dtype):
    return [nd.array(v.astype(dtype), device=d) for v, d in zip(values, DEVICES)]


def _device_order(values, op):
    """The reference: accumulate in device order, in the dtype (as kiln promises)."""
    acc = values[0].copy()
    for v in values[1:]:
        acc = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[op](acc, v)
    if op == "mean":
        acc = acc / acc.dtype.type(len(values)) if acc.dtype.kind == "f" else acc // len(values)
    return acc


@pytest.mark.parametrize("ndev", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_allreduce_matches_numpy_on_every_device(ndev, op, dtype):
    rng = np.random.default_rng(ndev)
    shapes = [(7,), (3, 5), (1001,)]
    values = [[(rng.standard_normal(s) * 100).astype(dtype) for s in shapes] for _ in range(ndev)]
    groups = [[nd.array(v, device=DEVICES[d]) for v in values[d]] for d in range(ndev)]
    _C.allreduce(groups, op=op)
    for k in range(len(shapes)):
        col = [values[d][k] for d in range(ndev)]
        if op == "mean" and np.dtype(dtype).kind == "i":
            want = np.trunc(np.sum(col, axis=0) / ndev).astype(dtype)  # integer mean truncates
        else:
            want = _device_order(col, op)
        for d in range(ndev):
            got = groups[d][k].asnumpy()
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want)
            assert got.tobytes() == groups[0][k].asnumpy().tobytes()


def test_allreduce_float16_sums_in_float():
    vals = [np.full(9, 0.1, np.float16), np.full(9, 0.2, np.float16), np.full(9, 0.3, np.float16)]
    groups = [[nd.array(v, device=d)] for v, d in zip(vals, DEVICES)]
    _C.allreduce(groups)
    want = ((vals[0].astype(np.float32) + vals[1]) + vals[2]).astype(np.float16)
    for g in groups:
        np.testing.assert_array_equal(g[0].asnumpy(), want)


def test_allreduce_is_one_task_and_returns_before_reading():
    groups = [[nd.ones((1000,), device=d), nd.ones((3,), device=d)] for d in DEVICES]
    kiln.waitall()
    before = _C.engine_stats()["pushed"]
    _C.allreduce(groups)
    assert _C.engine_stats()["pushed"] - before == 1
    np.testing.assert_array_equal(groups[3][0].asnumpy(), 4.0)


def test_allreduce_waits_for_pending_ops_on_every_device():
    xs = [nd.ones((100000,), device=d) for d in DEVICES[:2]]
    ys = [x * (i + 2) for i, x in enumerate(xs)]  # queued: 2 and 3
    _C.allreduce([[y] for y in ys], op="sum")
    np.testing.assert_array_equal(ys[0].asnumpy(), 5.0)
    np.testing.assert_array_equal(ys[1].asnumpy(), 5.0)


def test_broadcast():
    arrays = [nd.array(np.arange(5) * (d + 1), device=dev) for d, dev in enumerate(DEVICES)]
    _C.broadcast([[a] for a in arrays], root=2)
    for a in arrays:
        np.testing.assert_array_equal(a.asnumpy(), np.arange(5) * 3)


@pytest.mark.parametrize("n", [1, 7, 10, 1003])
@pytest.mark.parametrize("ndev", [1, 2, 3, 4])
def test_reduce_scatter_then_all_gather_is_allreduce(n, ndev):
    rng = np.random.default_rng(n)
    values = [rng.standard_normal(n).astype(np.float32) for _ in range(ndev)]
    inputs = _arrays(values, np.float32)[:ndev]
    parts = np.array_split(np.zeros(n), ndev)
    outputs = [nd.zeros((len(p),), device=d) for p, d in zip(parts, DEVICES)]
    _C.reduce_scatter(inputs, outputs, op="max")
    want = _device_order(values, "max")
    for d, piece in enumerate(np.array_split(want, ndev)):
        np.testing.assert_array_equal(outputs[d].asnumpy(), piece)
    gathered = [nd.zeros((n,), device=d) for d in DEVICES[:ndev]]
    _C.all_gather(outputs, gathered)
    for g in gathered:
        np.testing.assert_array_equal(g.asnumpy(), want)


def test_all_gather_uneven_parts_in_device_order():
    parts = [np.arange(3), np.arange(0), np.arange(5) + 10]
    inputs = [nd.array(p.astype(np.int64), device=d) for p, d in zip(parts, DEVICES)]
    outputs = [nd.zeros((2, 4), dtype="int64", device=d) for d in DEVICES[:3]]
    _C.all_gather(inputs, outputs)
    for o in outputs:
        np.testing.assert_array_equal(o.asnumpy().ravel(), np.concatenate(parts))


def test_errors_name_the_device_and_what_differs():
    with pytest.raises(ValueError, match="not a reduction: expected one of sum, mean, max, min"):
        _C.allreduce([[nd.ones((2,))]], op="avg")
    with pytest.raises(ValueError, match="empty list"):
        _C.allreduce([])
    with pytest.raises(kiln.ShapeError, match=r"tensor 0 of device 1 has shape \(3,\)"):
        _C.allreduce([[nd.ones((2,), device=DEVICES[0])], [nd.ones((3,), device=DEVICES[1])]])
    with pytest.raises(kiln.DeviceError, match=r"entries 0 and 1 are both on cpu\(0\)"):
        _C.allreduce([[nd.ones((2,))], [nd.ones((2,))]])
    with pytest.raises(kiln.DTypeError, match="has dtype float64"):
        _C.allreduce([[nd.ones((2,), device=DEVICES[0])], [nd.array(np.ones(2), device=DEVICES[1])]])
    with pytest.raises(ValueError, match="root 5 is not a device of the call"):
        _C.broadcast([[nd.ones((2,), device=DEVICES[0])], [nd.ones((2,), device=DEVICES[1])]], root=5)
    with pytest.raises(kiln.ShapeError, match=r"outputs\[0\] has 3 elements"):
        _C.reduce_scatter([nd.ones((4,), device=d) for d in DEVICES[:2]],
                          [nd.ones((3,), device=d) for d in DEVICES[:2]])
    with pytest.raises(ValueError, match="bad"):
        _C.reduce_scatter([nd.ones((4,))], [nd.ones((4,))], op="bad")


def test_views_contiguous_ones_in_place_strided_ones_refused():
    x = nd.array(np.arange(12.0).reshape(3, 4))
    y = nd.array(np.ones((3, 4)), device=DEVICES[1])
    _C.allreduce([[x[1]], [y[1]]])  # a row is a contiguous view: reduced in place in its parent
    np.testing.assert_array_equal(x.asnumpy()[1], np.arange(4, 8) + 1)
    np.testing.assert_array_equal(x.asnumpy()[0], np.arange(4))
    with pytest.raises(ValueError, match=r"tensor 0 of device 0 \(shape \(3,\)\) is a non-contiguous view"):
        _C.allreduce([[x[:, 1]], [y[:, 1]]])
