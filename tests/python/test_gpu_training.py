"""Training on simulated GPUs (KILN_GPU_SIM=2): eager and hybridized models train on a GPU to the
parameters the CPU reaches, with the Trainer's update on the device; each test runs its snippet
in a fresh interpreter with the simulator switched on (see test_gpu.py)."""
import numpy as np

from test_gpu import run_sim

# A small MLP trained a few steps on `ctx`, eager or hybridized; returns its first weight and the
# last loss. The same seed draws the same initial weights on every device.
TRAIN = """
import numpy as np, kiln
from kiln import nd, nn, autograd

def train(ctx, hybridize, opt="sgd", params=None, steps=4):
    nd.random.seed(11)
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="tanh"), nn.Dense(16, activation="sigmoid"), nn.Dense(4))
    net.initialize(kiln.init.Xavier(), ctx=ctx)
    if hybridize:
        net.hybridize()
    x = nd.array(np.linspace(-1, 1, 8 * 20, dtype=np.float32).reshape(8, 20), ctx=ctx)
    y = nd.array(np.sin(np.arange(32, dtype=np.float32)).reshape(8, 4), ctx=ctx)
    loss = kiln.loss.L2Loss()
    trainer = kiln.Trainer(net.collect_params(), opt, params or {"learning_rate": 0.1, "momentum": 0.9})
    for _ in range(steps):
        with autograd.record():
            l = loss(net(x), y)
        l.backward()
        trainer.step(x.shape[0])
    assert net[0].weight.data().device == ctx, net[0].weight.data().device
    return net[0].weight.data().asnumpy(), l.asnumpy()
"""


def test_hybridized_training_on_a_gpu_matches_the_cpu():
    out = run_sim(TRAIN + """
ref_w, ref_l = train(kiln.cpu(), hybridize=False)
for ctx in (kiln.gpu(0), kiln.gpu(1)):
    for hybridize in (False, True):
        w, l = train(ctx, hybridize)
        np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(l, ref_l, rtol=1e-5, atol=1e-6)
w, l = train(kiln.gpu(0), True, "adam", {"learning_rate": 0.01})
ref_w, ref_l = train(kiln.cpu(), True, "adam", {"learning_rate": 0.01})
np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
print("ok")
""")
    assert "ok" in out


def test_hybridized_forward_on_a_gpu_runs_its_compiled_plan():
    out = run_sim("""
import numpy as np, kiln
from kiln import nd, nn
net = nn.HybridSequential()
net.add(nn.Dense(8, activation="tanh"), nn.Dense(3))
net.initialize(ctx=kiln.gpu(1))
x = nd.array(np.random.rand(5, 6).astype(np.float32), ctx=kiln.gpu(1))
eager = net(x).asnumpy()
net.hybridize()
for _ in range(3):  # the plan is built once, then reused
    y = net(x)
assert y.device == kiln.gpu(1)
np.testing.assert_allclose(y.asnumpy(), eager, rtol=1e-6, atol=1e-6)
print("ok")
""")
    assert "ok" in out


def test_compiled_graphs_on_a_gpu_replay_cuda_graphs_with_fresh_inputs():
    out = run_sim("""
import numpy as np, kiln
from kiln import nd, nn
net = nn.HybridSequential()
net.add(nn.Dense(16, activation="tanh"), nn.Dense(3))
net.initialize(ctx=kiln.gpu(0))
xs = [np.random.rand(2, 6).astype(np.float32) for _ in range(8)]
eager = [net(nd.array(x, ctx=kiln.gpu(0))).asnumpy() for x in xs]
net.hybridize()
s0 = kiln.cuda_graph_stats()
for x, ref in zip(xs, eager):   # a new input array (a new address) every call
    y = net(nd.array(x, ctx=kiln.gpu(0)))
    np.testing.assert_allclose(y.asnumpy(), ref, rtol=1e-6, atol=1e-6)
kiln.waitall()
s = kiln.cuda_graph_stats()
captures, replays = s["captures"] - s0["captures"], s["replays"] - s0["replays"]
assert captures == 1 and replays == 6, s      # call 1 plain, call 2 captured, then replays
assert s["refused"] == s0["refused"], s
print("ok")
""")
    assert "ok" in out


def test_cuda_graphs_switch_off_and_replay_plans_that_draw_random_numbers_with_new_draws():
    # Dropout's plan is captured too: its kernels read the seed and the call's offset from device
    # memory, so each replay draws the mask an uncaptured call would (KILN_CUDA_GRAPHS=0 below
    # gives the very same numbers), also after nd.random.seed() and after other draws in between.
    code = """
import numpy as np, kiln
from kiln import nd, nn, autograd
nd.random.seed(5)
net = nn.HybridSequential()  # shapes given: the first call draws no initial weights
net.add(nn.Dense(16, activation="tanh", in_units=6), nn.Dropout(0.5), nn.Dense(3, in_units=16))
net.initialize(ctx=kiln.gpu(0))
net.hybridize()
x = nd.array(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6), ctx=kiln.gpu(0))
outs, grads = [], []
for i in range(8):
    if i in (0, 5):
        nd.random.seed(5)                                     # call 5 draws the mask of call 0
    if i == 6:
        nd.random.uniform(shape=(3,), ctx=kiln.gpu(0))        # something else draws in between
    with autograd.record():   # training: dropout draws a new mask on every call
        y = net(x)
    y.backward()
    outs.append(y.asnumpy())
    grads.append(net[0].weight.grad().asnumpy().copy())
for a, b in zip(outs, outs[1:]):
    assert not np.array_equal(a, b)  # a graph replaying its captured draws would repeat the mask
np.testing.assert_array_equal(outs[5], outs[0])
for _ in range(4):
    y = net(x)             # inference: no dropout, no random numbers
kiln.waitall()             # the counters move when the calls run, not when they are queued
np.save("OUT", np.concatenate([o.ravel() for o in outs + grads]))
print(kiln.cuda_graph_stats())
"""
    import os, subprocess, sys, tempfile
    from conftest import gpu_env, skip_if_short_of_gpus
    results = []
    with tempfile.TemporaryDirectory() as d:
        for graphs in ("1", "0"):
            path = os.path.join(d, f"out{graphs}.npy")
            env = gpu_env(code, KILN_CUDA_GRAPHS=graphs)
            r = subprocess.run([sys.executable, "-c", code.replace("OUT", path)], env=env, capture_output=True,
                               text=True, timeout=300)
            skip_if_short_of_gpus(r)
            assert r.returncode == 0, r.stdout + r.stderr
            results.append((eval(r.stdout.strip().splitlines()[-1]), np.load(path)))
    (on, drawn), (off, drawn_plainly) = results
    # The training forward (with dropout) is held and joins its backward (which reads the saved
    # mask and draws nothing): one plan per step, drawing from the numbers reserved when the
    # forward was called. It and the inference plan are captured once each from their second call.
    assert on["refused"] == 0 and on["captures"] == 2, on
    assert on["replays"] == 6 + 2, on
    assert off["captures"] == 0 and off["replays"] == 0 and off["plain_runs"] == 8 + 4, off
    np.testing.assert_array_equal(drawn, drawn_plainly)


def test_export_from_a_gpu_imports_on_the_cpu_and_the_other_way_round(tmp_path):
    out = run_sim(TRAIN + """
import os
os.chdir(%r)
nd.random.seed(2)
x = nd.array(np.linspace(-1, 1, 8 * 20, dtype=np.float32).reshape(8, 20))
for train_on, load_on in [(kiln.gpu(0), kiln.cpu()), (kiln.cpu(), kiln.gpu(1)), (kiln.gpu(1), kiln.gpu(0))]:
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="tanh"), nn.Dense(4))
    net.initialize(ctx=train_on)
    net.hybridize()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        l = (net(x.as_in_context(train_on)) ** 2).sum()
    l.backward()
    trainer.step(8)
    want = net(x.as_in_context(train_on)).asnumpy()
    net.export("m")
    sb = nn.SymbolBlock.imports("m-symbol.json", ["data"], "m-0000.params", ctx=load_on)
    got = sb(x.as_in_context(load_on))
    assert got.device == load_on
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
print("ok")
""" % str(tmp_path))
    assert "ok" in out


def test_elementwise_chains_fuse_into_one_generated_kernel_on_a_gpu():
    out = run_sim("""
import numpy as np, kiln
from kiln import nd, nn

class Chain(nn.HybridBlock):
    def forward(self, a, b, c):
        return nd.relu(a * b + c) * 0.5 + a

net = Chain()
net.hybridize()
vals = [np.random.rand(3000).astype(np.float32) - 0.5 for _ in range(3)]
a, b, c = [nd.array(v, ctx=kiln.gpu(1)) for v in vals]
for _ in range(3):
    y = net(a, b, c)
np.testing.assert_allclose(y.asnumpy(), np.maximum(vals[0] * vals[1] + vals[2], 0) * 0.5 + vals[0], rtol=1e-6, atol=1e-6)
print(net.compile_report())
""")
    assert "1 group of 5 ops (GPU: elementwise groups only)" in out, out
    assert "kernels: 6 before fusion, 1 after" in out, out
