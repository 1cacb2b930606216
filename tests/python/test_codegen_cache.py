"""The fused-kernel disk cache across processes: a second process loads what the first compiled
(KILN_CACHE_DIR), gets the same numbers, and compiles nothing."""
import json
import os
import subprocess
import sys

import pytest

import kiln

pytestmark = pytest.mark.skipif(not kiln.codegen_stats()["available"],
                                reason="kiln was built without LLVM: no fused kernels, no kernel cache")

SCRIPT = r"""
import json, kiln
from kiln import nd, nn
nd.random.seed(3)
net = nn.HybridSequential()
net.add(nn.Dense(16, activation="relu", in_units=5), nn.Dense(4, in_units=16))
net.initialize()
net.hybridize()
x = nd.random.normal(0, 1, (8, 5))
y = nd.tanh(net(x) * 0.5 + 1)
print(json.dumps({"stats": kiln.codegen_stats(), "y": y.asnumpy().ravel().tolist()}))
"""


def _run(cache_dir):
    # Dense's bias and relu stay generated kernels (not oneDNN post-ops): there is something to cache.
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_DISABLE_PASS="epilogue")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_second_process_loads_kernels_from_disk(tmp_path):
    cold = _run(tmp_path)
    assert cold["stats"]["compiles"] > 0
    assert cold["stats"]["disk_writes"] == cold["stats"]["compiles"]
    assert cold["stats"]["disk_hits"] == 0
    assert cold["stats"]["cache_dir"] == str(tmp_path)
    assert len(list(tmp_path.glob("*.kobj"))) == cold["stats"]["compiles"]

    warm = _run(tmp_path)
    assert warm["stats"]["compiles"] == 0
    assert warm["stats"]["disk_hits"] == cold["stats"]["compiles"]
    assert warm["y"] == cold["y"]


def test_cache_off_writes_nothing(tmp_path):
    env = dict(os.environ, KILN_CACHE_DIR="off", KILN_DISABLE_PASS="epilogue")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout.splitlines()[-1])["stats"]
    assert stats["cache_dir"] == "" and stats["disk_writes"] == 0 and stats["compiles"] > 0
