"""PyTorch's side of the gpu_lenet benchmark (bench/gpu_models.cc), run by scripts/gpu-check on
the GPU machine after bench_gpu: one epoch of the project's d2l LeNet (conv 3x3 20 relu, avg-pool
2, conv 5x5 50 relu, avg-pool 2, dense 800->128 relu, dense 10; weights N(0, 0.01), biases 0;
lr 0.2) and of d2l's classic LeNet-5 ("sigmoid" in the case names: conv 5x5 6 padded, sigmoid,
avg-pool 2, conv 5x5 16, sigmoid, avg-pool 2, dense 120 and 84 sigmoid, dense 10; Xavier-normal
weights; lr 0.9), plain SGD on the mean cross-entropy at batch 256, over 60000 synthetic 28x28 images
of Fashion-MNIST's shape (its files are not on the GPU machine; bench_gpu's are generated the same
way: noise plus a bright 7x7 block placed by the class), the batches in host memory and copied to
the GPU each step, as kiln's. PyTorch eager and torch.compile (default mode, dynamic=False: the
last batch of 96 images compiles its own graph during the warm-up, as kiln traces its own).
Seconds per epoch, timed from the first step to the synchronization after the last. Given
bench_gpu's JSON lines, it also prints the ratios PyTorch time / kiln time (above 1: kiln ahead)
for each variant.

    python3 gpu_lenet_torch.py [BENCH_GPU.jsonl] [--quick]     (--quick: 12800 images, scaled)
"""
import sys
import time

from gpu_torch_common import emitter, kiln_figures, torch_with_gpu

BENCH = "gpu_lenet"


emit = emitter(BENCH, 4)


def synthetic(torch, count, batch):
    """Host batches (images, int64 labels): noise in [0, 0.2) plus 0.8 on a 7x7 block per class."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (count,), generator=g)
    images = torch.rand(count, 1, 28, 28, generator=g) * 0.2
    blocks = torch.zeros(10, 28, 28)
    for c in range(10):
        r0, c0 = 3 + (c // 4) * 7, 3 + (c % 4) * 5
        blocks[c, r0:r0 + 7, c0:c0 + 7] = 0.8
    images[:, 0] += blocks[labels]
    return [(images[i:i + batch].contiguous(), labels[i:i + batch].contiguous()) for i in range(0, count, batch)]


def lenet(nn, sigmoid):
    if sigmoid:
        net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Conv2d(6, 16, 5),
                            nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.Sigmoid(),
                            nn.Linear(120, 84), nn.Sigmoid(), nn.Linear(84, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                            nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            if sigmoid:
                nn.init.xavier_normal_(m.weight)
            else:
                nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)
    return net


def main():
    quick = "--quick" in sys.argv
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    torch = torch_with_gpu(emit)
    if torch is None:
        return
    images = 12800 if quick else 60000
    batches = synthetic(torch, images, 256)
    loss_fn = torch.nn.CrossEntropyLoss()

    def seconds_per_epoch(model, params, lr):
        opt = torch.optim.SGD(params, lr=lr)

        def step(x, y):
            x, y = x.cuda(), y.cuda()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss

        for x, y in (batches[0], batches[-1], batches[0]):  # both batch sizes: cuDNN, compiling
            step(x, y)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, y in batches:
            loss = step(x, y)
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        if not torch.isfinite(loss).item():
            raise RuntimeError(f"the loss is {loss.item()} after the epoch")
        return s * 60000 / images

    kiln = kiln_figures(files, BENCH, "seconds_per_epoch")
    for sigmoid in (False, True):
        torch.manual_seed(0)
        lr, variant = (0.9, "sigmoid_") if sigmoid else (0.2, "")
        suffix = f"_{variant}synthetic_{images}_b256"
        figures = {}

        def measure(case, model, params):
            figures[case] = seconds_per_epoch(model, params, lr)
            emit(case, "seconds_per_epoch", figures[case], "s (60000 images)")

        eager = lenet(torch.nn, sigmoid).cuda()
        measure("torch_eager" + suffix, eager, eager.parameters())
        try:
            net = lenet(torch.nn, sigmoid).cuda()
            measure("torch_compile" + suffix, torch.compile(net, dynamic=False), net.parameters())
        except Exception as e:  # no Triton or no C compiler on this machine
            emit("skipped", "none", 0, "torch.compile failed: " + str(e).splitlines()[0][:120])
        for k_case, k_s in kiln.items():
            if ("_sigmoid_" in k_case) != sigmoid:
                continue  # ratios within one variant
            for t_case, t_s in figures.items():
                emit(t_case + "/" + k_case, "speedup", t_s / k_s, "x")

if __name__ == "__main__":
    main()
