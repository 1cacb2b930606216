"""The structure of a hybridized training step on a GPU, counted without one (KILN_GPU_SIM=2):
kiln.gpu_step_stats() reports the launches, library calls, syncs, allocations, copies, graph
replays and tasks of a step, the same on simulated GPUs as on real ones. A step of d2l's LeNet and
of a small ResNet-18 (the d2l loop, Trainer.step, the loss not hybridized by the user) runs one
plan, replayed as one CUDA graph: the network's forward and the loss (it compiles itself over a
hybridized block's output) are held back under record() and join the backward of both, which
is held in turn until Trainer.step's SGD update joins it (see frontend/deferred.h): nothing runs
around the plan. cuDNN's workspaces come from the plan's arena (capture never allocates),
nothing synchronizes with the host (the loss's label check included), the gradients are written
straight into param.grad (no copy), and the parameters are those of the eager loop. Each test runs in a fresh interpreter (see test_gpu.py)."""
import os

from test_gpu import run_sim

STEP = """
import os, sys
import numpy as np, kiln
from kiln import nd, nn, autograd
sys.path.insert(0, %r)
from multi_device_concise import resnet18

def lenet():  # d2l.ai 7.6
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"), nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(16, kernel_size=5, activation="sigmoid"), nn.AvgPool2D(pool_size=2, strides=2),
            nn.Dense(120, activation="sigmoid"), nn.Dense(84, activation="sigmoid"), nn.Dense(10))
    return net

def dropout_mlp():  # d2l.ai 5.6
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dropout(0.2), nn.Dense(256, activation="relu"), nn.Dropout(0.5),
            nn.Dense(10))
    return net

def train(make, hybridize, image, steps=6, batch=8, ctx=None, eager_loss=False, opt=("sgd", {"learning_rate": 0.05})):
    ctx = ctx or kiln.gpu(0)
    rng = np.random.default_rng(0)
    X = nd.array(rng.standard_normal((batch, 1, image, image)).astype(np.float32), ctx=ctx)
    y = nd.array(rng.integers(0, 10, batch).astype(np.float32), ctx=ctx)
    nd.random.seed(1)
    net = make()
    net.initialize(init=kiln.init.Xavier(), ctx=ctx)
    if hybridize:
        net.hybridize()
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    if eager_loss:
        loss.hybridize(False)  # the loss's ops one by one, as before it compiled itself
    trainer = kiln.Trainer(net.collect_params(), *opt)
    stats = []
    for _ in range(steps):
        kiln.gpu_step_stats()
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        trainer.step(batch)
        stats.append(kiln.gpu_step_stats())
    params = [p.data().asnumpy() for p in net.collect_params().values()]
    return params, stats, None

def check(make, image, **kw):
    eager, _, _ = train(make, False, image, **kw)
    hybrid, stats, _ = train(make, True, image, **kw)
    for a, b in zip(eager, hybrid):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    for s in stats[3:]:  # steady state: the first step compiles, the next ones capture
        print(s)
        # The network's training forward, the loss (compiled over the network's output) and the
        # backward (the loss's gradients, the network's backward, the gradients written into
        # param.grad) and Trainer.step's SGD update (it joins the held step: frontend/optim.cc)
        # are one plan, one graph replay: no capture refused (cuDNN's workspaces come from the
        # plan's arena), nothing launched one by one, no cudaMalloc.
        assert s["plan_calls"] == 1 and s["graph_replays"] == 1, s
        # The saved values the backward reads stay in the plan's arena: never allocated, never
        # freed; the network's output and the loss reuse the storages of two steps ago, which the
        # loop dropped. So nothing allocates, and no task runs around the plan.
        assert s["tasks_outside_plans"] == 0 and s["allocations"] == 0, s
        assert s["graph_captures"] == 0 and s["plain_plan_runs"] == 0, s
        assert s["device_mallocs"] == 0, s
        # No wait for the GPU inside the step: the loss's check of its labels (one_hot) records a
        # bad label on the device, raised at the next sync point (cuda.h DeferredCheck).
        assert s["host_syncs"] == 0, s
    assert kiln.cuda_graph_stats()["refused"] == 0, kiln.cuda_graph_stats()
    return stats[-1]
"""

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")


def test_lenet_training_step_replays_its_plans_and_runs_the_loss_gradient_in_the_backward_plan():
    code = STEP % EXAMPLES + """
s = check(lenet, 28)
print("tasks", s["tasks_outside_plans"], "launches", s["kernel_launches"])
# The loss hybridize(False): its dozen ops (max, sub, exp, sum, log, one_hot...) run one by one,
# each a task, a launch and an allocation, between the two plans.
_, eager_loss, _ = train(lenet, True, 28, eager_loss=True)
e = eager_loss[-1]
assert e["plan_calls"] == 2 and e["graph_replays"] == 2, e
assert e["tasks_outside_plans"] >= s["tasks_outside_plans"] + 10, (e, s)
assert e["allocations"] >= s["allocations"] + 8 and e["kernel_launches"] >= s["kernel_launches"] + 8, (e, s)
print("ok")
"""
    assert "ok" in run_sim(code)
    # KILN_JOIN_CALLS=0: the forward, the loss and the backward are three plans, three replays.
    three = run_sim("import os; os.environ['KILN_JOIN_CALLS'] = '0'\n" + STEP % EXAMPLES + """
s = train(lenet, True, 28)[1][-1]
assert s["plan_calls"] == 3 and s["graph_replays"] == 3 and s["host_syncs"] == 0, s
assert s["tasks_outside_plans"] >= 1, s  # the update, at least
print("ok")
""")
    assert "ok" in three
    # An eager loss with KILN_COMPILED_BACKWARD=0: its gradient ops run one by one around the
    # backward plan too; compiled, they are part of it.
    code = STEP % EXAMPLES + """
s = train(lenet, True, 28, eager_loss=True)[1][-1]
print("tasks", s["tasks_outside_plans"], "launches", s["kernel_launches"])
"""
    compiled = run_sim(code)
    one_by_one = run_sim("import os; os.environ['KILN_COMPILED_BACKWARD'] = '0'\n" + code)
    count = lambda out: [int(w) for w in out.split("tasks ")[1].split()[::2][:2]]
    (tasks, launches), (tasks0, launches0) = count(compiled), count(one_by_one)
    assert tasks + 8 <= tasks0 and launches + 8 <= launches0, (compiled, one_by_one)


def test_small_resnet18_training_step_captures_with_cudnn_workspaces_in_the_arena():
    out = run_sim(STEP % EXAMPLES + """
s = check(lambda: resnet18(10, width=4), 16)
_, lenet_stats, _ = train(lenet, True, 28)
small = lenet_stats[-1]
# Around the plan, nothing per layer: it writes batch norm's running statistics
# (17 layers here) in place, with no copy task per statistic after the call, and the small values
# the backward reads (the batch statistics) share one block, not an allocation and a free task
# each. So the 7-layer LeNet without batch norm and this 21-layer network have as many tasks
# around their plans (the loss's ops, frees, the optimizer's update) and as many allocations.
assert s["tasks_outside_plans"] <= small["tasks_outside_plans"] + 2, (s, small)
assert s["allocations"] <= small["allocations"] + 2, (s, small)
print("ok")
""")
    assert "ok" in out


def test_a_dropout_mlp_training_step_is_one_replay_with_the_masks_of_the_calls_one_by_one():
    # Dropout's numbers come from the generator's seed and offset in device memory (captured), and
    # the held forward's are reserved where it was called: the step is one replay as LeNet's is,
    # and its masks are those of the forward, the loss and the backward run one by one
    # (KILN_JOIN_CALLS=0). (A hybridized block draws its masks in another order than the same
    # block run eagerly, as torch.compile does: the eager loop is no reference here.)
    code = STEP % EXAMPLES + """
params, stats, _ = train(dropout_mlp, True, 28)
np.save(%r, np.concatenate([p.ravel() for p in params]))
print(stats[-1])
"""
    import tempfile
    import numpy as np
    with tempfile.TemporaryDirectory() as d:
        joined, alone = os.path.join(d, "joined.npy"), os.path.join(d, "alone.npy")
        out = run_sim(code % joined)
        run_sim("import os; os.environ['KILN_JOIN_CALLS'] = '0'\n" + code % alone)
        # the same masks: only rounding differs (fusion spans more ops joined); a mask apart
        # moves a weight by about 1e-2
        np.testing.assert_allclose(np.load(joined), np.load(alone), rtol=1e-5, atol=1e-7)
    s = eval(out.strip().splitlines()[-1])
    assert s["plan_calls"] == 1 and s["graph_replays"] == 1 and s["tasks_outside_plans"] == 0, s
    assert s["allocations"] == 0 and s["host_syncs"] == 0 and s["graph_captures"] == 0, s


def test_lenet_with_adam_is_one_replay_too():
    # Adam's update joins the step as SGD's does: its bias corrections come from a step count the
    # plan keeps on the device, so nothing runs around the replay.
    out = run_sim(STEP % EXAMPLES + """
check(lenet, 28, opt=("adam", {"learning_rate": 0.01}))
print("ok")
""")
    assert "ok" in out


def test_gpu_step_stats_counts_a_step_of_eager_ops():
    out = run_sim("""
import numpy as np, kiln
from kiln import nd
x = nd.array(np.ones((4, 4), np.float32))
kiln.gpu_step_stats()
g = x.as_in_context(kiln.gpu(0))        # 64 bytes to the device
h = (g * 2 + 1).asnumpy()                # kernels, 64 bytes back: the copy waits for the GPU
s = kiln.gpu_step_stats()
print(s)
assert s["h2d_bytes"] >= 64 and s["d2h_bytes"] == 64, s
assert s["kernel_launches"] >= 1 and s["host_syncs"] >= 1 and s["tasks"] >= 3, s
assert s["plan_calls"] == 0 and s["tasks_outside_plans"] == s["tasks"], s
again = kiln.gpu_step_stats()            # nothing ran since
assert all(v == 0 for v in again.values()), again
print("ok")
""")
    assert "ok" in out


def _run_cpu(code, **env):
    import subprocess
    import sys
    import textwrap
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=dict({k: v for k, v in os.environ.items() if not k.startswith("KILN_GPU_SIM")}, **env))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_on_the_cpu_a_hybridized_step_runs_the_backward_as_one_plan_with_no_task_per_parameter():
    # The CPU has no graphs, but the same counters: 1 plan per step (the network's forward, the
    # loss, the loss's gradients and the network's backward, writing param.grad in place, and the
    # optimizer's update), nothing around it: no task per parameter, no loss op. With
    # an eager loss and KILN_COMPILED_BACKWARD=0 the loss's gradient ops run one by one.
    code = STEP % EXAMPLES + """
def counts(eager_loss):
    _, stats, _ = train(lenet, True, 28, ctx=kiln.cpu(), eager_loss=eager_loss)
    for s in stats[3:]:
        assert s["kernel_launches"] == 0 and s["graph_replays"] == 0, s   # no GPU at all
    return stats
if os.environ.get("KILN_COMPILED_BACKWARD") != "0":
    for s in counts(False)[3:]:
        assert s["plan_calls"] == 1 and s["tasks_outside_plans"] == 0, s
print("tasks", counts(True)[-1]["tasks_outside_plans"])
"""
    compiled = int(_run_cpu(code).split("tasks ")[1])
    one_by_one = int(_run_cpu(code, KILN_COMPILED_BACKWARD="0").split("tasks ")[1])
    assert compiled + 8 <= one_by_one, (compiled, one_by_one)
