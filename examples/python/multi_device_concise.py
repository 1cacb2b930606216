"""Training on several devices, concisely, as d2l.ai's section 12.6 does it: the small ResNet-18
on Fashion-MNIST with a Trainer on every device available; also across processes under mpirun.

The story:
  1. d2l's ResNet-18 for 28x28 images (3x3 stem, no max-pool, four stages of two residual blocks);
  2. initialize it on every device (every GPU, or CPU devices cpu(0) and cpu(1) without one):
     each device holds a copy of every parameter;
  3. each minibatch is split over the devices (split_and_load); each device computes its loss;
     backward; trainer.step sums the gradients over the devices (bucketed collectives that start
     while the backward is still running) and updates every copy with one fused kernel per device;
  4. under `mpirun -np N` (kiln.distributed.init()), every process trains on its own shard of the
     data with the same code: the Trainer's kvstore becomes 'dist_sync' and the gradients are
     summed across the processes too. Rank 0 prints.
At the end the copies on all devices (and, with mpirun, all processes) are checked to be equal.

Run: python3 examples/python/multi_device_concise.py [--small] [--devices N] [--hybridize]
     mpirun -np 2 python3 examples/python/multi_device_concise.py --small
"""
import argparse
import os
import time

import numpy as np

import kiln
from kiln import autograd, nn
from kiln.data import DataLoader, FashionMNIST, Subset, transforms


# 1. The model.
def resnet18(num_classes, width=64):
    def resnet_block(num_channels, num_residuals, first_block=False):
        blk = nn.HybridSequential()
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.add(nn.Residual(num_channels, use_1x1conv=True, strides=2))
            else:
                blk.add(nn.Residual(num_channels))
        return blk

    net = nn.HybridSequential()
    # A smaller stem than ImageNet's ResNet: 3x3 convolution, stride 1, no max-pooling.
    net.add(nn.Conv2D(width, kernel_size=3, strides=1, padding=1), nn.BatchNorm(), nn.Activation("relu"))
    net.add(resnet_block(width, 2, first_block=True), resnet_block(2 * width, 2),
            resnet_block(4 * width, 2), resnet_block(8 * width, 2))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net


def under_mpirun():
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2, help="devices per process (GPUs, else CPU devices)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256, help="per process, split over its devices")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (d2l: 64)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--hybridize", action="store_true")
    p.add_argument("--small", action="store_true", help="CI: 256 train / 256 test images, width 16, 1 epoch")
    p.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    if args.small:
        args.limit, args.epochs, args.width, args.batch_size = args.limit or 256, 1, 16, 64

    rank, size = 0, 1
    if under_mpirun():
        from kiln import distributed
        distributed.init()
        rank, size = distributed.rank(), distributed.size()
    say = print if rank == 0 else (lambda *a, **k: None)

    devices = kiln.gpus()[:args.devices] or [kiln.cpu(i) for i in range(args.devices)]
    kiln.nd.random.seed(0)  # every process starts from the same parameters
    to_tensor = transforms.ToTensor()
    train = FashionMNIST(args.root, train=True, limit=args.limit).transform_first(to_tensor)
    test = FashionMNIST(args.root, train=False, limit=args.limit).transform_first(to_tensor)
    # This process's share of the data; every share equally long, so all take the same steps.
    shard = Subset(train, range(rank, len(train) // size * size, size))
    train_iter = DataLoader(shard, args.batch_size, shuffle=True, seed=rank, last_batch="discard")
    test_iter = DataLoader(test, args.batch_size)

    # 2. A copy of every parameter on every device.
    net = resnet18(10, args.width)
    net.initialize(init=kiln.init.Normal(sigma=0.01), device=devices)
    if args.hybridize:
        net.hybridize()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr})
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    say(f"training ResNet-18 (width {args.width}) on {devices} x {size} process(es), "
        f"{len(train)} images, batch {args.batch_size} per process")

    # 3. Train.
    for epoch in range(1, args.epochs + 1):
        start, samples = time.perf_counter(), 0
        for X, y in train_iter:
            Xs = kiln.split_and_load(X, devices, even_split=False)
            ys = kiln.split_and_load(y, devices, even_split=False)
            with autograd.record():
                ls = [loss(net(x), t) for x, t in zip(Xs, ys)]
            for l in ls:
                l.backward()
            trainer.step(X.shape[0] * size)
            samples += X.shape[0] * size
        kiln.waitall()
        seconds = time.perf_counter() - start
        acc = kiln.utils.evaluate_accuracy(net, test_iter, devices[0])
        say(f"epoch {epoch}: test acc {acc:.3f}, {seconds:.1f} s, {samples / seconds:.0f} images/s "
            f"on {len(devices) * size} devices")

    # Every copy followed the same summed gradients.
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    for p in params:
        first = p.list_data()[0].asnumpy()
        for w in p.list_data()[1:]:
            np.testing.assert_array_equal(w.asnumpy(), first)
    if size > 1:
        from kiln import distributed
        check = kiln.nd.array(np.array([float(params[-1].list_data()[0].asnumpy().sum())]))
        mine = check.asnumpy()[0]
        distributed.allreduce([check], op="max")
        assert check.asnumpy()[0] == mine, "parameters differ across processes"
    say("parameters identical on every device" + (" and process" if size > 1 else ""))


if __name__ == "__main__":
    main()
