"""kiln.distributed across processes: small scripts (tests/python/mpi_scripts/) launched with
`mpirun --oversubscribe -np 2`, plus the 1-process world without mpirun. Skipped when OpenMPI's
mpirun is not installed. The whole file takes about 15 s on 2 cores."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import kiln

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_scripts")
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="OpenMPI's mpirun is not installed")


def _env(under_mpirun):
    env = dict(os.environ)
    # The package this test imported, whatever the caller's PYTHONPATH.
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if under_mpirun:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"            # CI may run as root
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    else:  # a launcher's variables would make the child think it is a rank of a world
        for k in list(env):
            if k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_")):
                del env[k]
    return env


def run(script, *args, np=2, timeout=60):
    """Runs a script under mpirun -np `np` (np=None: alone); returns (returncode, output, seconds).

    Under mpirun each rank's stdout and stderr go to files of their own (--output-filename) and the
    output is those files, rank by rank, then what mpirun itself printed after a "[mpirun]" line:
    mpirun forwards the ranks' writes as they come, and two ranks' lines can arrive cut into each
    other ("OK OK 0\n1\n"), which no test should have to parse."""
    cmd = [sys.executable, os.path.join(SCRIPTS, script), *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="kiln-mpi-") as logs:
        if np is not None:
            cmd = [MPIRUN, "--oversubscribe", "--output-filename", logs, "-np", str(np)] + cmd
        start = time.time()
        p = subprocess.run(cmd, env=_env(np is not None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True)
        seconds = time.time() - start
        if np is None:
            return p.returncode, p.stdout, seconds
        ranks = []
        for rank in range(np):
            for stream in ("stdout", "stderr"):
                found = glob.glob(os.path.join(logs, "*", f"rank.{rank}", stream))
                for path in found:
                    with open(path, errors="replace") as f:
                        ranks.append(f.read())
        return p.returncode, "".join(ranks) + "\n[mpirun]\n" + p.stdout, seconds


def results(out):
    """The "RESULT ..." reports of the ranks, from their own output (not mpirun's copy of it)."""
    return re.findall(r"RESULT (.*?)(?=RESULT |\n|$)", out.split("\n[mpirun]\n")[0])


@needs_mpirun
def test_two_ranks_allreduce_broadcast_ordering():
    rc, out, _ = run("basic.py")
    assert rc == 0, out
    assert sorted(results(out)) == ["OK 0 2", "OK 1 2"], out


def test_one_process_world_without_mpirun():
    rc, out, _ = run("basic.py", np=None)
    assert rc == 0, out
    assert "OK 0 1" in out, out


@needs_mpirun
def test_schedule_mismatch_raises_on_every_rank():
    rc, out, _ = run("schedule.py")
    assert rc == 0, out
    found = results(out)
    assert len(found) == 2, out
    for line in found:
        assert line.startswith("DistributedError: check_schedule:"), line
        assert "entry #1" in line, line
        assert "rank 0: fc1.bias (16,) float32" in line, line
        assert "rank 1: fc1.bias (17,) float32" in line, line
    assert "this is rank 0's error" in out and "this is rank 1's error" in out, out


@needs_mpirun
def test_size_mismatch_raises_on_every_rank_without_corruption():
    rc, out, _ = run("size_mismatch.py")
    assert rc == 0, out
    found = results(out)
    assert len(found) == 4, out
    for line in found:
        assert "allreduce" in line and "expected the same count of elements" in line, line
        assert "check_schedule" in line, line


@needs_mpirun
def test_stalled_rank_times_out_with_clear_error():
    # Rank 1 is alive but never joins: the survivor's own deadline fires.
    rc, out, seconds = run("dead_rank.py", "hang", 5)
    # Its own type through the engine task (not its base StateError), naming the script's line.
    m = re.search(r"RESULT DistributedError after ([0-9.]+)s: (.*)", out)
    assert m, out
    assert 4.5 <= float(m.group(1)) <= 10, m.group(1)
    msg = m.group(2)
    for part in ("allreduce", "rank 0 of 2", "waited 5.0 s", "probably died",
                 "kiln.distributed.init(timeout=...)", "dead_rank.py:31)"):
        assert part in msg, msg
    assert rc != 0
    assert seconds < 25, seconds


@needs_mpirun
@pytest.mark.parametrize("how", ["raise", "exit", "kill"])
def test_dead_rank_ends_the_job_with_a_clear_message(how):
    # mpirun itself ends the job when a rank exits with an error (observed: within about a second,
    # SIGTERM to the survivors, which print a note); the survivor's own deadline (5 s) is the
    # fallback where the launcher does not.
    rc, out, seconds = run("dead_rank.py", how, 5)
    assert rc != 0, out
    assert seconds < 25, seconds
    assert "RESULT no error" not in out, out
    survivor = ("kiln.distributed: rank 0 was terminated by the launcher (SIGTERM)" in out
                or re.search(r"RESULT DistributedError after [0-9.]+s: .*rank 0 of 2", out))
    assert survivor, out
    if how == "raise":
        assert "kiln.distributed: rank 1 stopped on an uncaught RuntimeError" in out, out


@needs_mpirun
def test_gpu_allreduce_on_simulated_gpus_goes_through_the_host(monkeypatch):
    monkeypatch.setenv("KILN_GPU_SIM", "1")  # each process simulates its own GPU: no NCCL between them
    rc, out, _ = run("gpu.py", np=2, timeout=120)
    assert rc == 0, out
    assert "OK 0" in out and "OK 1" in out, out


@needs_mpirun
def test_gpu_allreduce_over_nccl():
    if kiln.num_gpus() == 0:
        pytest.skip("needs a real GPU (NCCL between processes; simulated GPUs live in one process): did not run")
    if not kiln._C.distributed.nccl_available():
        pytest.skip("no NCCL here (kiln built without it): did not run")
    # One rank per GPU (NCCL refuses two ranks on one GPU); one GPU still runs a 1-rank NCCL world.
    nranks = min(2, kiln.num_gpus())
    rc, out, _ = run("gpu.py", np=nranks, timeout=120)
    assert rc == 0, out
    for r in range(nranks):
        assert f"OK {r}" in out, out
