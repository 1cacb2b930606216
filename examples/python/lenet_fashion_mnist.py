"""LeNet on Fashion-MNIST, as d2l.ai's "Multiple GPUs" section trains it, with kiln's Gluon API.

The story:
  1. read Fashion-MNIST from the local IDX files (Debian package dataset-fashion-mnist) and
     batch it with a DataLoader that prepares the next batches in a background thread;
  2. build d2l's LeNet (conv 3x3 -> relu -> avg-pool, conv 5x5 -> relu -> avg-pool, dense 128 ->
     relu, dense 10) and initialize every weight from N(0, 0.01), biases at 0;
  3. train with minibatch SGD (lr 0.2, batch 256) on softmax cross-entropy, splitting each batch
     over the chosen devices (split_and_load; the Trainer sums the gradients across them);
  4. report loss, train and test accuracy, time and throughput per epoch (a table, or JSON
     lines with --json), and optionally plot the curves (--plot PREFIX -> PREFIX.png/.svg).

Run: python3 examples/python/lenet_fashion_mnist.py [--small] [--device auto|all] [--plot lenet]
"""
import argparse
import json
import sys
import time

import kiln
from kiln import autograd, nn
from kiln.data import DataLoader, FashionMNIST, transforms
from kiln.utils import Accumulator, ProgressBar, evaluate_accuracy, plot_curves, split_and_load


def lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(channels=20, kernel_size=3, activation="relu"),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=50, kernel_size=5, activation="relu"),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Flatten(),
            nn.Dense(128, activation="relu"),  # 50 * 4 * 4 = 800 inputs
            nn.Dense(10))
    return net


def pick_devices(name, num_gpus):
    if name == "all":  # every GPU; without one, two CPU devices (data parallelism on the CPU)
        return kiln.gpus() or [kiln.cpu(0), kiln.cpu(1)]
    if name == "cpu" or (name == "auto" and kiln.num_gpus() == 0):
        return [kiln.cpu()]
    if kiln.num_gpus() == 0:
        sys.exit("--device gpu: this machine has no GPU kiln can use (kiln.num_gpus() == 0); "
                 "use --device cpu or auto")
    n = min(num_gpus or 1, kiln.num_gpus())
    return [kiln.gpu(i) for i in range(n)]


def main():
    p = argparse.ArgumentParser(description="d2l.ai LeNet on Fashion-MNIST with kiln")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--limit", type=int, default=None, help="train on the first N images (default: all 60000)")
    p.add_argument("--test-limit", type=int, default=None, help="test on the first N images (default: all 10000)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--device", choices=("cpu", "gpu", "auto", "all"), default="auto",
                   help="auto: one GPU, else the CPU; all: every GPU, else cpu(0) and cpu(1)")
    p.add_argument("--num-gpus", type=int, default=1, help="with a GPU device: split each batch over this many GPUs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="CI: 2000 train / 1000 test images, 1 epoch")
    p.add_argument("--plot", metavar="PREFIX", help="save the curves as PREFIX.png and PREFIX.svg")
    p.add_argument("--json", action="store_true", help="print one JSON line per epoch instead of the table")
    p.add_argument("--hybridize", action="store_true", help="train the compiled graph (net.hybridize())")
    p.add_argument("--export", metavar="PREFIX", help="after training, write PREFIX-symbol.json and PREFIX-0000.params")
    p.add_argument("--root", default="/usr/share/datasets/fashion-mnist", help="folder of the IDX files")
    args = p.parse_args()
    if args.small:
        args.limit, args.test_limit, args.epochs = args.limit or 2000, args.test_limit or 1000, 1

    # 1. Data: ToTensor runs on whole batches (in C++, off the GIL) in the loader's thread.
    devices = pick_devices(args.device, args.num_gpus)
    kiln.nd.random.seed(args.seed)
    to_tensor = transforms.ToTensor()
    train = FashionMNIST(args.root, train=True, limit=args.limit).transform_first(to_tensor)
    test = FashionMNIST(args.root, train=False, limit=args.test_limit).transform_first(to_tensor)
    load_on = devices[0] if len(devices) == 1 else None  # several devices: split_and_load copies
    train_iter = DataLoader(train, args.batch_size, shuffle=True, seed=args.seed, device=load_on)
    test_iter = DataLoader(test, args.batch_size, device=devices[0])

    # 2. Model: every weight from N(0, 0.01), biases at zero, a copy on each device.
    net = lenet()
    net.initialize(init=kiln.init.Normal(0.01), device=devices)
    if args.hybridize:
        net.hybridize()
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr})

    # 3. Train.
    out = sys.stdout
    if not args.json:
        print(f"training on {devices}, {len(train)} train / {len(test)} test images, batch {args.batch_size}, "
              f"lr {args.lr}", file=out)
        print(f"{'epoch':>5} {'loss':>8} {'train acc':>9} {'test acc':>8} {'seconds':>8} {'samples/s':>10}", file=out)
    history = {"train loss": [], "train acc": [], "test acc": []}
    for epoch in range(1, args.epochs + 1):
        metric = Accumulator(3)  # loss sum, correct predictions, samples
        sums = None
        start = time.perf_counter()
        bar = ProgressBar(train_iter, desc=f"epoch {epoch}")
        for X, y in bar:
            Xs = split_and_load(X, devices, even_split=False)
            ys = split_and_load(y, devices, even_split=False)
            with autograd.record():
                y_hats = [net(x) for x in Xs]
                losses = [loss(y_hat, t) for y_hat, t in zip(y_hats, ys)]
            for l in losses:
                l.backward()
            trainer.step(X.shape[0])
            # Running sums stay on the device and queued: no sync per batch.
            batch_sums = [kiln.nd.stack([l.sum(), (y_hat.argmax(axis=1).astype("int32") == t)
                                         .astype("float32").sum()]).as_in_context(devices[0])
                          for l, y_hat, t in zip(losses, y_hats, ys)]
            for s in batch_sums:
                sums = s if sums is None else sums + s
            metric.add(0, 0, X.shape[0])
            if bar.enabled and bar.n % 20 == 19:
                bar.set_postfix(f"loss {sums.asnumpy()[0] / metric[2]:.3f}")
        loss_sum, correct = sums.asnumpy().tolist()
        kiln.waitall()
        seconds = time.perf_counter() - start
        test_acc = evaluate_accuracy(net, test_iter, devices[0])
        row = {"epoch": epoch, "loss": loss_sum / metric[2], "train_acc": correct / metric[2], "test_acc": test_acc,
               "seconds": seconds, "samples_per_sec": metric[2] / seconds}
        for key, name in (("loss", "train loss"), ("train_acc", "train acc"), ("test_acc", "test acc")):
            history[name].append(row[key])
        if args.json:
            print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}), file=out)
        else:
            print(f"{epoch:>5} {row['loss']:>8.4f} {row['train_acc']:>9.3f} {row['test_acc']:>8.3f} "
                  f"{seconds:>8.2f} {row['samples_per_sec']:>10.0f}", file=out)
        out.flush()

    # 4. Export for deployment without Python (examples/cpp/deploy_lenet.cc, tools/kiln-run).
    if args.export:
        if not args.hybridize:
            net.hybridize()
            net(next(iter(test_iter))[0].as_in_context(devices[0]))
        files = net.export(args.export)
        if not args.json:
            print("exported " + " and ".join(files), file=out)

    # 5. Curves.
    if args.plot:
        where = ", ".join(str(d) for d in devices)  # every device the batches were split over
        paths = plot_curves(history, args.plot, title=f"LeNet on Fashion-MNIST ({where})")
        if not args.json:
            print("saved " + " and ".join(paths), file=out)


if __name__ == "__main__":
    main()
