"""PyTorch's side of the gpu_resnet18 benchmark (bench/gpu_models.cc), run by scripts/gpu-check on
the GPU machine after bench_gpu: d2l's ResNet-18 for 28x28 images (3x3 stem with BatchNorm and
relu, four stages of two residual blocks, 64-128-256-512 channels, global average pool, Dense(10))
training at batch 256 on one batch of random images on the GPU, float32, plain SGD (lr 0.1) on the
mean cross-entropy, in PyTorch eager and torch.compile (default mode; the optimizer step eager),
images per second timed as kiln's (steps back to back, one synchronization at the end, the
median of 3 repeats after 3 warm-up steps). PyTorch's defaults are kept (cuDNN with TF32 for
convolutions, cudnn.benchmark off). Given bench_gpu's JSON lines, it also prints the ratios
PyTorch time / kiln time (above 1: kiln is ahead).

    python3 gpu_resnet18_torch.py [BENCH_GPU.jsonl] [--quick]
"""
import statistics
import sys
import time

from gpu_torch_common import emitter, kiln_figures, torch_with_gpu

BENCH = "gpu_resnet18"


emit = emitter(BENCH)


def resnet18(nn, width=64):
    class Residual(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.conv3 = nn.Conv2d(cin, cout, 1, stride=stride) if stride != 1 else None
            self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(y + (self.conv3(x) if self.conv3 is not None else x))

    layers = [nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage in range(4):
        cout = width << stage
        layers += [Residual(cin, cout, 2 if stage else 1), Residual(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


def main():
    quick = "--quick" in sys.argv
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    torch = torch_with_gpu(emit)
    if torch is None:
        return
    batch, steps, repeats = 256, (5 if quick else 20), 3
    torch.manual_seed(0)
    x = torch.rand(batch, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def images_per_s(model, params):
        opt = torch.optim.SGD(params, lr=0.1)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss

        for _ in range(3):  # cuDNN's algorithms; torch.compile compiles here
            step()
        out = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = step()
            torch.cuda.synchronize()
            out.append(batch * steps / (time.perf_counter() - t0))
        if not torch.isfinite(loss).item():
            raise RuntimeError(f"the loss is {loss.item()} after training")
        return statistics.median(out)

    figures = {}
    eager = resnet18(torch.nn).cuda().train()
    figures["torch_eager"] = images_per_s(eager, eager.parameters())
    emit("torch_eager_b256", "images_per_s", figures["torch_eager"], "images/s")
    try:
        net = resnet18(torch.nn).cuda().train()
        figures["torch_compile"] = images_per_s(torch.compile(net), net.parameters())
        emit("torch_compile_b256", "images_per_s", figures["torch_compile"], "images/s")
    except Exception as e:  # no Triton or no C compiler on this machine
        emit("skipped", "none", 0, "torch.compile failed: " + str(e).splitlines()[0][:120])
    for k_case, k_ips in kiln_figures(files, BENCH, "images_per_s").items():
        for t_case, t_ips in figures.items():
            emit(t_case + "/" + k_case, "speedup", k_ips / t_ips, "x")  # = torch time / kiln time


if __name__ == "__main__":
    main()
