"""The float32 math GPU convolutions and matmuls use (kiln.set_math_mode, KILN_CONV_TF32,
KILN_MATMUL_TF32), as PyTorch's torch.backends.cudnn.allow_tf32 (on by default) and
torch.backends.cuda.matmul.allow_tf32 (off by default). On simulated GPUs TF32 rounds the inputs'
mantissas to 10 bits as tensor cores read them, so the mode shows in the numbers; a hybridized
net's CUDA graph keeps the math it was captured with, so a new mode is measured plainly once and
captured again, and going back to a mode already seen runs from a graph again at once. (conftest.py sets KILN_CONV_TF32=0 for the
other tests; these set what they test.)"""
import os
import subprocess
import sys

import pytest

import kiln
from conftest import REAL_GPU
from test_gpu import run_sim

NET = """
import numpy as np, kiln
from kiln import nd, nn, autograd
ctx = kiln.gpu(0)
np.random.seed(0)
x_np = np.random.randn(4, 3, 10, 10).astype(np.float32)
net = nn.HybridSequential()
net.add(nn.Conv2D(8, kernel_size=3, padding=1, in_channels=3, activation="relu"), nn.Dense(5, in_units=800))
net.initialize(init=kiln.init.Xavier(), ctx=ctx)
cpu = nn.HybridSequential()
cpu.add(nn.Conv2D(8, kernel_size=3, padding=1, in_channels=3, activation="relu"), nn.Dense(5, in_units=800))
cpu.initialize(init=kiln.init.Xavier())
for a, b in zip(cpu.collect_params().values(), net.collect_params().values()):
    a.set_data(b.data().as_in_context(kiln.cpu()))
want = cpu(nd.array(x_np)).asnumpy()
x = nd.array(x_np, ctx=ctx)
def grads(model, data):
    with autograd.record():
        l = model(data).sum()
    l.backward()
    return np.concatenate([p.grad().asnumpy().ravel() for p in model.collect_params().values()])
want_grads = grads(cpu, nd.array(x_np))
def err(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())
"""


def test_defaults_follow_pytorch_and_the_switches():
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_CONV_TF32", "KILN_MATMUL_TF32")}
    code = "import kiln; print(kiln.math_mode())"
    out = lambda e: subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                                   timeout=120, check=True).stdout.strip()
    assert out(env) == "{'conv': 'tf32', 'matmul': 'float32'}"
    assert out(dict(env, KILN_CONV_TF32="0", KILN_MATMUL_TF32="1")) == "{'conv': 'float32', 'matmul': 'tf32'}"


def test_set_math_mode_overrides_and_gives_back():
    before = kiln.math_mode()
    try:
        kiln.set_math_mode(conv="tf32", matmul="tf32")
        assert kiln.math_mode() == {"conv": "tf32", "matmul": "tf32"}
        kiln.set_math_mode(matmul="float32")  # conv left as it is
        assert kiln.math_mode() == {"conv": "tf32", "matmul": "float32"}
        with pytest.raises(kiln.ArgumentError, match=r"conv='fp16'.*expected 'tf32'"):
            kiln.set_math_mode(conv="fp16", matmul="tf32")
        assert kiln.math_mode() == {"conv": "tf32", "matmul": "float32"}  # nothing changed
    finally:
        kiln.set_math_mode(conv="default", matmul="default")
    assert kiln.math_mode() == before


def test_a_hybridized_net_captures_again_under_a_new_mode_and_its_numbers_follow_the_mode():
    out = run_sim(NET + """
net.hybridize()
def call():
    y = net(x).asnumpy()
    return y
kiln.set_math_mode(conv="float32")
strict = [call() for _ in range(3)]           # plain, capture, replay
s0 = kiln.cuda_graph_stats()
kiln.set_math_mode(conv="tf32")
tf32 = [call() for _ in range(3)]             # plain (measured), capture, replay
s1 = kiln.cuda_graph_stats()
kiln.set_math_mode(conv="float32")
back = call()                                  # the first graph again
s2 = kiln.cuda_graph_stats()
assert err(strict[-1], want) < 1e-5, err(strict[-1], want)
assert all((s == strict[0]).all() for s in strict)
assert (back == strict[0]).all()
e = err(tf32[-1], want)
assert e < 5e-3, e
print("TF32", e, s0, s1, s2)
graphs = lambda s: s["captures"] + s["replays"]  # calls run from a graph (captured, or replayed)
print(repr((s1["plain_runs"] - s0["plain_runs"], graphs(s1) - graphs(s0),
            s2["plain_runs"] - s1["plain_runs"], graphs(s2) - graphs(s1))))
""")
    counts = eval(out.strip().splitlines()[-1])
    # tf32: one plain run (its algorithms measured), then graphs; back to float32, a mode already
    # measured: a graph at once, never a plain run. (Whether a call captures or replays depends on
    # the allocator: an output whose address moves drops the plan's graphs, runtime/executor.cc.)
    assert counts == (1, 2, 0, 1), out
    if not REAL_GPU:  # a real GPU's cuDNN may still pick an algorithm without tensor cores
        e = float(out.split("TF32 ")[1].split()[0])
        assert e > 1e-5, out  # the simulator rounds as tensor cores read


def test_gradients_follow_the_mode():
    out = run_sim(NET + """
kiln.set_math_mode(conv="float32")
strict = grads(net, x)
kiln.set_math_mode(conv="tf32")
tf32 = grads(net, x)
assert err(strict, want_grads) < 1e-5, err(strict, want_grads)
assert err(tf32, want_grads) < 5e-3, err(tf32, want_grads)
print(err(tf32, want_grads))
""")
    if not REAL_GPU:
        assert float(out.strip().splitlines()[-1]) > 1e-5, out
