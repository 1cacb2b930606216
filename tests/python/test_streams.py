"""Stream assignment in compiled plans: independent branches get streams of their own, the report
says so, every call (serial, concurrent, and the first calls that time both) gives the eager
results, and KILN_DISABLE_PASS=streams keeps one stream."""
import os
import subprocess
import sys
import textwrap

import numpy as np

import kiln
from kiln import nd, nn


class TwoBranches(nn.HybridBlock):
    def __init__(self, width, depth):
        super().__init__()
        self.a, self.b = nn.HybridSequential(), nn.HybridSequential()
        for _ in range(depth):
            self.a.add(nn.Dense(width, activation="tanh"))
            self.b.add(nn.Dense(width, activation="tanh"))

    def forward(self, x, y):
        return self.a(x) + self.b(y)


def test_branches_get_streams_and_every_call_matches_eager():
    net = TwoBranches(512, 3)
    net.initialize()
    x, y = nd.random.normal(shape=(128, 512)), nd.random.normal(shape=(128, 512))
    want = net(x, y).asnumpy()
    net.hybridize()
    for _ in range(14):  # past the timing trial that alternates the two layouts
        np.testing.assert_allclose(net(x, y).asnumpy(), want, rtol=1e-5, atol=1e-5)
    [plan] = net.compile_report(as_dict=True)["plans"]
    assert plan["streams"] == 2
    assert plan["concurrent"]  # worth trying: about a third of the work is off the critical path
    assert 0.5 < plan["critical_fraction"] < 0.8
    assert "streams: 2" in str(net.compile_report())


def test_a_chain_has_one_stream():
    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dense(8))
    net.initialize()
    net(nd.ones((4, 16)))
    net.hybridize()
    net(nd.ones((4, 16)))
    [plan] = net.compile_report(as_dict=True)["plans"]
    assert plan["streams"] == 1 and not plan["concurrent"]


def test_kiln_disable_pass_streams_keeps_one_stream():
    script = textwrap.dedent("""
        from kiln import nd
        import test_streams as t
        net = t.TwoBranches(512, 2)
        net.initialize()
        x = nd.ones((128, 512))
        net(x, x)
        net.hybridize()
        net(x, x)
        [plan] = net.compile_report(as_dict=True)["plans"]
        print(plan["streams"], plan["concurrent"])
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env = dict(os.environ, KILN_DISABLE_PASS="streams",
               PYTHONPATH=os.pathsep.join([root, os.path.dirname(os.path.abspath(__file__))]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False"]
