"""Hybrid programming (d2l.ai, "Hybrid Programming"), with kiln.

  1. The 512-256-128-2 MLP, timed over N calls eagerly and after hybridize() (kiln.waitall()
     makes each timing include the work, not just its queueing); the ratio is printed.
  2. net.export('mlp') writes mlp-symbol.json and mlp-0000.params; nn.SymbolBlock.imports loads
     them back and gives the same output.
  3. The HybridNet of the book prints inside forward: it prints on the tracing call only, since
     later calls run the compiled graph and no Python.

Run: python3 examples/python/hybridize_mlp.py [--small]   (--small: 100 calls, files in a temp dir)
"""
import argparse
import os
import tempfile
import time

import numpy as np

import kiln
from kiln import nd, nn


def get_net():
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def benchmark(net, x, calls):
    net(x)  # the first call completes deferred shapes / traces: not what we time
    net(x)
    kiln.waitall()
    start = time.perf_counter()
    for _ in range(calls):
        net(x)
    kiln.waitall()
    return time.perf_counter() - start


class HybridNet(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Dense(4)
        self.output = nn.Dense(2)

    def forward(self, x):
        print("module:", "kiln.sym (tracing)" if kiln._C.tracing() else "kiln.nd (eager)")
        print("x:", x.shape, "symbolic" if kiln._C.is_symbolic(x) else "concrete")
        x = nd.relu(self.hidden(x))
        return self.output(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="100 calls, files in a temp dir (CI)")
    args = parser.parse_args()
    calls = 100 if args.small else 1000
    outdir = tempfile.mkdtemp(prefix="kiln-hybridize-") if args.small else "."

    print("1. the MLP, eager against hybridized")
    x = nd.random.normal(shape=(1, 512))
    net = get_net()
    eager = benchmark(net, x, calls)
    net.hybridize()
    hybrid = benchmark(net, x, calls)
    print(f"   eager:      {calls} calls in {eager:.4f} s")
    print(f"   hybridized: {calls} calls in {hybrid:.4f} s  ({eager / hybrid:.1f}x the eager speed)")

    print("2. export and import")
    sym_file, params_file = net.export(os.path.join(outdir, "mlp"))
    print(f"   wrote {os.path.basename(sym_file)} and {os.path.basename(params_file)}")
    net2 = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    same = np.array_equal(net(x).asnumpy(), net2(x).asnumpy())
    print(f"   imported block gives the same output: {same}")
    if not same:
        raise SystemExit("the imported block's output differs")

    print("3. HybridNet prints on the tracing call only")
    hnet = HybridNet()
    hnet.initialize()
    y = nd.random.normal(shape=(1, 3))
    print("   eager call:")
    hnet(y)
    hnet.hybridize()
    for i in range(3):
        print(f"   hybridized call {i + 1}:")
        hnet(y)
    kiln.waitall()


if __name__ == "__main__":
    main()
