"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<reader>/valid-*): small files
made by kiln itself (export, save_parameters, nd.save, KILN_DUMP_IR, the kernel disk cache,
kiln-run's outputs) and by the tools that make kiln's inputs (NumPy's .npy, the Fashion-MNIST IDX
files cut to a few items). Inputs named regress-* (past findings) and edge-* are written by hand
and kept; this script only replaces valid-*. Run it from the repository root after make build:

    PYTHONPATH=build/python /usr/bin/python3 tests/fuzz/make_corpus.py [BUILD]
"""
import glob
import gzip
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
# The header fuzz_kernel_cache.cc expects (a real one holds a hash of codegen's sources).
KERNEL_HEADER = (b"kiln-kernel 2\nkind elementwise\ntoolchain kiln-codegen fuzz; llvm 19.1.7\ntarget x86_64 avx2\n"
                 b"form 0:0,0,0,0000000000000000,0,0,0,0;root 0\nsymbol kiln_ew_fuzz\n")

# Run in a child process per model: KILN_DUMP_IR prints every pass's graph to stderr.
MODELS = r'''
import sys
import kiln
from kiln import autograd, nd, nn

which, prefix = sys.argv[1], sys.argv[2]
if which == "mlp":
    net = nn.HybridSequential()
    net.add(nn.Dense(4, activation="relu"), nn.Dense(3))
    x = nd.ones((2, 5))
elif which == "conv":
    net = nn.HybridSequential()
    net.add(nn.Conv2D(2, kernel_size=3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.MaxPool2D(pool_size=2), nn.Flatten(), nn.Dense(2))
    x = nd.ones((1, 1, 4, 4))
else:
    class Two(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(2)

        def forward(self, x):
            h = self.dense(x)
            return h.softmax(), (h.sum(axis=1), nd.exp(h) * 2)
    net = Two()
    x = nd.ones((3, 2))
net.initialize()
net.hybridize()
with autograd.record():
    y = net(x)
    loss = y.sum() if isinstance(y, nd.NDArray) else y[0].sum()
loss.backward()
net(x)
net.export(prefix)
net.save_parameters(prefix + "-saved.params")
'''


def write(reader, name, data):
    os.makedirs(os.path.join(CORPUS, reader), exist_ok=True)
    with open(os.path.join(CORPUS, reader, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def graphs_from_dump(stderr):
    """The graphs KILN_DUMP_IR printed: the last text of each distinct length of notes."""
    texts, cur = [], None
    for line in stderr.splitlines(keepends=True):
        if line.startswith("# after"):
            cur = []
            texts.append(cur)
        elif cur is not None and (line.startswith("%") or line.startswith("return")):
            cur.append(line)
    return ["".join(t) for t in texts if t]


def main():
    for reader in ("symbol_json", "params", "ir_text", "npy", "idx", "kernel_cache"):
        for old in glob.glob(os.path.join(CORPUS, reader, "valid-*")):
            os.remove(old)
    tmp = tempfile.mkdtemp(prefix="kiln_corpus_")
    env = dict(os.environ, KILN_DUMP_IR="all", KILN_CACHE_DIR=os.path.join(tmp, "cache"))
    for which in ("mlp", "conv", "tuple"):
        prefix = os.path.join(tmp, which)
        run = subprocess.run([sys.executable, "-c", MODELS, which, prefix], env=env, capture_output=True,
                             text=True, check=True)
        write("symbol_json", f"valid-{which}.json", open(prefix + "-symbol.json", "rb").read())
        write("params", f"valid-{which}-export.params", open(prefix + "-0000.params", "rb").read())
        if which == "mlp":
            write("params", "valid-mlp-saved.params", open(prefix + "-saved.params", "rb").read())
        graphs = graphs_from_dump(run.stderr)
        # The first (traced), the last forward one (planning notes) and the longest (backward).
        picks = {graphs[0], max(graphs, key=len)}
        picks |= {g for g in graphs if "#group=" in g or "@arena+" in g}
        for i, g in enumerate(sorted(picks, key=len)[:3]):
            write("ir_text", f"valid-{which}-{i}.txt", g)
        # kiln-run on the export: its .npy outputs.
        np.save(prefix + "-x.npy", np.ones({"mlp": (2, 5), "conv": (1, 1, 4, 4), "tuple": (3, 2)}[which],
                                           dtype=np.float32))
        out = os.path.join(tmp, which + "-out")
        subprocess.run([os.path.join(BUILD, "tools", "kiln-run"), prefix + "-symbol.json", "--params",
                        prefix + "-0000.params", "--input", f"data={prefix}-x.npy", "--output-dir", out],
                       check=True, capture_output=True)
        for i, f in enumerate(sorted(glob.glob(os.path.join(out, "*.npy")))[:2]):
            write("npy", f"valid-kiln-run-{which}-{i}.npy", open(f, "rb").read())

    # nd.save: every dtype kiln stores, a 0-d and an empty tensor.
    import kiln
    from kiln import nd
    arrays = {"f32": nd.array([[1.5, -2.0]]), "f64": nd.array([1.0], dtype="float64"),
              "f16": nd.array([0.5, 2.0], dtype="float16"), "bf16": nd.array([3.0], dtype="bfloat16"),
              "i32": nd.array([1, -7], dtype="int32"), "i64": nd.array([2**40], dtype="int64"),
              "u8": nd.array([255, 0], dtype="uint8"), "bool": nd.array([True, False], dtype="bool"),
              "scalar": nd.array(4.0), "empty": nd.zeros((0, 3))}
    nd.save(os.path.join(tmp, "all.params"), arrays)
    write("params", "valid-nd-save-dtypes.params", open(os.path.join(tmp, "all.params"), "rb").read())
    nd.save(os.path.join(tmp, "none.params"), [])
    write("params", "valid-nd-save-empty.params", open(os.path.join(tmp, "none.params"), "rb").read())

    # .npy as NumPy writes it (the inputs of kiln-run): each dtype kiln-run takes, 0-d, empty.
    for name, a in [("f2", np.array([1, 2], "<f2")), ("f8-0d", np.array(3.5)), ("i4", np.arange(4, dtype="<i4")),
                    ("i8-2d", np.arange(6, dtype="<i8").reshape(2, 3)), ("u1", np.array([7], "u1")),
                    ("b1", np.array([True, False])), ("f4-empty", np.zeros((0, 2), "<f4"))]:
        b = io.BytesIO()
        np.save(b, a)
        write("npy", f"valid-numpy-{name}.npy", b.getvalue())
    b = io.BytesIO()
    np.lib.format.write_array(b, np.arange(3, dtype="<f4"), version=(2, 0))
    write("npy", "valid-numpy-v2.npy", b.getvalue())

    # IDX: the Fashion-MNIST test files cut to their first items, and each other element type.
    data = "/usr/share/datasets/fashion-mnist"
    labels = gzip.open(os.path.join(data, "t10k-labels-idx1-ubyte.gz")).read()
    images = gzip.open(os.path.join(data, "t10k-images-idx3-ubyte.gz")).read()
    write("idx", "valid-fashion-labels-8.idx", labels[:4] + struct.pack(">I", 8) + labels[8:16])
    write("idx", "valid-fashion-images-2.idx", images[:4] + struct.pack(">I", 2) + images[8:16] + images[16:16 + 2 * 784])
    for code, fmt, vals in [(0x09, "b", [-1, 2]), (0x0B, ">h", [-300, 7]), (0x0C, ">i", [1 << 20, -5]),
                            (0x0D, ">f", [1.5, -0.25]), (0x0E, ">d", [2.0, 1e300])]:
        body = b"".join(struct.pack(fmt, v) for v in vals)
        write("idx", f"valid-type-{code:02x}.idx", struct.pack(">II", 0x0000_0001 | code << 8, len(vals)) + body)

    # The kernel disk cache: kiln's own files from the runs above, under the fuzz target's header.
    files = sorted(glob.glob(os.path.join(tmp, "cache", "*.kobj")), key=os.path.getsize)[:2]
    for i, f in enumerate(files):
        blob = open(f, "rb").read()
        obj = blob.index(b"\nobject ") + 1
        write("kernel_cache", f"valid-{i}.kobj", KERNEL_HEADER + blob[obj:])
    shutil.rmtree(tmp)
    for reader in sorted(os.listdir(CORPUS)):
        files = glob.glob(os.path.join(CORPUS, reader, "*"))
        print(f"{reader}: {len(files)} files, {sum(map(os.path.getsize, files))} bytes")


if __name__ == "__main__":
    main()
