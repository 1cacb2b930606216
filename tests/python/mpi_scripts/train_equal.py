"""Data-parallel training across processes equals one process on the whole batch.

Every rank trains the same MLP (same seed) with kiln.Trainer on its share of each minibatch
(samples rank, rank + size, ...), split again over two CPU devices; the Trainer sums gradients
over the devices and, because kiln.distributed is initialized, over the processes. Rank 0 saves
its parameters to argv[1]; the test trains one process on the whole batches and compares.
Usage: mpirun -np 2 python3 train_equal.py OUT.npz [--hybridize]
"""
import sys

import numpy as np

import kiln
from kiln import autograd, nd, nn

STEPS, BATCH = 4, 12


def batches():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((STEPS, BATCH, 5)).astype(np.float32)
    y = rng.integers(0, 3, (STEPS, BATCH)).astype(np.float32)
    return X, y


def train(devices, X, y, hybridize):
    nd.random.seed(1)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
    net.initialize(init=kiln.init.Normal(0.5), device=devices)
    if hybridize:
        net.hybridize()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    for s in range(X.shape[0]):
        Xs = kiln.split_and_load(X[s], devices, even_split=False)
        ys = kiln.split_and_load(y[s], devices, even_split=False)
        with autograd.record():
            ls = [loss(net(a), b) for a, b in zip(Xs, ys)]
        autograd.backward(ls)
        trainer.step(BATCH)  # the whole batch, over all processes
    return [p.data().asnumpy() for p in net.collect_params().values()]


if __name__ == "__main__":
    from kiln import distributed
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    X, y = batches()
    # --gpu: one GPU per process (with KILN_GPU_SIM=1 each process simulates its own).
    devices = [kiln.gpu(distributed.local_rank() % kiln.num_gpus())] if "--gpu" in sys.argv else [kiln.cpu(0), kiln.cpu(1)]
    weights = train(devices, X[:, rank::size], y[:, rank::size], "--hybridize" in sys.argv)
    if rank == 0:
        np.savez(sys.argv[1], *weights)
    print(f"RESULT trained {rank} {size}", flush=True)
