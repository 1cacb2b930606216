"""Training on several devices from scratch, as d2l.ai's "Multiple GPUs" section 12.5 does it.

The story (the book's own building blocks, on kiln arrays):
  1. LeNet written with raw parameters and nd operators (no nn.Block);
  2. get_params copies the parameters to a device and attaches gradients there;
  3. allreduce sums arrays that live on different devices and copies the sum back to each;
  4. split_batch cuts a minibatch into one slice per device (kiln.split_and_load);
  5. train_batch runs forward and backward on every device, allreduces each gradient, and
     updates every device's copy with minibatch SGD, so the copies stay identical.
Devices: every GPU, or the CPU devices cpu(0) and cpu(1) when there is none (separate engine
devices with their own workers, so the same code runs without a GPU). At the end the copies on
all devices are checked to be equal.

Run: python3 examples/python/multi_device_scratch.py [--small] [--devices N]
"""
import argparse
import time

import numpy as np

import kiln
from kiln import autograd, nd
from kiln.data import DataLoader, FashionMNIST, transforms


# 1. The model: LeNet on raw parameters, scale 0.01 as in the book.
def init_params(scale=0.01):
    r = lambda *shape: nd.random.normal(0, scale, shape)  # noqa: E731
    return [r(20, 1, 3, 3), nd.zeros(20), r(50, 20, 5, 5), nd.zeros(50),
            r(800, 128), nd.zeros(128), r(128, 10), nd.zeros(10)]


def lenet(X, params):
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h1 = nd.avg_pool2d(nd.relu(nd.conv2d(X, W1, b1)), 2, 2)
    h2 = nd.avg_pool2d(nd.relu(nd.conv2d(h1, W2, b2)), 2, 2)
    h3 = nd.relu(nd.dot(h2.reshape((h2.shape[0], -1)), W3) + b3)
    return nd.dot(h3, W4) + b4


loss_fn = kiln.loss.SoftmaxCrossEntropyLoss()


# 2. Parameters on a device, with gradients there.
def get_params(params, device):
    new_params = [p.copyto(device) for p in params]
    for p in new_params:
        p.attach_grad()
    return new_params


# 3. Sum over devices, then copy the sum back to every device.
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].device)
    for i in range(1, len(data)):
        data[0].copyto(data[i])


# 4. One slice of the batch per device.
def split_batch(X, y, devices):
    assert X.shape[0] == y.shape[0]
    return (kiln.split_and_load(X, devices, even_split=False),
            kiln.split_and_load(y, devices, even_split=False))


def sgd(params, lr, batch_size):
    for p in params:
        p[:] = p - lr * p.grad / batch_size


# 5. One minibatch on every device.
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    with autograd.record():
        ls = [loss_fn(lenet(X_shard, device_W), y_shard)
              for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)]
    for l in ls:  # backward runs on each device
        l.backward()
    with autograd.pause():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(X_shards))])
            for c in range(len(X_shards), len(devices)):  # a device without samples (tiny batch)
                device_params[0][i].grad.copyto(device_params[c][i].grad)
    for param in device_params:  # the same update on every device
        sgd(param, lr, X.shape[0])


def evaluate(params, data_iter, device):
    correct = total = 0
    for X, y in data_iter:
        y_hat = lenet(X.as_in_context(device), params)
        correct += int((y_hat.argmax(axis=1).astype("int32") == y.as_in_context(device).astype("int32"))
                       .astype("float32").sum().item())
        total += y.shape[0]
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2, help="how many devices (GPUs, else CPU devices)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--small", action="store_true", help="CI: 1024 train / 512 test images, 1 epoch")
    p.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    if args.small:
        args.limit, args.epochs = args.limit or 1024, 1

    devices = kiln.gpus()[:args.devices] or [kiln.cpu(i) for i in range(args.devices)]
    kiln.nd.random.seed(0)
    to_tensor = transforms.ToTensor()
    train = FashionMNIST(args.root, train=True, limit=args.limit).transform_first(to_tensor)
    test = FashionMNIST(args.root, train=False, limit=args.limit and args.limit // 2).transform_first(to_tensor)
    train_iter = DataLoader(train, args.batch_size, shuffle=True, seed=0, last_batch="discard")
    test_iter = DataLoader(test, args.batch_size)

    params = init_params()
    device_params = [get_params(params, d) for d in devices]
    print(f"training on {devices}")
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, args.lr)
        kiln.waitall()
        seconds = time.perf_counter() - start
        acc = evaluate(device_params[0], test_iter, devices[0])
        print(f"epoch {epoch}: test acc {acc:.3f}, {seconds:.1f} s on {len(devices)} devices")
    # The copies followed identical updates: they are equal on every device.
    first = [w.asnumpy() for w in device_params[0]]
    for c in range(1, len(devices)):
        for i, w in enumerate(device_params[c]):
            np.testing.assert_array_equal(w.asnumpy(), first[i])
    print("parameters identical on every device")


if __name__ == "__main__":
    main()
