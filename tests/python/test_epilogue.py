"""Epilogue groups (codegen/plan/fuse_epilogue.cc): a hybridized Conv2D or Dense with its bias and
activation runs as one oneDNN call with post-ops, with the same outputs and gradients as eager;
the compile report lists the group by its ops, and KILN_DISABLE_PASS=epilogue turns it off."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn


def _conv_net():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=3, padding=1, activation="relu", in_channels=3),
            nn.Conv2D(5, kernel_size=3, activation="tanh", in_channels=6),
            nn.Flatten(), nn.Dense(7, activation="relu"), nn.Dense(3, activation="sigmoid"))
    return net


def _dense_net():
    net = nn.HybridSequential()
    net.add(nn.Dense(33, activation="relu", in_units=19), nn.Dense(9, in_units=33))
    return net


def _pair(make, x):
    """An eager net and a hybridized copy with the same weights."""
    eager, hybrid = make(), make()
    for net in (eager, hybrid):
        net.initialize(kiln.init.Xavier())
        net(x)
    for p, q in zip(eager.collect_params().values(), hybrid.collect_params().values()):
        q.set_data(p.data().copy())
    hybrid.hybridize()
    return eager, hybrid


def _step(net, x):
    params = list(net.collect_params().values())
    for p in params:
        p.zero_grad()
    x.attach_grad()
    with autograd.record():
        y = net(x)
        loss = (y * y).sum()
    loss.backward()
    return y.asnumpy(), [p.grad().asnumpy().copy() for p in params] + [x.grad.asnumpy().copy()]


@pytest.mark.filterwarnings("ignore:.*traced again")
@pytest.mark.parametrize("make,shape", [(_conv_net, (3, 3, 11, 9)), (_dense_net, (6, 19)), (_dense_net, (2, 19))])
def test_hybridized_epilogues_match_eager_outputs_and_gradients(make, shape):
    x = nd.random.normal(shape=shape)
    eager, hybrid = _pair(make, x)
    for _ in range(2):  # the second call runs the cached graphs
        np.testing.assert_allclose(hybrid(x).asnumpy(), eager(x).asnumpy(), rtol=1e-4, atol=1e-5)
        ye, ge = _step(eager, x)
        yh, gh = _step(hybrid, x)
        np.testing.assert_allclose(yh, ye, rtol=1e-4, atol=1e-5)
        for a, b in zip(gh, ge):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_the_report_lists_the_epilogue_groups_by_their_ops():
    x = nd.random.normal(shape=(2, 3, 11, 9))
    _, net = _pair(_conv_net, x)
    net(x)
    [plan] = net.compile_report(as_dict=True)["plans"]
    epilogues = [g for g in plan["groups"] if g["expr"].startswith("oneDNN ")]
    assert [g["ops"] for g in epilogues][:3] == [["conv2d", "add", "relu"], ["conv2d", "add", "tanh"],
                                                 ["matmul", "add", "relu"]]
    assert epilogues[0]["expr"] == "oneDNN conv2d(in0, in1) post-ops: bias(in2), relu"
    assert "on oneDNN post-ops" in plan["fusion"]
    assert "group 0: conv2d, add, relu -> 1 kernel (in0, in1, in2), 3 ops" in net.compile_report()


class _SquaredDense(nn.HybridBlock):
    """Dense followed by square: square's gradient reads its input, the pre-activation."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(9, in_units=19)

    def forward(self, x):
        return nd.square(self.dense(x))


def _training_groups(make):
    x = nd.random.normal(shape=(4, 19))
    eager, net = _pair(make, x)
    with autograd.record():
        net(x).sum().backward()
    plans = {p["name"]: p for p in net.compile_report(as_dict=True)["plans"]}
    return [g["ops"] for g in plans["training forward"]["groups"] if g["expr"].startswith("oneDNN ")]


def test_training_fuses_relu_whose_gradient_reads_its_output():
    assert ["matmul", "add", "relu"] in _training_groups(_dense_net)


def test_training_keeps_the_pre_activation_the_backward_reads():
    # square's gradient reads its input: in training the bias add ends the group, its output written
    ops = _training_groups(_SquaredDense)
    assert ["matmul", "add"] in ops and ["matmul", "add", "square"] not in ops


def test_kiln_disable_pass_epilogue_turns_it_off():
    script = textwrap.dedent("""
        import numpy as np
        from kiln import nd, nn
        net = nn.Dense(8, activation="relu", in_units=5)
        net.initialize()
        x = nd.ones((3, 5))
        want = net(x).asnumpy()
        net.hybridize()
        np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-6)
        [plan] = net.compile_report(as_dict=True)["plans"]
        print([g["ops"] for g in plan["groups"]])
    """)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))

    def run(disable):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        env.pop("KILN_DISABLE_PASS", None)
        if disable:
            env["KILN_DISABLE_PASS"] = "epilogue"
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert run(False) == "[['matmul', 'add', 'relu']]"
    assert "matmul" not in run(True)
