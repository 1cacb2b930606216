"""The README's Python examples, verbatim, so that CI runs them (it ignores --small: they are small
already). Files are written into a temporary directory."""
import os
import tempfile

os.chdir(tempfile.mkdtemp(prefix="kiln_readme_"))
import kiln
from kiln import nd, nn, autograd

net = nn.HybridSequential()
net.add(nn.Dense(256, activation="relu"), nn.Dense(10))
net.initialize(kiln.init.Xavier())               # shapes are inferred on the first call
loss = kiln.loss.SoftmaxCrossEntropyLoss()
trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})

X = nd.random.normal(shape=(64, 20))
y = X[:, :10].argmax(axis=1)                     # a learnable toy target
for epoch in range(100):
    with autograd.record():
        l = loss(net(X), y)                      # queued on the engine, returns at once
    l.backward()
    trainer.step(X.shape[0])                     # one fused update for all parameters
print(l.mean().item())                           # a sync point
net.save_parameters("net.params")                # safetensors layout, written atomically

net.hybridize()                                  # the next call traces; later calls run compiled
y = net(X)                                       # one engine task per call, no Python per op
net.export("mlp")                                # mlp-symbol.json + mlp-0000.params
net2 = nn.SymbolBlock.imports("mlp-symbol.json", ["data"], "mlp-0000.params")
y5 = net2(X[:5])                                 # other batch sizes too: re-shaped, compiled once per shape
assert y5.shape == (5, 10) and (y5 - net(X)[:5]).abs().max().item() < 1e-5
print("imported block gives the same output:", bool((net2(X) - net(X)).abs().max().item() < 1e-5))
