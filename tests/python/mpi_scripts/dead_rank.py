"""Rank 1 dies before the allreduce (how: argv[1] = raise | exit | kill | hang); rank 0 must fail
with a clear DistributedError within the timeout (argv[2] seconds) instead of hanging."""
import os
import signal
import sys
import time

import numpy as np

import kiln
import kiln.distributed as dist
from kiln import nd

how, timeout = sys.argv[1], float(sys.argv[2])
dist.init(timeout=timeout)
x = nd.array(np.ones(1000, dtype=np.float32))
dist.allreduce([x])
x.asnumpy()                       # one good round first: both ranks are up
if dist.rank() == 1:
    if how == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        time.sleep(3 * timeout)
        os._exit(0)
start = time.time()
try:
    dist.allreduce([x])
    x.asnumpy()
    print("RESULT no error", flush=True)
except kiln.StateError as e:
    print(f"RESULT {type(e).__name__} after {time.time() - start:.1f}s: {e}", flush=True)
    sys.exit(1)
