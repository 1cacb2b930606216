"""HybridBlock.compile_report() and KILN_REPORT=1: what compiling a hybridized block did (passes,
fused groups by the ops they came from, kernels and bytes before and after fusion, the planned
arena), for inference and training graphs; asking before there is a compiled graph is an error."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu", in_units=20), nn.Dense(16, activation="tanh", in_units=32),
            nn.Dense(3, in_units=16))
    net.initialize()
    return net


def _with_codegen(plan):
    return plan["fusion"] != "unavailable (built without LLVM)"


def test_the_report_names_the_passes_the_fused_groups_and_the_arena(monkeypatch):
    # Generated kernels only: with epilogues, each Dense is one oneDNN call (test_epilogue.py).
    monkeypatch.setenv("KILN_DISABLE_PASS", "epilogue")
    net = _mlp()
    x = nd.random.normal(shape=(8, 20))
    want = net(x).asnumpy()
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-6)

    text = net.compile_report()
    assert isinstance(text, str)
    assert repr(text) == str(text)  # shown as text at the prompt
    for line in ("forward:", "simplify:", "cse:", "dce:", "fusion:", "kernels:", "bytes moved:", "arena"):
        assert line in text, text

    report = net.compile_report(as_dict=True)
    [plan] = report["plans"]
    assert plan["name"] == "forward"
    assert {"simplify", "cse", "dce"} <= {p["name"] for p in plan["passes"]}
    assert all(p["ran"] for p in plan["passes"])
    assert plan["arena_bytes"] <= plan["unshared_bytes"]
    assert plan["total_ms"] > 0
    if _with_codegen(plan):
        # Each Dense's bias add and activation is one generated kernel.
        assert [g["ops"] for g in plan["groups"]] == [["add", "relu"], ["add", "tanh"]]
        assert "group 0: add, relu -> 1 kernel" in text and "group 1: add, tanh -> 1 kernel" in text
        assert plan["groups"][0]["expr"].startswith("relu(add(")
        assert plan["kernels_after"] < plan["kernels_before"]
        assert plan["bytes_after"] < plan["bytes_before"]
        assert sum(plan["codegen_cache"].values()) == 2  # each group compiled or found in a cache
    else:
        assert "fusion: unavailable (built without LLVM)" in text


def test_training_adds_the_training_forward_and_backward():
    net = _mlp()
    net.hybridize()
    x = nd.random.normal(shape=(8, 20))
    with autograd.record():
        y = net(x)
    y.backward()
    names = [p["name"] for p in net.compile_report(as_dict=True)["plans"]]
    assert names == ["forward", "training forward", "training backward"]
    assert "training backward:" in net.compile_report()


def test_the_report_follows_the_graph_the_last_call_ran():
    net = _mlp()
    net.hybridize()
    net(nd.ones((2, 20)))
    first = net.compile_report(as_dict=True)["graph_id"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # another batch size traces quietly (issue 28)
        net(nd.ones((5, 20)))  # a new input shape
    second = net.compile_report(as_dict=True)["graph_id"]
    assert second != first
    net(nd.ones((2, 20)))
    assert net.compile_report(as_dict=True)["graph_id"] == first


def test_asking_before_a_compiled_call_is_a_state_error():
    net = _mlp()
    with pytest.raises(kiln.StateError, match=r"compile_report\(\).*not hybridized: call hybridize\(\)"):
        net.compile_report()
    net.hybridize()
    with pytest.raises(kiln.StateError, match="has not run compiled yet"):
        net.compile_report()
    deferred = nn.HybridSequential()
    deferred.add(nn.Dense(4))
    deferred.initialize()
    deferred.hybridize()
    deferred(nd.ones((2, 3)))  # completes the weight's shape while it traces: compiled at once
    assert "forward:" in deferred.compile_report()


def test_kiln_report_prints_the_report_to_stderr_when_a_block_compiles():
    script = textwrap.dedent("""
        from kiln import nd, nn
        net = nn.Dense(4, activation="relu", in_units=3)
        net.initialize()
        net.hybridize()
        net(nd.ones((2, 3))).wait_to_read()
        print("called")
    """)
    env = dict(os.environ, KILN_REPORT="1")
    # The kiln package this test imported, whichever build it came from.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "called"
    assert "compile report, graph" in out.stderr
    assert "forward:" in out.stderr and "arena" in out.stderr and "simplify:" in out.stderr


def test_an_imported_symbol_block_reports_on_its_graph(tmp_path):
    net = _mlp()
    net.hybridize()
    x = nd.random.normal(shape=(4, 20))
    net(x)
    sym_file, params_file = net.export(str(tmp_path / "m"))
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    with pytest.raises(kiln.StateError):
        back.compile_report()  # not called yet
    back(x)
    report = back.compile_report()
    assert "forward:" in str(report) and "constant_fold" in str(report)
