"""Run under mpirun -np N with a GPU per rank: allreduce of gpu(local_rank()) arrays over NCCL
(real GPUs) or through MPI via host copies (simulated GPUs, KILN_GPU_SIM). Prints "OK <rank>"."""
import numpy as np

import kiln
import kiln.distributed as dist
from kiln import nd

dist.init(timeout=60)
r, n = dist.rank(), dist.size()
dev = kiln.gpu(dist.local_rank() % kiln.num_gpus())
for dtype in (np.float32, np.float64):
    x = nd.array(np.arange(100003, dtype=dtype) * (r + 1), device=dev)
    y = x * 1.0                      # queued on the GPU: the allreduce waits for it
    dist.allreduce([y], op="sum")
    np.testing.assert_allclose(y.asnumpy(), np.arange(100003) * n * (n + 1) / 2, rtol=1e-6)
    y = x * 1.0                      # the mean of the ranks' own arrays, not of the sum
    dist.allreduce([y], op="mean")
    np.testing.assert_allclose(y.asnumpy(), np.arange(100003) * (n + 1) / 2, rtol=1e-6)
dist.finalize()
print("OK", r, flush=True)
