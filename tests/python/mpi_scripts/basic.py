"""Run under mpirun -np N (or alone, a 1-process world): checks rank/size/local_rank, allreduce
of odd-sized arrays against NumPy, engine ordering, broadcast and barrier. Prints "OK <rank>"."""
import os

import numpy as np

import kiln
import kiln.distributed as dist
from kiln import nd

dist.init(timeout=30)
dist.init()  # idempotent
assert dist.is_initialized()
r, n = dist.rank(), dist.size()
assert 0 <= r < n, (r, n)
expected_local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
assert dist.local_rank() == expected_local, (dist.local_rank(), expected_local)


def data(rank, size, dtype, seed):
    return np.random.RandomState(seed * 100 + rank).uniform(-1, 1, size).astype(dtype)


# Odd sizes on both sides of the packing and ring thresholds and across several ring segments
# (1 MB), two dtypes, one call.
sizes = [1, 7, 1001, 16385, 100003, 300007, 700001]
for op in ("sum", "mean", "max", "min"):
    for dtype in (np.float32, np.float64):
        arrays = [nd.array(data(r, s, dtype, i)) for i, s in enumerate(sizes)]
        dist.allreduce(arrays, op=op)
        for i, (s, a) in enumerate(zip(sizes, arrays)):
            per_rank = np.stack([data(k, s, dtype, i) for k in range(n)])
            want = {"sum": per_rank.sum(0), "mean": per_rank.mean(0), "max": per_rank.max(0),
                    "min": per_rank.min(0)}[op]
            got = a.asnumpy()
            assert got.dtype == dtype, got.dtype
            tol = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{op} {dtype} size {s}")

# Integers: sum is exact.
k = nd.array(np.arange(11, dtype=np.int64) + r)
dist.allreduce(k)
np.testing.assert_array_equal(k.asnumpy(), n * np.arange(11) + n * (n - 1) // 2)

# Engine ordering: the allreduce is queued behind the op that writes x (big enough not to run
# inline), and the op after it reads the reduced values.
base = nd.array(np.full(2_000_003, r + 1, dtype=np.float32))
x = base * 3.0
for _ in range(5):
    x = x + 0.0
dist.allreduce([x])
y = x + 1.0
total = 3.0 * n * (n + 1) / 2
np.testing.assert_allclose(y.asnumpy()[[0, 1_000_000, 2_000_002]], total + 1.0)
np.testing.assert_allclose(x.asnumpy()[:3], total)

# Broadcast from the last rank.
b = nd.array(np.full(1003, float(r), dtype=np.float64))
dist.broadcast([b], root=n - 1)
np.testing.assert_array_equal(b.asnumpy(), np.full(1003, float(n - 1)))

# Clear argument errors, raised at the call.
for bad, exc in (([nd.array(np.ones(3, dtype=np.int32))], kiln.DTypeError),):
    try:
        dist.allreduce(bad, op="mean")
        raise AssertionError("no error")
    except exc as e:
        assert "mean" in str(e), e
try:
    dist.allreduce([x], op="prod")
    raise AssertionError("no error")
except kiln.ArgumentError as e:
    assert "sum, mean, max, min" in str(e), e
try:
    dist.allreduce([np.ones(3)])
    raise AssertionError("no error")
except kiln.ArgumentError as e:
    assert "NDArray" in str(e), e

dist.barrier()
dist.check_schedule([("w", (3, 4), "float32"), ("b", (4,), np.float32)])
dist.finalize()
assert not dist.is_initialized()
print(f"RESULT OK {r} {n}", flush=True)  # one write: ranks share the output
for call in (dist.barrier, lambda: dist.allreduce([x]), dist.rank):
    try:
        call()
        raise AssertionError("no error after finalize")
    except kiln.StateError as e:
        assert "finalize" in str(e), e
