"""Joined calls (frontend/deferred.h): under autograd.record() a hybridized block's call is held
back, the loss joins it, and the backward runs them all as one plan. Held calls must behave as
if they had run when made: whatever touches their tensors first (a read of an output, a write
into an input or a parameter, a wait, a second backward) sees the values of the calls in the
order the user made them. Each scenario runs in two fresh interpreters, KILN_JOIN_CALLS=1 (the
default) and =0 (every call pushed at once), and must give the same numbers."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

PRELUDE = """
import numpy as np, kiln
from kiln import nd, nn, autograd
out = {}
def net_of(bn=False):
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"))
    if bn:
        net.add(nn.BatchNorm())
    net.add(nn.Dense(5))
    net.initialize(init=kiln.init.Xavier())
    net.hybridize()
    return net
rng = np.random.default_rng(0)
X = nd.array(rng.standard_normal((6, 8)).astype(np.float32))
y = nd.array(rng.integers(0, 5, 6).astype(np.float32))
nd.random.seed(3)
loss = kiln.loss.SoftmaxCrossEntropyLoss()
def grads(net):
    return [p.grad().asnumpy() for p in net.collect_params().values() if p.grad_req != "null"]
"""


def run(scenario, join):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kiln_joined_%d_%s.npz" % (os.getpid(), join))
    code = PRELUDE + textwrap.dedent(scenario) + "\nnp.savez(%r, **{k: np.asarray(v) for k, v in out.items()})\n" % path
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_GPU_SIM")}
    env["KILN_JOIN_CALLS"] = join
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with np.load(path) as f:
        result = {k: f[k] for k in f.files}
    os.remove(path)
    return result, r.stdout


def same(scenario):
    joined, out1 = run(scenario, "1")
    alone, _ = run(scenario, "0")
    assert sorted(joined) == sorted(alone)
    for k in joined:  # "_name": a count that differs by design
        if k.startswith("_"):
            continue
        np.testing.assert_allclose(joined[k], alone[k], rtol=1e-5, atol=1e-6, err_msg=k)
    return joined, out1


def test_the_d2l_step_is_one_plan_with_the_numbers_of_three():
    joined, _ = same("""
    net = net_of(bn=True)
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    plans = []
    for step in range(4):
        kiln.gpu_step_stats()
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        trainer.step(6)
        plans.append(kiln.gpu_step_stats()["plan_calls"])
        out["loss%d" % step] = l.asnumpy()
    out["_plans"] = plans
    for i, p in enumerate(net.collect_params().values()):
        out["param%d" % i] = p.data().asnumpy()   # batch norm's running statistics too
    """)
    assert list(joined["_plans"][1:]) == [1, 1, 1], joined["_plans"]


def test_reading_the_output_before_backward_runs_the_held_call_first():
    same("""
    net = net_of()
    with autograd.record():
        h = net(X)
        out["h"] = h.asnumpy()          # a read: the held forward runs now, alone
        l = loss(h, y)
    l.backward()
    out["grads"] = np.concatenate([g.ravel() for g in grads(net)])
    """)


def test_writing_an_input_or_a_parameter_while_a_call_is_held_keeps_the_old_values_for_it():
    same("""
    net = net_of()
    X2 = X.copy()
    with autograd.record():
        h = net(X2)
        X2[:] = 7.0                      # a write into the held call's input
        w = list(net.collect_params().values())[0]
        w.set_data(w.data() * 0.5)       # and into one of its parameters
        l = loss(h, y)
    l.backward()
    out["h"] = h.asnumpy()
    out["grads"] = np.concatenate([g.ravel() for g in grads(net)])
    out["h_after"] = net(X2).asnumpy()   # the new input and parameter
    """)


def test_two_forwards_and_losses_join_one_backward_that_keeps_the_graph():
    joined, _ = same("""
    net = net_of(bn=True)
    X2 = X * 2
    kiln.waitall()
    with autograd.record():
        l1 = loss(net(X), y)             # four held calls: two forwards, two losses
        l2 = loss(net(X2), y)
    kiln.gpu_step_stats()
    autograd.backward([l1, l2], retain_graph=True)
    out["_plans"] = kiln.gpu_step_stats()["plan_calls"]
    out["first"] = np.concatenate([g.ravel() for g in grads(net)])
    autograd.backward([l1, l2])          # reads the saved values again: they were written
    out["second"] = np.concatenate([g.ravel() for g in grads(net)])
    out["l"] = np.concatenate([l1.asnumpy(), l2.asnumpy()])
    out["stats"] = [p.data().asnumpy().sum() for p in net.collect_params().values()]
    """)
    assert joined["_plans"] == 1, joined["_plans"]


def test_two_losses_of_one_output_and_a_backward_each():
    joined, _ = same("""
    net = net_of()
    with autograd.record():
        h = net(X)
        l1 = loss(h, y)
        l2 = kiln.loss.L2Loss()(h, nd.zeros((6, 5)))
    kiln.gpu_step_stats()
    l1.backward()                        # joins all three; h's saved values stay for l2
    out["_plans"] = kiln.gpu_step_stats()["plan_calls"]
    out["g1"] = np.concatenate([g.ravel() for g in grads(net)])
    l2.backward()
    out["g2"] = np.concatenate([g.ravel() for g in grads(net)])
    out["l"] = np.concatenate([l1.asnumpy(), l2.asnumpy()])
    """)
    assert joined["_plans"] == 1, joined["_plans"]


def test_autograd_grad_joins_the_held_calls_and_spends_the_graph():
    joined, _ = same("""
    net = net_of(bn=True)
    net(X)                               # parameters take their shapes
    w = list(net.collect_params().values())[0].data()
    kiln.waitall()
    with autograd.record():
        l = loss(net(X), y)
    kiln.gpu_step_stats()
    out["g"] = autograd.grad(l, [w])[0].asnumpy()
    out["_plans"] = kiln.gpu_step_stats()["plan_calls"]
    out["stats"] = [p.data().asnumpy() for p in net.collect_params().values()][-2]
    try:
        l.backward()                     # spent: refused, as without joining
        out["second"] = 1
    except kiln.StateError:
        out["second"] = 0
    """)
    assert joined["_plans"] == 1 and joined["second"] == 0, joined


def test_a_held_call_nobody_reads_still_runs_by_the_next_wait():
    same("""
    net = net_of(bn=True)
    with autograd.record():
        h = net(X)                       # held; then dropped
    del h
    kiln.waitall()                       # pushes it: batch norm's statistics moved
    out["stats"] = [p.data().asnumpy() for p in net.collect_params().values()][-2]
    """)


def test_each_device_keeps_its_own_held_calls():
    joined, _ = same("""
    nets, Xs = [], []
    for i, c in enumerate([kiln.cpu(0), kiln.cpu(1)]):
        n = net_of()
        n.collect_params().reset_ctx(c)
        nets.append(n)
        Xs.append((X.as_in_context(c), y.as_in_context(c)))
    kiln.waitall()
    plans = []
    for step in range(3):
        kiln.gpu_step_stats()
        with autograd.record():
            ls = [loss(n(x), t) for n, (x, t) in zip(nets, Xs)]   # both devices held at once
        for l in ls:
            l.backward()
        plans.append(kiln.gpu_step_stats()["plan_calls"])
        out["l%d" % step] = np.concatenate([l.asnumpy() for l in ls])
    out["_plans"] = plans
    out["grads"] = np.concatenate([g.ravel() for n in nets for g in grads(n)])
    """)
    assert list(joined["_plans"][1:]) == [2, 2], joined["_plans"]


def test_a_join_that_runs_out_of_memory_leaves_the_calls_held_and_a_retry_gives_the_numbers():
    # On a simulated GPU of 512 MiB filled up: the joined step (held after backward until its
    # update) cannot get its memory when a wait runs it, and raises; it is not lost (held again):
    # once memory is freed, the next wait runs it, and a second backward gives the gradients.
    from test_gpu import run_sim
    out = run_sim("""
    import numpy as np, kiln
    from kiln import nd, nn, autograd
    ctx = kiln.gpu(0)
    rng = np.random.default_rng(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(2048, activation="relu"), nn.Dense(2048, activation="relu"), nn.Dense(5))
    net.initialize(init=kiln.init.Xavier(), ctx=ctx)
    net.hybridize()
    X = nd.array(rng.standard_normal((2048, 64)).astype(np.float32), ctx=ctx)
    y = nd.array(rng.integers(0, 5, 2048).astype(np.float32), ctx=ctx)
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    for _ in range(2):                   # compiles the joined step
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
    with autograd.record():              # the reference (the read runs the calls before backward)
        l = loss(net(X), y)
    ref = l.asnumpy().copy()
    l.backward()
    ref_grad = net[0].weight.grad().asnumpy().copy()
    kiln.waitall()
    fill = []
    try:
        while True:
            fill.append(nd.zeros((1 << 20,), ctx=ctx))
    except kiln.OutOfMemoryError:
        pass
    del fill[-2:]
    kiln.waitall()
    with autograd.record():
        l = loss(net(X), y)
    try:
        l.backward(retain_graph=True)    # held as the step, awaiting its update
        kiln.waitall()                   # which a wait runs instead: out of memory
        raise AssertionError("expected the joined step to run out of memory")
    except kiln.OutOfMemoryError:
        pass
    fill.clear()
    kiln.waitall()
    np.testing.assert_allclose(l.asnumpy(), ref, rtol=1e-5)
    l.backward()
    np.testing.assert_allclose(net[0].weight.grad().asnumpy(), ref_grad, rtol=1e-4, atol=1e-6)
    print("ok")
    """, mem="512M")
    assert "ok" in out


@pytest.mark.parametrize("what", ["eager op", "second device"])
def test_calls_on_other_devices_and_eager_ops_between(what):
    same("""
    net = net_of()
    with autograd.record():
        h = net(X)
        %s
        l = loss(h, y)
    l.backward()
    out["l"] = l.asnumpy()
    out["grads"] = np.concatenate([g.ravel() for g in grads(net)])
    """ % ("h = h * 1.5" if what == "eager op" else "_ = nd.array(np.ones(3, np.float32), ctx=kiln.cpu(1)) * 2"))


def test_outputs_the_user_keeps_keep_their_values_while_later_calls_recycle_dropped_ones():
    # A small output of a compiled call reuses the storage of an earlier call's output that
    # nobody holds any more (cached_graph.cc OutputTensor); one the user kept is never reused.
    out, _ = run("""
    net = net_of()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    kept, now = [], []
    for step in range(6):
        with autograd.record():
            h = net(X)
            l = loss(h, y)
        l.backward()
        trainer.step(6)
        if step % 2 == 0:           # every other step's outputs are kept, the others dropped
            kept.append((h, l[1:3]))  # a view keeps the storage too
            now.append((h.asnumpy().copy(), l.asnumpy()[1:3].copy()))
    for (h, l), (h0, l0) in zip(kept, now):
        assert np.array_equal(h.asnumpy(), h0) and np.array_equal(l.asnumpy(), l0)
    out["losses"] = np.stack([l0 for _, l0 in now])
    """, "1")
    assert len(set(map(tuple, out["losses"].tolist()))) == 3  # training moved: three different losses


def test_an_output_written_in_place_while_recording_is_never_reused_for_a_later_output():
    # Autograd knows a storage written in place by its address: were it handed to a later call's
    # output, that output's gradient would flow into the earlier call. Three calls in one record
    # scope, each output written in place; the gradients must be the eager block's.
    out, _ = run("""
    def grads_of(hybrid):
        net = net_of()
        if not hybrid:
            net.hybridize(False)
        net(X)                               # parameters take their shapes
        for i, p in enumerate(net.collect_params().values()):
            p.set_data(nd.array(np.linspace(-0.3, 0.3, int(np.prod(p.shape))).reshape(p.shape).astype(np.float32)))
        tot = None
        with autograd.record():
            for t in range(3):
                o = net(X * (t + 1))
                o[:, 1] = -5.0
                s = o.sum()              # saves nothing: only the tape knows o by address
                tot = s if tot is None else tot + s
        tot.backward()
        return np.concatenate([g.ravel() for g in grads(net)])
    out["hybrid"] = grads_of(True)
    out["eager"] = grads_of(False)
    """, "1")
    np.testing.assert_allclose(out["hybrid"], out["eager"], rtol=1e-5, atol=1e-6)


# ---- the optimizer's update joins the step --------------------------------------------------------
# The joined step (forward, loss, backward) is held in turn until Trainer.step: an SGD update that
# reads its gradients joins it as graph ops (frontend/optim.cc), so the whole step, update
# included, is one plan with nothing around it. Its numbers are those of the fused update task.

UPDATE = """
net = net_of(bn=%s)
params = list(net.collect_params().values())
params[0].lr_mult = 0.3
params[1].wd_mult = 0.0
trainer = kiln.Trainer(net.collect_params(), %s)
schedule = %r
plans, tasks, allocs, lookups = [], [], [], []
for step in range(5):
    if schedule:
        trainer.set_learning_rate(0.1 / (1 + step))    # a schedule: the same plan, a new rate
    kiln.gpu_step_stats()
    c = kiln.codegen_stats()
    with autograd.record():
        l = loss(net(X), y)
    l.backward()
    trainer.step(6 + step if schedule else 6)           # and a new rescale_grad
    s = kiln.gpu_step_stats()
    plans.append(s["plan_calls"])
    tasks.append(s["tasks_outside_plans"])
    allocs.append(s["allocations"])
    c2 = kiln.codegen_stats()
    n = lambda d: d.get("compiles", 0) + d.get("cache_hits", 0) + d.get("disk_hits", 0)
    lookups.append(n(c2) - n(c))  # kernels looked up: a plan built (0 without codegen)
    out["loss%%d" %% step] = l.asnumpy()
out["_plans"], out["_tasks"], out["_allocs"], out["_lookups"] = plans, tasks, allocs, lookups
for i, p in enumerate(params):
    out["param%%d" %% i] = p.data().asnumpy()   # batch norm's running statistics too
for k, st in enumerate(trainer._states.values()):
    for j, a in enumerate(st):
        out["state%%d_%%d" %% (k, j)] = a.asnumpy()
"""


@pytest.mark.parametrize("opt,schedule", [
    ('"sgd", {"learning_rate": 0.1}', False),
    ('"sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3, "clip_gradient": 0.05}', False),
    ('"sgd", {"learning_rate": 0.1, "momentum": 0.5}', True),
    ('"adam", {"learning_rate": 0.01}', False),
    ('"adam", {"learning_rate": 0.01, "wd": 1e-2, "clip_gradient": 0.05}', True),
    ('"adamw", {"learning_rate": 0.01, "wd": 0.1}', False),
])
def test_the_update_joins_the_step_with_the_numbers_of_the_fused_update(opt, schedule):
    # Adam without batch norm: the bias before a batch norm has a gradient of rounding noise
    # (about 1e-9, of either sign), which Adam's normalized step turns into steps of +-lr, so the
    # rounding of two fusions apart would move it by 1e-2.
    joined, _ = same(UPDATE % ('"sgd"' in opt, opt, schedule))
    assert list(joined["_plans"][1:]) == [1] * 4, joined["_plans"]
    assert list(joined["_lookups"][1:]) == [0] * 4, joined["_lookups"]   # no plan built again
    # the update is part of the plan: nothing runs around it, nothing is allocated (Adam's step
    # count, for its bias corrections, lives on the device and the plan advances it); a new rate
    # and rescale_grad are written into the plan's two 0-d inputs in place, a small task each
    assert list(joined["_tasks"][2:]) == [2 if schedule else 0] * 3, joined["_tasks"]
    assert list(joined["_allocs"][2:]) == [0] * 3, joined["_allocs"]


def test_adams_step_count_on_the_device_follows_steps_run_apart():
    # Adam's bias corrections come from a step count the joined plan keeps on the device; a step
    # whose update runs apart (its gradients read before it) or a count the trainer is given
    # anew must not leave it behind.
    joined, _ = same("""
    net = net_of()
    trainer = kiln.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    tasks = []
    for step in range(7):
        kiln.gpu_step_stats()
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        if step in (2, 3):
            out["g%d" % step] = net[0].weight.grad().asnumpy()   # the update runs apart
        if step == 5:
            trainer._optimizer.num_update = 1                  # as a restart from a checkpoint
            trainer._optimizer._index_update_count.clear()
        trainer.step(6)
        tasks.append(kiln.gpu_step_stats()["tasks_outside_plans"])
        out["loss%d" % step] = l.asnumpy()
    out["_tasks"] = tasks
    for i, p in enumerate(net.collect_params().values()):
        out["param%d" % i] = p.data().asnumpy()
    """)
    # joined with the count on the device: no task (step 1, 6); the update apart (steps 2, 3):
    # its fused task; a new count after those and after the reset (steps 4, 5): one small task
    assert list(joined["_tasks"][1:]) == [0, 1, 1, 1, 1, 0], joined["_tasks"]


def test_reading_or_clipping_the_gradients_before_the_update_sees_the_steps_gradients():
    same("""
    net = net_of()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.9})
    for step in range(3):
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        g = [p.grad() for p in net.collect_params().values()]
        norm = float(np.sqrt(sum(float((x * x).sum().asnumpy()) for x in g)))
        out["norm%d" % step] = norm
        for x in g:                      # clipping by the global norm, in place
            x[:] = x * min(1.0, 0.1 / norm)
        trainer.step(6)
    out["params"] = np.concatenate([p.data().asnumpy().ravel() for p in net.collect_params().values()])
    """)


def test_a_call_between_backward_and_the_update_runs_after_the_step_and_before_the_update():
    same("""
    net = net_of()
    for p in net.collect_params().values():
        p.grad_req = "add"               # two batches per update
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for step in range(3):
        for half in (X[:3], X[3:]):
            with autograd.record():
                l = loss(net(half), y[:3])
            l.backward()
        out["eval%d" % step] = net(X).asnumpy()    # inference with the old weights
        trainer.step(6)
        out["after%d" % step] = net(X).asnumpy()
        for p in net.collect_params().values():
            p.zero_grad()
    out["params"] = np.concatenate([p.data().asnumpy().ravel() for p in net.collect_params().values()])
    """)


DROPOUT = """
net = nn.HybridSequential()
net.add(nn.Dense(32, activation="relu"), nn.Dropout(0.5), nn.Dense(16, activation="relu"), nn.Dropout(0.3),
        nn.Dense(5))
net.initialize(init=kiln.init.Xavier())
net.hybridize()
trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
plans, tasks = [], []
for step in range(5):
    kiln.gpu_step_stats()
    with autograd.record():
        l = loss(net(X), y)
        heads = [l]
        %s
    autograd.backward(heads)
    trainer.step(6)
    s = kiln.gpu_step_stats()
    plans.append(s["plan_calls"])
    tasks.append(s["tasks_outside_plans"])
    out["loss%%d" %% step] = l.asnumpy()
    out["noise%%d" %% step] = nd.random.uniform(shape=(7,)).asnumpy()   # what draws after the step
out["_plans"], out["_tasks"] = plans, tasks
for i, p in enumerate(net.collect_params().values()):
    out["param%%d" %% i] = p.data().asnumpy()
"""


def test_a_dropout_step_is_one_plan_drawing_the_numbers_of_the_calls_one_by_one():
    # The held forward's numbers are reserved where it was made: its masks, and what draws after
    # it, are those of the calls run one by one; the whole step is one plan.
    joined, _ = same(DROPOUT % "")
    assert list(joined["_plans"][1:]) == [1] * 4, joined["_plans"]
    assert list(joined["_tasks"][2:]) == [0] * 3, joined["_tasks"]   # the update joined as well


@pytest.mark.parametrize("between,plans", [
    ("noise = nd.random.uniform(shape=(3,))   # drawn after the forward, before the backward", 1),
    ("kiln.random.seed(5)                    # a new seed after the forward", 1),
    ("heads.append(loss(net(X * 2), y))      # a second forward: two held calls' masks", 1),
    # a draw between two held random calls: their numbers are not contiguous, so the four held
    # calls run one by one, then the backward and the update
    ("nd.random.uniform(shape=(6,)); heads.append(loss(net(X * 2), y))", 5),
    ("kiln.random.seed(5); heads.append(loss(net(X * 2), y))", 5),
])
def test_draws_between_held_random_calls_keep_their_order(between, plans):
    joined, _ = same(DROPOUT % between)
    assert list(joined["_plans"][1:]) == [plans] * 4, joined["_plans"]


def test_a_large_update_runs_in_place_after_the_step_and_trains_where_it_did():
    # Joined, the new weights are late outputs: a second copy of the weights in the plan's arena.
    # An update of more than 128 MiB (here 96 MiB of weights and as much of momenta) is not joined:
    # it runs in place after the step, so a model whose parameters fill the GPU trains as before,
    # with the step's gradients, once.
    from test_gpu import run_sim
    out = run_sim("""
    import numpy as np, kiln
    from kiln import nd, nn, autograd
    ctx = kiln.gpu(0)
    rng = np.random.default_rng(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(4096, in_units=2048, activation="relu"), nn.Dense(4096, in_units=4096), nn.Dense(5, in_units=4096))
    net.initialize(init=kiln.init.Xavier(), ctx=ctx)
    net.hybridize()
    X = nd.array(rng.standard_normal((8, 2048)).astype(np.float32), ctx=ctx)
    y = nd.array(rng.integers(0, 5, 8).astype(np.float32), ctx=ctx)
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for _ in range(3):
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        trainer.step(8)
    w = net[0].weight
    before = w.data().asnumpy().copy()
    kiln.gpu_step_stats()
    with autograd.record():
        l = loss(net(X), y)
    l.backward()
    trainer.step(8)
    s = kiln.gpu_step_stats()
    assert s["plan_calls"] == 1 and s["tasks_outside_plans"] == 1, s   # the step, then the update
    assert np.isfinite(l.asnumpy()).all()
    assert not np.allclose(w.data().asnumpy(), before)
    print("ok")
    """, mem="512M")
    assert "ok" in out



def test_two_threads_training_their_own_nets_with_their_own_schedules():
    # Two threads' steps share the device's held calls and its joined plans; each thread's rate
    # is written into its own 0-d tensor. Each net gets the numbers it gets trained alone.
    joined, _ = same("""
    import threading
    def make(seed):
        nd.random.seed(seed)
        net = nn.HybridSequential()
        net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(5, in_units=16))
        net.initialize(init=kiln.init.Xavier())   # shapes given: drawn here, in this thread
        net.hybridize()
        return net
    def train(net, lr, results, key):
        trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": lr, "momentum": 0.5})
        for step in range(6):
            trainer.set_learning_rate(lr / (1 + step))
            with autograd.record():
                l = loss(net(X), y)
            l.backward()
            trainer.step(6)
        results[key] = np.concatenate([p.data().asnumpy().ravel() for p in net.collect_params().values()])
    rates = (0.1, 0.03)
    alone, together = {}, {}
    for k, lr in enumerate(rates):
        train(make(10 + k), lr, alone, k)
    nets = [make(10 + k) for k in range(2)]
    threads = [threading.Thread(target=train, args=(nets[k], rates[k], together, k)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        np.testing.assert_array_equal(together[k], alone[k])
        out["net%d" % k] = together[k]
    """)
