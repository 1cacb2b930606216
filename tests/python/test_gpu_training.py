"""Training on simulated GPUs (KILN_GPU_SIM=2): eager and hybridized models train on a GPU to the
parameters the CPU reaches, with the Trainer's update on the device; each test runs its snippet
in a fresh interpreter with the simulator switched on (see test_gpu.py)."""
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
