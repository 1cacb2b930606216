"""The kernel disk cache across processes (KILN_CACHE_DIR): a second process loads what the first
compiled, elementwise and row kernels alike, gets the same numbers and compiles nothing; corrupt
or truncated files are compiled again and rewritten; processes writing the same directory at
once leave a valid cache."""
import json
import os
import subprocess
import sys

import pytest

import kiln

pytestmark = pytest.mark.skipif(not kiln.codegen_stats()["available"],
                                reason="kiln was built without LLVM: no fused kernels, no kernel cache")

# A graph with one fused elementwise kernel (Dense's bias and relu, with epilogues off) and one
# row kernel (log_softmax over the rows, fed by tanh(. * 0.5 + 1)).
SCRIPT = r"""
import json, kiln
from kiln import nd, nn
nd.random.seed(3)

class Net(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.body = nn.HybridSequential()
        self.body.add(nn.Dense(16, activation="relu", in_units=5), nn.Dense(4, in_units=16))

    def forward(self, x):
        return nd.log_softmax(nd.tanh(self.body(x) * 0.5 + 1))

net = Net()
net.initialize()
net.hybridize()
x = nd.random.normal(0, 1, (8, 5))
y = net(x)
print(json.dumps({"stats": kiln.codegen_stats(), "y": y.asnumpy().ravel().tolist()}))
"""

KINDS = ("elementwise", "row")


def _env(cache_dir):
    # Dense's bias and relu stay generated kernels (not oneDNN post-ops): there is something to cache.
    return dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_DISABLE_PASS="epilogue")


def _result(out):
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _run(cache_dir):
    return _result(subprocess.run([sys.executable, "-c", SCRIPT], env=_env(cache_dir), capture_output=True,
                                  text=True, timeout=120))


def _cold(cache_dir):
    cold = _run(cache_dir)
    for kind in KINDS:
        assert cold["stats"]["kinds"][kind]["compiles"] >= 1, kind
    return cold


def test_second_process_loads_both_kinds_from_disk(tmp_path):
    cold = _cold(tmp_path)
    stats = cold["stats"]
    assert stats["compiles"] == sum(k["compiles"] for k in stats["kinds"].values())
    assert stats["disk_writes"] == stats["compiles"]
    assert stats["disk_hits"] == 0
    assert stats["cache_dir"] == str(tmp_path)
    assert stats["toolchain"].startswith("kiln-codegen ") and "llvm " in stats["toolchain"]
    assert len(list(tmp_path.glob("*.kobj"))) == stats["compiles"]

    warm = _run(tmp_path)
    assert warm["stats"]["compiles"] == 0
    for kind in KINDS:
        assert warm["stats"]["kinds"][kind]["compiles"] == 0, kind
        assert warm["stats"]["kinds"][kind]["disk_hits"] == cold["stats"]["kinds"][kind]["compiles"], kind
    assert warm["y"] == cold["y"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_damaged_file_is_compiled_again_and_rewritten(tmp_path, damage):
    cold = _cold(tmp_path)
    files = sorted(tmp_path.glob("*.kobj"))
    assert len(files) == cold["stats"]["compiles"]
    for f in files:
        data = f.read_bytes()
        if damage == "truncate":  # a writer killed half way (not possible through rename; a disk fault)
            data = data[:len(data) // 2]
        elif damage == "flip":  # one byte of the object changed: the checksum fails
            data = data[:-100] + bytes([data[-100] ^ 0x5A]) + data[-99:]
        elif damage == "garbage":
            data = b"\x00\xff not a kernel file \n" * 10
        else:
            data = b""
        f.write_bytes(data)
    again = _run(tmp_path)
    assert again["stats"]["compiles"] == cold["stats"]["compiles"]  # nothing was loaded from the damaged files
    assert again["stats"]["disk_hits"] == 0
    assert again["y"] == cold["y"]
    warm = _run(tmp_path)  # the files were rewritten whole
    assert warm["stats"]["compiles"] == 0
    assert warm["stats"]["disk_hits"] == cold["stats"]["compiles"]


def test_processes_writing_at_once_leave_a_valid_cache(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=_env(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        results.append(_result(subprocess.CompletedProcess(p.args, p.returncode, out, err)))
    assert all(r["y"] == results[0]["y"] for r in results)
    # Every kernel is in the directory once, complete; no temporary file is left behind.
    names = sorted(p.name for p in tmp_path.iterdir())
    assert all(n.endswith(".kobj") for n in names), names
    kernels = max(r["stats"]["compiles"] + r["stats"]["disk_hits"] for r in results)
    assert len(names) == kernels
    warm = _run(tmp_path)
    assert warm["stats"]["compiles"] == 0
    assert warm["stats"]["disk_hits"] == kernels
    assert warm["y"] == results[0]["y"]


def test_cache_off_writes_nothing(tmp_path):
    env = dict(_env(tmp_path), KILN_CACHE_DIR="off")
    stats = _result(subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                                   timeout=120))["stats"]
    assert stats["cache_dir"] == "" and stats["disk_writes"] == 0 and stats["compiles"] > 0
    assert list(tmp_path.iterdir()) == []
