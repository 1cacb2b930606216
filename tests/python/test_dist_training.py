"""Data-parallel training under `mpirun --oversubscribe -np 2`: the same seed gives the same
parameters after several steps as one process training on the whole batches (to rounding), with
the unchanged Trainer code (kiln.distributed.init() makes its kvstore 'dist_sync')."""
import os
import sys

import numpy as np
import pytest

from test_distributed import SCRIPTS, needs_mpirun, run

sys.path.insert(0, SCRIPTS)
import train_equal  # noqa: E402  (the script's own training function is the reference)


@needs_mpirun
@pytest.mark.parametrize("hybridize", [False, True])
def test_two_processes_equal_one_process_on_the_whole_batch(tmp_path, hybridize):
    out = tmp_path / "rank0.npz"
    rc, log, _ = run("train_equal.py", out, *(["--hybridize"] if hybridize else []))
    assert rc == 0, log
    assert "RESULT trained 0 2" in log and "RESULT trained 1 2" in log, log
    X, y = train_equal.batches()
    import kiln
    reference = train_equal.train([kiln.cpu(0)], X, y, hybridize)
    got = np.load(out)
    assert len(got.files) == len(reference)
    for i, ref in enumerate(reference):
        np.testing.assert_allclose(got[f"arr_{i}"], ref, rtol=2e-5, atol=2e-6)


@needs_mpirun
@pytest.mark.parametrize("hybridize", [False, True])
def test_two_processes_with_a_simulated_gpu_each_equal_one_process(tmp_path, monkeypatch, hybridize):
    monkeypatch.setenv("KILN_GPU_SIM", "1")  # GPU arrays go through MPI via host copies
    out = tmp_path / "rank0.npz"
    rc, log, _ = run("train_equal.py", out, "--gpu", *(["--hybridize"] if hybridize else []), timeout=180)
    assert rc == 0, log
    assert "RESULT trained 0 2" in log and "RESULT trained 1 2" in log, log
    X, y = train_equal.batches()
    import kiln
    reference = train_equal.train([kiln.cpu(0)], X, y, hybridize)
    got = np.load(out)
    for i, ref in enumerate(reference):
        np.testing.assert_allclose(got[f"arr_{i}"], ref, rtol=2e-5, atol=2e-6)
