"""Run under mpirun -np 2: the ranks reduce arrays of different sizes (small: packed path; large:
ring path) without check_schedule; both must raise a clear error instead of hanging or corrupting
memory. Prints "RESULT <size> <message>" per case."""
import numpy as np

import kiln
import kiln.distributed as dist
from kiln import nd

dist.init(timeout=20)
r = dist.rank()
for n in (100, 300_000):
    x = nd.array(np.ones(n + 7 * r, dtype=np.float32))
    dist.allreduce([x])
    try:
        x.asnumpy()
        print(f"RESULT {n} no error", flush=True)
    except kiln.StateError as e:
        print(f"RESULT {n} {e}", flush=True)
y = nd.array(np.ones(5, dtype=np.float32))
dist.allreduce([y])  # the world is still usable: the mismatch was found before any data moved
assert y.asnumpy()[0] == 2
