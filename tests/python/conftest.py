"""Shared pytest setup for kiln's Python tests: every test starts from the same random state and
ends with the engine drained (no op of one test still running when the next starts or at exit)."""
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# KILN_TEST_REAL_GPU=1 (scripts/gpu-check on a GPU machine): the GPU tests run on the real GPUs
# (gpu_env below). Read and taken out before kiln starts: kiln warns about a KILN_ variable that
# is not one of its switches, in this process and in every snippet's.
REAL_GPU = os.environ.pop("KILN_TEST_REAL_GPU", "") == "1"

# Kernels compile into a disk cache of the test run's own (read on every compile), removed at the
# end: the tests see cold compiles and leave the user's ~/.cache/kiln alone.
_cache_dir = tempfile.mkdtemp(prefix="kiln-pytest-cache-")
os.environ["KILN_CACHE_DIR"] = _cache_dir
# GPU convolutions are compared with the CPU's float32 numbers: full float32, as PyTorch's tests turn
# TF32 off (unless KILN_CONV_TF32 is set; test_math_mode.py sets it itself).
os.environ.setdefault("KILN_CONV_TF32", "0")

import kiln
from kiln import nd


@pytest.fixture(autouse=True)
def _seeded():
    nd.random.seed(0)
    np.random.seed(0)
    yield
    kiln.waitall()


@pytest.fixture(autouse=True, scope="session")
def _own_kernel_cache():
    yield
    shutil.rmtree(_cache_dir, ignore_errors=True)


# ---- where the GPU tests run ---------------------------------------------------------------------
# A GPU test runs its snippet in a fresh interpreter (the GPU platform is chosen once per process)
# with gpu_env's environment: two simulated GPUs (KILN_GPU_SIM=2), so that it runs, never skips, on
# a machine without a GPU. With KILN_TEST_REAL_GPU=1 (scripts/gpu-check on a GPU machine) the same
# snippets run on this machine's real GPUs instead; one that needs more GPUs than there are skips
# with NEEDS_TWO_GPUS as its reason (the lent GPU machines have one: the two-GPU cases run on
# simulated GPUs only, in CI), and one that sets the simulator's own switches skips too.
NEEDS_TWO_GPUS = "needs two GPUs"


@functools.lru_cache(maxsize=None)
def real_gpu_count():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_GPU_SIM")}
    r = subprocess.run([sys.executable, "-c", "import kiln; print(kiln.num_gpus())"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "KILN_TEST_REAL_GPU=1: counting the GPUs failed:\n" + r.stdout + r.stderr
    return int(r.stdout.split()[-1])


def _short_of_gpus(n):
    pytest.skip(f"{NEEDS_TWO_GPUS}; this machine has {n} real GPU (KILN_TEST_REAL_GPU=1): "
                "the two-GPU cases run on simulated GPUs only")


def gpu_env(code="", sim_mem=None, **extra):
    """The environment of a GPU snippet `code`: two simulated GPUs (`sim_mem`: their memory), or
    with KILN_TEST_REAL_GPU=1 the real ones, skipping a snippet that checks for two GPUs where
    there is one; `extra`: more variables."""
    env = dict(os.environ, **extra)
    if not REAL_GPU:
        env["KILN_GPU_SIM"] = "2"
        if sim_mem:
            env["KILN_GPU_SIM_MEM"] = sim_mem
        return env
    if sim_mem:
        pytest.skip(f"sets the simulated GPUs' memory (KILN_GPU_SIM_MEM={sim_mem}): simulated GPUs only")
    env.pop("KILN_GPU_SIM", None)
    env.pop("KILN_GPU_SIM_MEM", None)
    n = real_gpu_count()
    if n == 0:
        pytest.fail("KILN_TEST_REAL_GPU=1, but kiln finds no GPU on this machine")
    if n < 2 and re.search(r"num_gpus\(\) == 2", code):
        _short_of_gpus(n)
    return env


def skip_if_short_of_gpus(result):
    """After a snippet ran on the real GPUs (KILN_TEST_REAL_GPU=1): failing because gpu(i) does not
    exist on a machine with i GPUs or fewer means it needs more GPUs: a skip, not a failure."""
    if not REAL_GPU or result.returncode == 0:
        return
    m = re.search(r"gpu\((\d+)\) does not exist", (result.stdout or "") + (result.stderr or ""))
    if m and int(m.group(1)) >= real_gpu_count():
        _short_of_gpus(real_gpu_count())


def pytest_report_header(config):
    if not REAL_GPU:
        return "kiln GPU tests: on two simulated GPUs (KILN_GPU_SIM=2)"
    try:
        return f"kiln GPU tests: on the real GPUs (KILN_TEST_REAL_GPU=1): {real_gpu_count()}"
    except Exception as e:  # each GPU test reports it again
        return f"kiln GPU tests: on the real GPUs (KILN_TEST_REAL_GPU=1), which could not be counted: {e}"
