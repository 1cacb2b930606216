"""Eager autograd's memory: a recorded forward holds only the values its gradients read (not a
convolution's output before its bias, nor a batch norm's output that a relu reads), and a backward
gives memory back as it goes (each gradient after its last reader, each saved value after the last
gradient node that reads it), as PyTorch's does. Measured with the CPU pool's byte counts (exact,
not timing), each case in a fresh interpreter so that the peak is its own."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kiln import autograd, nd

MiB = 1 << 20


def run(code, **env):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **env))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_recorded_conv_bn_relu_holds_the_bn_input_and_the_output_only():
    out = run("""
        import json, kiln
        from kiln import autograd, nd, nn
        x = nd.random.normal(shape=(64, 16, 32, 32))           # A = 4 MiB per activation
        conv, bn = nn.Conv2D(16, 3, padding=1, in_channels=16), nn.BatchNorm(in_channels=16)
        conv.initialize(); bn.initialize()
        for _ in range(2):                                       # the second: caches are warm
            kiln.waitall(); base = kiln.cpu_memory_stats()["bytes_in_use"]
            with autograd.record():
                y = nd.relu(bn(conv(x)))
            kiln.waitall(); held = kiln.cpu_memory_stats()["bytes_in_use"] - base
            y.backward(); del y
        print(json.dumps({"held": held, "A": x.size * 4}))
    """)
    # The convolution's output with its bias (batch norm's gradient reads it) and y (relu's
    # gradient reads its output, and the caller holds it): two activations, plus batch norm's
    # per-channel statistics. Holding every intermediate was four.
    assert out["held"] <= 2 * out["A"] + MiB, out["held"] / out["A"]


def test_backward_frees_gradients_and_saved_values_as_it_goes():
    out = run("""
        import json, kiln
        from kiln import autograd, nd
        B = 4 << 20
        x = nd.random.normal(shape=(1 << 20,)); x.attach_grad()
        kiln.waitall(); s0 = kiln.cpu_memory_stats()
        with autograd.record():
            y = x
            for _ in range(8):
                y = nd.relu(y) * 1.5
            loss = y.sum()
        del y
        kiln.waitall(); s1 = kiln.cpu_memory_stats()
        loss.backward(); kiln.waitall(); s2 = kiln.cpu_memory_stats()
        print(json.dumps({"forward": (s1["bytes_in_use"] - s0["bytes_in_use"]) / B,
                          "peak": (s2["peak_bytes_in_use"] - s0["bytes_in_use"]) / B,
                          "after": (s2["bytes_in_use"] - s0["bytes_in_use"]) / B}))
    """, KILN_ENGINE_MAX_PENDING_MB="1")
    # Forward: the eight relu outputs (their gradients read them). Backward: those, shrinking, plus
    # a few arrays in flight: the incoming gradient, relu's mask and product, the scaled gradient,
    # and the engine's queued outputs (KILN_ENGINE_MAX_PENDING_MB: 1 MiB here). Holding every
    # gradient until the end, as before, peaked at 8 + 34.
    assert out["forward"] <= 8.01, out
    assert out["peak"] <= 8 + 6, out
    assert out["after"] <= 1.01, out  # x.grad only


def test_gradients_are_unchanged_when_intermediates_are_dropped():
    # The same values through paths where the tape holds nothing of an op (bias add, add, scalar
    # multiply), something (relu, batch norm), and a value promoted later (a dropped output that a
    # later op's gradient reads, and an in-place write into a dropped output).
    rng = np.random.default_rng(0)
    xn = rng.normal(size=(4, 6)).astype(np.float32)
    x = nd.array(xn)
    x.attach_grad()
    with autograd.record():
        a = x * 3.0                 # nobody saves a yet
        b = a + 1.0
        c = a * b                   # mul's gradient reads both inputs: a is held from here
        d = nd.relu(c - 5.0)
        d[0] = 0.0                  # an in-place write into a value nobody saved
        loss = (d * 2.0).sum()
    loss.backward()
    an = xn * 3.0
    cn = an * (an + 1.0)
    mask = (cn - 5.0 > 0).astype(np.float32)
    mask[0] = 0.0
    want = 2.0 * mask * (2.0 * an + 1.0) * 3.0
    np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-5, atol=1e-5)


def test_a_second_backward_without_retain_graph_is_still_refused():
    x = nd.array([1.0, 2.0, 3.0])
    x.attach_grad()
    with autograd.record():
        y = nd.relu(x * 2.0) * 3.0
        loss = y.sum()
    loss.backward()
    with pytest.raises(Exception, match="retain_graph"):
        loss.backward()


def test_an_eager_layer_feeding_a_hybridized_block_trains_as_all_eager():
    # The compiled call's backward reads its inputs: the eager Dense's output (which the Dense's
    # own gradient does not read) must be held for it. The gradients match the all-eager network.
    from kiln import nn
    rng = np.random.default_rng(1)
    x = nd.array(rng.random((4, 5)).astype(np.float32))

    def make():
        body = nn.HybridSequential()
        body.add(nn.Dense(8, activation="relu"), nn.Dense(2))
        net = nn.Sequential()
        net.add(nn.Dense(16), body)
        net.initialize()
        net(x)
        return net, body

    eager, _ = make()
    mixed, body = make()
    for p, q in zip(eager.collect_params().values(), mixed.collect_params().values()):
        q.set_data(p.data())
    body.hybridize()
    grads = []
    for net in (eager, mixed):
        with autograd.record():
            h = x * 2.0             # an eager value nobody's gradient reads, then the network
            loss = net(h).sum()
        loss.backward()
        grads.append([p.grad().asnumpy() for p in net.collect_params().values()])
    for g_eager, g_mixed in zip(*grads):
        np.testing.assert_allclose(g_mixed, g_eager, rtol=1e-5, atol=1e-6)


def test_a_hybridized_conv_bn_relu_stack_holds_one_activation_per_layer():
    # A compiled training step hands its backward what it reads; values that cheap pointwise ops
    # make from others it holds (the normalized x, relu's output) are computed again in the
    # backward instead (passes::ChooseSaved). Batch norm composes x - mean from the convolution's
    # output: one activation per layer is held, where the normalized x and relu's output as well
    # made three.
    out = run("""
        import json, kiln
        from kiln import autograd, nd, nn
        x = nd.random.normal(shape=(64, 16, 32, 32))           # A = 4 MiB per activation
        net = nn.HybridSequential()
        for _ in range(4):
            net.add(nn.Conv2D(16, 3, padding=1, in_channels=16), nn.BatchNorm(in_channels=16),
                    nn.Activation("relu"))
        net.initialize(); net.hybridize()
        for _ in range(2):                                       # the second: caches are warm
            kiln.waitall(); base = kiln.cpu_memory_stats()["bytes_in_use"]
            with autograd.record():
                y = net(x)
            kiln.waitall(); held = kiln.cpu_memory_stats()["bytes_in_use"] - base
            y.backward(); del y
        print(json.dumps({"held": held, "A": x.size * 4}))
    """)
    # Four layers: x - mean of each; the output y the caller holds, and a copy of it the backward
    # is handed (relu's gradient reads it). Holding every value the gradients read was 13.
    assert out["held"] <= 6 * out["A"] + MiB, out["held"] / out["A"]


def test_hybridized_gradients_with_recomputed_values_match_eager():
    from kiln import nn
    rng = np.random.default_rng(2)
    x = nd.array(rng.normal(size=(8, 3, 10, 10)).astype(np.float32))

    def make():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(6, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2D(6, 3, padding=1), nn.BatchNorm(), nn.Activation("sigmoid"), nn.Dense(4))
        net.initialize()
        net(x)
        return net

    eager, hybrid = make(), make()
    for p, q in zip(eager.collect_params().values(), hybrid.collect_params().values()):
        q.set_data(p.data())
    hybrid.hybridize()
    grads = []
    for net in (eager, hybrid):
        for _ in range(2):  # the second step trains from moved running statistics
            with autograd.record():
                loss = (net(x) ** 2).sum()
            loss.backward()
        grads.append([p.grad().asnumpy() for p in net.collect_params().values() if p.grad_req != "null"])
    for g_eager, g_hybrid in zip(*grads):
        np.testing.assert_allclose(g_hybrid, g_eager, rtol=2e-4, atol=2e-5)
