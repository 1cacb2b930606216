"""kiln.profiler: MXNet's API (set_config, set_state, pause/resume, dump, dumps) and the structure of
the Chrome trace it writes: valid JSON, lanes named, every complete event well-formed, a compiled
call's steps inside the call's event on its lane, eager ops named by op with their queued time
apart, memory counters, a collective's bytes, compile events; KILN_PROFILE=path in a fresh process,
and GPU stream lanes on two simulated GPUs (KILN_GPU_SIM=2)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln import nd, nn, profiler


def run_workload():
    """The d2l patterns the trace should show: eager matmuls, a hybridized MLP, an allreduce."""
    a = nd.random.uniform(shape=(128, 128))
    for _ in range(10):
        b = nd.dot(a, a)
    b.wait_to_read()
    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dense(10))
    net.initialize()
    net.hybridize()
    x = nd.random.normal(shape=(8, 32))
    for _ in range(3):
        net(x).wait_to_read()
    parts = [nd.ones((1000,), device=kiln.cpu(0)), nd.ones((1000,), device=kiln.cpu(1))]
    kiln._C.allreduce([[parts[0]], [parts[1]]])
    kiln.waitall()
    np.testing.assert_allclose(parts[1].asnumpy(), 2.0)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("prof") / "trace.json")
    kiln.waitall()
    profiler.set_config(profile_all=True, filename=path, aggregate_stats=True)
    profiler.set_state("run")
    try:
        run_workload()
    finally:
        profiler.set_state("stop")
    table = profiler.dumps()
    profiler.dump(finished=True)
    with open(path) as f:
        trace = json.load(f)
    profiler.set_config(aggregate_stats=False, filename="profile.json")
    return trace, table


def complete(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def lanes(trace):
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def test_every_event_is_well_formed_and_on_a_named_lane(profiled):
    trace, _ = profiled
    names = lanes(trace)
    events = complete(trace)
    assert len(events) > 20
    for e in events:
        assert isinstance(e["name"], str) and e["name"]
        assert e["cat"] in ("operator", "symbolic", "compile", "collective", "gpu")
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert e["tid"] in names, f"{e['name']} is on lane {e['tid']}, which has no name"
        assert isinstance(e["pid"], int)
    assert any(n.startswith("cpu(0) worker") for n in names.values())


def test_eager_ops_are_named_by_op_with_their_queued_time_apart(profiled):
    trace, _ = profiled
    matmuls = [e for e in complete(trace) if e["name"] == "matmul" and e["cat"] == "operator"]
    assert len(matmuls) >= 10
    for e in matmuls:
        assert e["args"]["queued_us"] >= 0
    # Ten matmuls queued for one worker: those behind a running one waited.
    assert any(e["args"]["queued_us"] > 0 for e in matmuls)


def test_a_compiled_calls_steps_lie_inside_it_on_its_lane(profiled):
    trace, _ = profiled
    symbolic = [e for e in complete(trace) if e["cat"] == "symbolic"]
    calls = [e for e in symbolic if "steps" in e["args"]]
    steps = [e for e in symbolic if "step" in e["args"]]
    assert len(calls) >= 2  # the first call traces (and may run eagerly), the later ones run compiled
    assert len(steps) >= 2 * len(calls)
    assert any(s["name"] in ("matmul", "linear") or "fused" in s["name"] for s in steps)
    for s in steps:
        assert any(c["tid"] == s["tid"] and c["ts"] <= s["ts"] and s["ts"] + s["dur"] <= c["ts"] + c["dur"] + 0.002
                   for c in calls), f"step {s['name']} lies outside every call on its lane"


def test_memory_counters_collectives_and_compile_events(profiled):
    trace, _ = profiled
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert any(e["name"] == "memory cpu(0)" for e in counters)
    assert any(e["name"] == "memory cpu(1)" for e in counters)
    assert all(e["args"]["bytes_in_use"] >= 0 for e in counters)
    reduces = [e for e in complete(trace) if e["cat"] == "collective"]
    assert [e["name"] for e in reduces] == ["allreduce"]
    assert reduces[0]["args"]["bytes"] == 4000 and reduces[0]["args"]["devices"] == 2
    compile_names = [e["name"] for e in complete(trace) if e["cat"] == "compile"]
    assert "trace" in compile_names
    assert "compile forward" in compile_names
    assert sum(n.startswith("pass ") for n in compile_names) >= 3
    assert any(n.startswith("plan ") for n in compile_names)


def test_dumps_is_a_table_per_op_with_counts(profiled):
    _, table = profiled
    assert table.startswith("Profile Statistics:")
    assert "operator\n=================" in table
    assert "Total Count" in table and "Avg Time (ms)" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith("matmul ")}
    assert int(rows["matmul"][1]) >= 10
    count, total, lo, hi, mean = int(rows["matmul"][1]), *map(float, rows["matmul"][2:6])
    assert lo <= mean <= hi and mean == pytest.approx(total / count, rel=1e-3, abs=1e-4)
    assert "Device Storage" in table and "memory cpu(0)" in table


def test_pause_resume_and_reset():
    kiln.waitall()
    profiler.set_config(profile_all=True, aggregate_stats=True)
    profiler.set_state("run")
    a = nd.ones((4, 4))
    profiler.pause()
    for _ in range(5):
        a = nd.exp(a)
    a.wait_to_read()
    assert profiler.state() == "run"
    profiler.resume()
    nd.sqrt(a).wait_to_read()
    profiler.set_state("stop")
    table = profiler.dumps(reset=True)
    assert "sqrt" in table and "exp " not in table  # nothing was recorded while paused
    assert "sqrt" not in profiler.dumps()  # reset forgot them
    profiler.set_config(aggregate_stats=False)


def test_bad_input_gets_typed_errors_saying_what_was_expected(tmp_path):
    with pytest.raises(kiln.ArgumentError, match="expected 'run' or 'stop'"):
        profiler.set_state("go")
    with pytest.raises(ValueError, match="unknown option 'profile_everything'.*expected one of"):
        profiler.set_config(profile_everything=True)
    with pytest.raises(kiln.ArgumentError, match="existing, writable directory"):
        profiler.set_config(filename=str(tmp_path / "missing" / "trace.json"))
    with pytest.raises(kiln.ArgumentError, match="True or False"):
        profiler.set_config(profile_all="yes")
    with pytest.raises(kiln.StateError, match="aggregate_stats=True"):
        profiler.dumps()
    assert profiler.state() == "stop"


def run(code, **env):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_kiln_profile_writes_the_whole_run_at_exit(tmp_path):
    path = tmp_path / "run.json"
    run("""
        import kiln
        from kiln import nd
        x = nd.ones((64, 64))
        for _ in range(5):
            x = nd.dot(x, x) * 0.01
        print(x.asnumpy().sum())
    """, KILN_PROFILE=str(path))
    trace = json.loads(path.read_text())
    assert sum(e["name"] == "matmul" for e in complete(trace)) == 5
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]  # written by rename, nothing left over


def test_a_long_profiled_run_keeps_a_bounded_number_of_events(tmp_path):
    path = tmp_path / "long.json"
    r = run("""
        import kiln
        from kiln import nd
        x = nd.ones((4,))
        for _ in range(500):
            x = x + 1
        print(x.asnumpy()[0])
    """, KILN_PROFILE=str(path), KILN_PROFILE_MAX_EVENTS="100")
    trace = json.loads(path.read_text())
    kept = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert len(kept) <= 100
    assert trace["otherData"] == {"max_events": 100, "dropped_events": trace["otherData"]["dropped_events"]}
    assert trace["otherData"]["dropped_events"] >= 400
    assert r.stderr.count("later events are dropped") == 1     # one warning, not one per event
    assert r.stdout.strip() == "501.0"


def test_kiln_profile_with_an_unwritable_path_fails_at_start(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from kiln import nd; nd.ones((2,)).asnumpy()"],
                       env=dict(os.environ, KILN_PROFILE=str(tmp_path / "no" / "t.json")),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "expected the path of a trace file in an existing, writable directory" in r.stderr


def test_gpu_streams_get_lanes_with_device_time_on_simulated_gpus(tmp_path):
    path = tmp_path / "gpu.json"
    run(f"""
        import kiln
        from kiln import nd, profiler
        profiler.set_config(profile_all=True, filename={str(path)!r})
        profiler.set_state("run")
        a = nd.random.uniform(shape=(256, 256), ctx=kiln.gpu(0))
        for _ in range(5):
            b = nd.dot(a, a)
        c = b.copyto(kiln.gpu(1))
        print(c.asnumpy().sum())
        kiln.waitall()
        profiler.set_state("stop")
        profiler.dump()
    """, KILN_GPU_SIM="2")
    trace = json.loads(path.read_text())
    names = lanes(trace)
    device = [e for e in complete(trace) if e["cat"] == "gpu"]
    host = [e for e in complete(trace) if e["cat"] == "operator" and names[e["tid"]].endswith("(host)")]
    assert sum(e["name"] == "matmul" for e in device) == 5
    assert sum(e["name"] == "matmul" for e in host) == 5
    assert {names[e["tid"]] for e in device if e["name"] == "matmul"} == {"gpu(0) compute stream"}
    assert any(e["name"] == "memory gpu(0)" for e in trace["traceEvents"] if e["ph"] == "C")
    # Device time cannot start before the work was issued on the host.
    first_host = min(e["ts"] for e in host if e["name"] == "matmul")
    assert min(e["ts"] for e in device if e["name"] == "matmul") >= first_host - 1


def test_the_readme_snippet_runs_and_writes_its_trace(tmp_path):
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    section = readme.split("### Profiler", 1)[1]
    snippet = section.split("```python", 1)[1].split("```", 1)[0]
    package = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))  # PYTHONPATH may be relative
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", "import kiln\nfrom kiln import nd\n" + snippet], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matmul" in r.stdout and "Total Count" in r.stdout
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["name"] == "matmul" for e in complete(trace))
