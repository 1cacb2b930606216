"""Files that survive (issue 17): a process killed with SIGKILL at random instants of
save_parameters, export, or a kernel-cache write leaves the old file or the whole new one, and its
temporaries do not pile up; a full disk (RLIMIT_FSIZE, write() failing with EFBIG) raises
kiln.FileError naming the file and the bytes, and keeps the old files.

The writers run in children of one "fork server" (a process that imported kiln and built both
versions once, with the synchronous engine and one thread, so that a fork copies a complete
process): each round forks a writer that saves in a loop, the test kills it after a random delay,
and checks what is on disk. Forking keeps dozens of kills within a few seconds.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kiln
from kiln import _C, nd, nn
from kiln.nn import serialization

TEMP_SUFFIX = ".kiln.tmp"  # runtime/atomic_file.cc names its temporaries .NAME.HOST-PID-N.kiln.tmp

SERVER = r"""
import json, os, sys, time
import kiln
from kiln import nd, nn

mode, path = sys.argv[1], sys.argv[2]
OPS = [nd.tanh, nd.sigmoid, nd.exp, nd.relu]


def make(version):
    # Two versions that differ in every value (100 * version + parameter index) and, for export,
    # in the parameters' shapes, so that a pair of files from different versions does not fit.
    width = 768 if mode == "export" and version else 1024
    net = nn.HybridSequential()
    net.add(nn.Dense(width, in_units=1024), nn.Dense(8, in_units=width))
    net.initialize()
    for i, p in enumerate(net.collect_params().values()):
        p.set_data(nd.full(p.shape, 100.0 * version + i))
    if mode == "export":
        net.hybridize()
        net(nd.ones((2, 1024)))
    return net


class Chain(nn.HybridBlock):
    # Kernel n of the cache: a fused chain of unary ops spelled by the base-4 digits of n + 4.
    def __init__(self, n):
        super().__init__()
        self.ops, n = [], n + 4
        while n:
            self.ops.append(OPS[n % 4])
            n //= 4

    def forward(self, x):
        for op in self.ops:
            x = op(x)
        return x * 0.5 + 1


def compile_kernel(n):
    net = Chain(n)
    net.hybridize()
    net(nd.ones((64,))).wait_to_read()


def writer(nets, progress):
    n = 1
    while True:
        if mode == "cache":
            compile_kernel(n)
        else:
            save(nets[n % 2])
        os.write(progress, b"%d\n" % n)
        n += 1


def save(net):
    net.save_parameters(path) if mode == "params" else net.export(path)


# The time one save (or one kernel's compile and store) takes here, so that the test's random
# delays span a few of them however loaded the machine is. The file ends as version 0.
nets = [make(0), make(1)] if mode != "cache" else None
t0 = time.perf_counter()
if mode == "cache":
    compile_kernel(0)  # not one of the writers' kernels (they start at 1)
else:
    save(nets[1])
    save(nets[0])
print("ready", (time.perf_counter() - t0) / (1 if mode == "cache" else 2), flush=True)
for line in sys.stdin:
    if line.startswith("replay"):  # the cache: compile kernels 1..N again, in this process
        before = kiln.codegen_stats()
        for n in range(1, int(line.split()[1]) + 1):
            compile_kernel(n)
        print(json.dumps([before, kiln.codegen_stats()]), flush=True)
        continue
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            writer(nets, w)
        except BaseException as e:
            print("writer failed:", repr(e), file=sys.stderr, flush=True)
        os._exit(3)
    os.close(w)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        done = f.read().split()
    print(status, done[-1] if done else 0, flush=True)
"""


class Server:
    """The fork server for `mode` ('params', 'export' or 'cache') writing `path`."""

    def __init__(self, mode, path, cache_dir):
        env = dict(os.environ, KILN_ENGINE="naive", KILN_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   KILN_CACHE_DIR=str(cache_dir), KILN_DISABLE_PASS="epilogue")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(path)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready, seconds = self._line().split()
        assert ready == "ready"
        self.seconds = float(seconds)  # one save or one compile, measured by the server

    def _line(self):
        line = self.proc.stdout.readline().strip()
        assert line, f"the fork server died (exit {self.proc.wait(timeout=60)})"
        return line

    def kill_writer(self, delay):
        """Forks a writer, kills it with SIGKILL after `delay` seconds; returns how many saves it
        completed."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        pid = int(self._line())
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        status, done = map(int, self._line().split())
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
            f"the writer stopped by itself (status {status}) before it was killed"
        return done

    def replay(self, n):
        self.proc.stdin.write(f"replay {n}\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def _temporaries(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(TEMP_SUFFIX))


def _version(arrays, width=1024):
    """0 or 1: the version the server's make() saved, checked value by value; None if the arrays
    are no complete version."""
    shapes = [(width, 1024), (width,), (8, width), (8,)]
    if [tuple(a.shape) for a in arrays.values()] != shapes:
        return None
    values = [a.asnumpy() for a in arrays.values()]
    version = int(values[0].flat[0]) // 100
    ok = all(np.all(v == 100.0 * version + i) for i, v in enumerate(values))
    return version if ok and version in (0, 1) else None


def _delays(n, server, saves):
    """`n` random delays, each up to the time of `saves` saves (at least 50 ms)."""
    rng = random.Random(17)
    return [rng.uniform(0.0, max(saves * server.seconds, 0.05)) for _ in range(n)]


def test_save_parameters_killed_at_random_leaves_a_whole_version(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    path = out / "net.params"
    server = Server("params", path, tmp_path / "cache")
    seen, mid_write, saves, kills = set(), 0, 0, 0
    try:
        # 24 kills, more (up to 96) until one landed inside a write: where the rest of a save is
        # slow (under ASan) fewer random kills land in the write itself.
        for i, delay in enumerate(_delays(96, server, 3)):
            if i >= 24 and mid_write > 0 and saves > 0 and seen == {0, 1}:
                break
            saves += server.kill_writer(delay)
            kills += 1
            temps = _temporaries(out)
            assert len(temps) <= 1, f"temporaries pile up: {temps}"
            mid_write += bool(temps)
            arrays, metadata = serialization.load_arrays(path)
            version = _version(arrays)
            assert version is not None, "a torn or mixed parameter file"
            assert metadata == {"format": "kiln"}
            seen.add(version)
    finally:
        server.close()
    # The kills landed both inside writes (a temporary was left) and between them.
    print(f"save_parameters: {server.seconds * 1e3:.0f} ms per save; {kills} kills, {mid_write} inside a "
          f"write, {saves} saves completed")
    assert saves > 0 and mid_write > 0 and seen == {0, 1}, (saves, mid_write, seen)
    # The next save removes what the killed writers left.
    net = nn.Dense(2, in_units=2)
    net.initialize()
    net.save_parameters(path)
    assert os.listdir(out) == ["net.params"]


def test_export_killed_at_random_leaves_whole_files_and_a_pair_that_loads_or_says_why(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    prefix = out / "net"
    symbol_file, params_file = f"{prefix}-symbol.json", f"{prefix}-0000.params"
    server = Server("export", prefix, tmp_path / "cache")
    pairs, mismatched, mid_write, kills = set(), 0, 0, 0
    try:
        # 16 kills, more (up to 64) until one landed inside a write and both versions were seen
        for i, delay in enumerate(_delays(64, server, 3)):
            if i >= 16 and mid_write > 0 and {(1024, 0), (768, 1)} <= pairs:
                break
            server.kill_writer(delay)
            kills += 1
            temps = _temporaries(out)
            assert len(temps) <= 2, f"temporaries pile up: {temps}"  # one per file at most
            mid_write += bool(temps)
            graph = _C.load_graph(symbol_file)  # whole: it parses and checks
            width = graph.param_types[0][0][0]
            assert width in (1024, 768)
            arrays, metadata = serialization.load_arrays(params_file)
            version = _version(arrays, 1024) if len(arrays) and arrays["0.weight"].shape[0] == 1024 \
                else _version(arrays, 768)
            assert version is not None, "a torn or mixed params file"
            pairs.add((width, version))
            if (width == 768) != (version == 1):  # killed between the two renames
                mismatched += 1
                with pytest.raises(kiln.FormatError, match="does not fit its graph"):
                    nn.SymbolBlock.imports(symbol_file, ["data"], params_file)
    finally:
        server.close()
    print(f"export: {server.seconds * 1e3:.0f} ms per export; {kills} kills, {mid_write} inside a write, "
          f"{mismatched} between the two renames")
    assert mid_write > 0 and {(1024, 0), (768, 1)} <= pairs, (mid_write, pairs)
    block = nn.SymbolBlock.imports(symbol_file, ["data"], params_file) if not mismatched else None
    if block is not None:
        y = block(nd.ones((2, 1024))).asnumpy()
        assert y.shape == (2, 8)


@pytest.mark.skipif(not kiln.codegen_stats()["available"], reason="built without LLVM: no kernel cache")
def test_kernel_cache_writer_killed_at_random_leaves_whole_files(tmp_path):
    cache = tmp_path / "cache"
    server = Server("cache", tmp_path / "unused", cache)
    done, mid_write = 0, 0
    try:
        for delay in _delays(12, server, 8):
            done = max(done, server.kill_writer(delay))
            temps = _temporaries(cache)
            assert len(temps) <= 1, f"temporaries pile up: {temps}"
            mid_write += bool(temps)
            for name in os.listdir(cache):
                if name.endswith(".kobj"):
                    data = (cache / name).read_bytes()
                    head, _, artifact = data.partition(b"\nobject ")
                    size, _, artifact = artifact.partition(b"\n")
                    assert head.startswith(b"kiln-kernel 2\n") and int(size.split()[0]) == len(artifact), \
                        f"a torn cache file {name}"
        assert done > 0
        # Every kernel a killed writer finished is on disk, whole: compiling them again in a
        # process with nothing in memory reads every one back and builds none.
        before, after = server.replay(done)
    finally:
        server.close()
    compiled = after["compiles"] - before["compiles"]
    read = after["disk_hits"] - before["disk_hits"]
    print(f"kernel cache: {server.seconds * 1e3:.0f} ms for the first kernel; 12 kills, {mid_write} inside a "
          f"write, {done} kernels written and read back")
    assert compiled == 0 and read >= done, (compiled, read, done)


FULL_DISK = r"""
import json, os, resource, signal, sys
# A full disk, as `ulimit -f` makes one: files may not grow past 64 KiB, and write() fails with
# EFBIG (SIGXFSZ ignored, else it would kill the process).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
import kiln
from kiln import autograd, nd, nn
d = sys.argv[1]
net = nn.Dense(64, in_units=1024)   # 256 KiB of weights: more than the 64 KiB the files may have
net.initialize()
net.hybridize()
with autograd.record():
    loss = net(nd.ones((2, 1024))).sum()
loss.backward()
trainer = kiln.Trainer(net.collect_params(), "adam")
trainer.step(2)
out = {}
for what, save in [("params", lambda: net.save_parameters(os.path.join(d, "net.params"))),
                   ("export", lambda: net.export(os.path.join(d, "net"))),
                   ("states", lambda: trainer.save_states(os.path.join(d, "net.states")))]:
    try:
        save()
        out[what] = None
    except kiln.FileError as e:
        out[what] = [str(e), isinstance(e, OSError), isinstance(e, kiln.FormatError)]
print(json.dumps(out))
"""


def test_full_disk_raises_file_error_and_keeps_the_old_files(tmp_path):
    old = {"net.params": b"old params", "net-symbol.json": b"old symbol", "net-0000.params": b"old pair",
           "net.states": b"old states"}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, KILN_CACHE_DIR="off"))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    for what, name in [("params", "net.params"), ("export", "net-0000.params"), ("states", "net.states")]:
        assert result[what] is not None, f"{what}: no error on a full disk"
        msg, is_os_error, is_format_error = result[what]
        assert is_os_error and is_format_error
        path = str(tmp_path / name)
        assert f"cannot write '{path}': writing " in msg
        assert "bytes were written) failed: File too large; the file size limit was reached" in msg
        assert f"'{path}' is unchanged and no temporary file was left" in msg
    # The export's pair: the graph fitted, the params did not, and neither was replaced.
    assert f"none of '{tmp_path / 'net-symbol.json'}', '{tmp_path / 'net-0000.params'}' was changed" \
        in result["export"][0]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == old


def test_optimizer_states_are_written_atomically(tmp_path):
    net = nn.Dense(3, in_units=2)
    net.initialize()
    trainer = kiln.Trainer(net.collect_params(), "adam")
    with kiln.autograd.record():
        loss = net(nd.ones((1, 2))).sum()
    loss.backward()
    trainer.step(1)
    path = tmp_path / "t.states"
    trainer.save_states(path)
    trainer.load_states(path)
    with pytest.raises(kiln.FileError, match="does not exist: create it first") as e:
        trainer.save_states(tmp_path / "missing" / "t.states")
    assert isinstance(e.value, OSError)
    assert sorted(os.listdir(tmp_path)) == ["t.states"]
