"""The MXNet edition of d2l.ai (d2lzh), chapter "Computational Performance", run on kiln with only
its import lines changed (`import mxnet as mx` -> `import kiln as mx`, `from mxnet import ...` ->
`from kiln import ...`). The code below is the chapter's own, at CI sizes; each test asserts what
the chapter shows its reader (same numbers hybridized, prints on the tracing call only, the copies
on every GPU equal, training that learns). The GPU tests run in a fresh interpreter on two simulated
GPUs (KILN_GPU_SIM=2, see test_gpu.py); the same code runs on real GPUs.
"""
import os
import textwrap

import numpy as np

from test_gpu import run_sim

# d2lzh's helpers the chapter calls (d2l.Benchmark, d2l.sgd, d2l.Residual, load_data_fashion_mnist,
# evaluate_accuracy, _get_batch), as the book defines them, at CI sizes.
D2LZH = '''
import sys, time
import kiln as mx
from kiln import autograd, gluon, init, nd
from kiln.gluon import data as gdata, loss as gloss, nn, utils as gutils


class Benchmark():
    def __init__(self, prefix=None):
        self.prefix = prefix + ' ' if prefix else ''

    def __enter__(self):
        self.start = time.time()

    def __exit__(self, *args):
        print('%stime: %.4f sec' % (self.prefix, time.time() - self.start))


def sgd(params, lr, batch_size):
    for param in params:
        param[:] = param - lr * param.grad / batch_size


def load_data_fashion_mnist(batch_size, resize=None, n_train=512, n_test=256):
    transformer = []
    if resize:
        transformer += [gdata.vision.transforms.Resize(resize)]
    transformer += [gdata.vision.transforms.ToTensor()]
    transformer = gdata.vision.transforms.Compose(transformer)
    mnist_train = gdata.vision.FashionMNIST(train=True)
    mnist_test = gdata.vision.FashionMNIST(train=False)
    # CI size: the first n_train / n_test images (the book uses all 60000 / 10000)
    mnist_train = gdata.SimpleDataset([mnist_train[i] for i in range(n_train)])
    mnist_test = gdata.SimpleDataset([mnist_test[i] for i in range(n_test)])
    num_workers = 0 if sys.platform.startswith('win32') else 4
    train_iter = gdata.DataLoader(mnist_train.transform_first(transformer), batch_size, shuffle=False,
                                  num_workers=num_workers)
    test_iter = gdata.DataLoader(mnist_test.transform_first(transformer), batch_size, shuffle=False,
                                 num_workers=num_workers)
    return train_iter, test_iter


def _get_batch(batch, ctx):
    features, labels = batch
    if labels.dtype != features.dtype:
        labels = labels.astype(features.dtype)
    return (gutils.split_and_load(features, ctx), gutils.split_and_load(labels, ctx), features.shape[0])


def evaluate_accuracy(data_iter, net, ctx=[mx.cpu()]):
    if isinstance(ctx, mx.Context):
        ctx = [ctx]
    acc_sum, n = nd.array([0]), 0
    for batch in data_iter:
        features, labels, _ = _get_batch(batch, ctx)
        for X, y in zip(features, labels):
            y = y.astype('float32')
            acc_sum += (net(X).argmax(axis=1) == y).sum().copyto(mx.cpu())
            n += y.size
        acc_sum.wait_to_read()
    return acc_sum.asscalar() / n


class Residual(nn.Block):
    def __init__(self, num_channels, use_1x1conv=False, strides=1, **kwargs):
        super(Residual, self).__init__(**kwargs)
        self.conv1 = nn.Conv2D(num_channels, kernel_size=3, padding=1, strides=strides)
        self.conv2 = nn.Conv2D(num_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2D(num_channels, kernel_size=1, strides=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm()
        self.bn2 = nn.BatchNorm()

    def forward(self, X):
        Y = nd.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return nd.relu(Y + X)
'''


def _run_here(code):
    """Runs the chapter's code in this interpreter (CPU) and returns its globals."""
    scope = {"__name__": "d2l_chapter"}
    exec(compile(textwrap.dedent(D2LZH) + textwrap.dedent(code), "<d2l chapter>", "exec"), scope)
    return scope


# ---- 12.1 Hybrid programming (hybridize.md) -----------------------------------------------------

HYBRIDIZE = '''
from kiln import nd, sym
from kiln.gluon import nn
import time

def get_net():
    net = nn.HybridSequential()  # create a HybridSequential instance
    net.add(nn.Dense(256, activation='relu'),
            nn.Dense(128, activation='relu'),
            nn.Dense(2))
    net.initialize()
    return net

x = nd.random.normal(shape=(1, 512))
net = get_net()
eager = net(x)

net.hybridize()
hybrid = net(x)

def benchmark(net, x):
    start = time.time()
    for i in range(100):
        _ = net(x)
    nd.waitall()  # wait for all computation to finish, for timing
    return time.time() - start

net = get_net()
print('before hybridizing: %.4f sec' % (benchmark(net, x)))
net.hybridize()
print('after hybridizing: %.4f sec' % (benchmark(net, x)))

net.export(EXPORT_PREFIX)

x_sym = sym.var('data')
y_sym = net(x_sym)
'''


def test_hybridize_mlp_exports_and_gives_the_eager_numbers(tmp_path, capsys):
    prefix = str(tmp_path / "my_mlp")
    g = _run_here(f"EXPORT_PREFIX = {prefix!r}\n" + HYBRIDIZE)
    np.testing.assert_allclose(g["hybrid"].asnumpy(), g["eager"].asnumpy(), rtol=1e-5, atol=1e-6)
    out = capsys.readouterr().out
    assert "before hybridizing" in out and "after hybridizing" in out
    assert os.path.exists(prefix + "-symbol.json") and os.path.exists(prefix + "-0000.params")

    # net(sym.var('data')) is a Symbol, as in MXNet; it lists the graph's arguments.
    y_sym = g["y_sym"]
    assert type(y_sym).__name__ == "Symbol"
    args = y_sym.list_arguments()
    assert args[0] == "data" and len(args) == 7, args
    assert len(y_sym.list_outputs()) == 1
    arg_shapes, out_shapes, _ = y_sym.infer_shape(data=(3, 512))
    assert arg_shapes[0] == (3, 512) and out_shapes == [(3, 2)]

    # The exported model loads back through gluon's SymbolBlock and gives the same numbers.
    from kiln import gluon, nd
    net2 = gluon.nn.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    x = g["x"]
    np.testing.assert_allclose(net2(x).asnumpy(), g["net"](x).asnumpy(), rtol=1e-5, atol=1e-6)


HYBRID_FORWARD = '''
from kiln import nd
from kiln.gluon import nn

class HybridNet(nn.HybridBlock):
    def __init__(self, **kwargs):
        super(HybridNet, self).__init__(**kwargs)
        self.hidden = nn.Dense(10)
        self.output = nn.Dense(2)

    def hybrid_forward(self, F, x):
        print('F: ', F)
        print('x: ', x)
        x = F.relu(self.hidden(x))
        print('hidden: ', x)
        return self.output(x)

net = HybridNet()
net.initialize()
x = nd.random.normal(shape=(1, 4))
'''


def test_hybrid_forward_prints_on_the_tracing_call_only(capsys):
    g = _run_here(HYBRID_FORWARD)
    net, x = g["net"], g["x"]
    eager = net(x)
    out = capsys.readouterr().out
    assert out.count("F: ") == 1 and "kiln.nd" in out      # eager: F is the nd module
    net.hybridize()
    hybrid = net(x)                                           # traced: prints once, F is sym
    out = capsys.readouterr().out
    assert out.count("F: ") == 1 and "kiln.sym" in out, out
    again = net(x)                                            # compiled: runs without Python
    assert capsys.readouterr().out == ""
    np.testing.assert_allclose(hybrid.asnumpy(), eager.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again.asnumpy(), eager.asnumpy(), rtol=1e-5, atol=1e-6)

    # Hybridized before its first call (shapes still deferred): that call traces, and prints once.
    net2 = g["HybridNet"]()
    net2.initialize()
    net2.hybridize()
    first = net2(x)
    out = capsys.readouterr().out
    assert out.count("F: ") == 1 and "kiln.sym" in out, out
    second = net2(x)
    assert capsys.readouterr().out == ""
    np.testing.assert_array_equal(second.asnumpy(), first.asnumpy())
    assert net2.hidden.weight.shape == (10, 4)


# ---- 12.2 Asynchronous computation (async-computation.md) ---------------------------------------

ASYNC = '''
from kiln import autograd, gluon, nd
from kiln.gluon import loss as gloss, nn
import os, subprocess, time

with Benchmark('Workloads are queued.'):
    x = nd.random.uniform(shape=(200, 200))
    y = nd.dot(x, x).sum()

with Benchmark('Workloads are finished.'):
    print('sum =', y)

with Benchmark():
    y = nd.dot(x, x)
    y.wait_to_read()

with Benchmark():
    y = nd.dot(x, x)
    z = nd.dot(x, x)
    nd.waitall()

with Benchmark():
    y = nd.dot(x, x)
    y.asnumpy()

with Benchmark():
    y = nd.dot(x, x)
    norm = y.norm().asscalar()

with Benchmark('synchronous.'):
    for _ in range(100):
        y = x + 1
        y.wait_to_read()

with Benchmark('asynchronous.'):
    for _ in range(100):
        y = x + 1
    nd.waitall()
y_async = y

def data_iter():
    start = time.time()
    num_batches, batch_size = 10, 64
    for i in range(num_batches):
        X = nd.random.normal(shape=(batch_size, 512))
        y = nd.ones((batch_size,))
        yield X, y
        if (i + 1) % 5 == 0:
            print('batch %d, time %f sec' % (i + 1, time.time() - start))

net = nn.Sequential()
net.add(nn.Dense(256, activation='relu'),
        nn.Dense(64, activation='relu'),
        nn.Dense(1))
net.initialize()
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.005})
loss = gloss.L2Loss()

for X, y in data_iter():
    break
loss(y, net(X)).wait_to_read()

losses = []
for X, y in data_iter():
    with autograd.record():
        l = loss(y, net(X))
    losses.append(l.mean().asscalar())
    l.backward()
    trainer.step(X.shape[0])
nd.waitall()
'''


def test_async_benchmarks_wait_and_train(capsys):
    g = _run_here(ASYNC)
    x = g["x"].asnumpy().astype(np.float64)
    out = capsys.readouterr().out
    assert "Workloads are queued." in out and "sum =" in out and "asynchronous. time" in out
    np.testing.assert_allclose(g["norm"], np.linalg.norm(x @ x), rtol=1e-4)
    assert np.ndim(g["norm"]) == 0 and isinstance(float(g["norm"]), float)  # a NumPy scalar, as MXNet
    np.testing.assert_allclose(g["y_async"].asnumpy(), x + 1, rtol=1e-6)
    losses = g["losses"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


# ---- 12.3 Automatic parallelism (auto-parallelism.md), on two simulated GPUs --------------------

def test_auto_parallelism_cpu_and_gpu():
    out = run_sim(D2LZH + '''
import kiln as mx
from kiln import nd
import numpy as np

def run(x):
    return [nd.dot(x, x) for _ in range(10)]

x_cpu = nd.random.uniform(shape=(200, 200))
x_gpu = nd.random.uniform(shape=(300, 300), ctx=mx.gpu(0))
assert x_gpu.context == mx.gpu(0) and x_cpu.context == mx.cpu()

run(x_cpu)  # warm-up begins
run(x_gpu)
nd.waitall()  # warm-up ends

with Benchmark('Run on both CPU and GPU in parallel.'):
    a = run(x_cpu)
    b = run(x_gpu)
    nd.waitall()

def copy_to_cpu(x):
    return [y.copyto(mx.cpu()) for y in x]

with Benchmark('Run on GPU.'):
    y = run(x_gpu)
    nd.waitall()

with Benchmark('Then copy to CPU.'):
    z = copy_to_cpu(y)
    nd.waitall()

g = x_gpu.asnumpy()
assert all(t.context == mx.cpu() for t in z)
np.testing.assert_allclose(z[3].asnumpy(), g @ g, rtol=1e-4)
c = x_cpu.asnumpy()
np.testing.assert_allclose(a[9].asnumpy(), c @ c, rtol=1e-4)
print('ok')
''')
    assert "Run on both CPU and GPU in parallel. time" in out and "ok" in out


# ---- 12.5 Multi-GPU computation from scratch (multiple-gpus.md), on two simulated GPUs ----------

SCRATCH = '''
import numpy as np
import kiln as mx
from kiln import autograd, nd
from kiln.gluon import loss as gloss
import time

nd.random.seed(42)
# initialize the model parameters
scale = 0.01
W1 = nd.random.normal(scale=scale, shape=(20, 1, 3, 3))
b1 = nd.zeros(shape=20)
W2 = nd.random.normal(scale=scale, shape=(50, 20, 5, 5))
b2 = nd.zeros(shape=50)
W3 = nd.random.normal(scale=scale, shape=(800, 128))
b3 = nd.zeros(shape=128)
W4 = nd.random.normal(scale=scale, shape=(128, 10))
b4 = nd.zeros(shape=10)
params = [W1, b1, W2, b2, W3, b3, W4, b4]

# define the model
def lenet(X, params):
    h1_conv = nd.Convolution(data=X, weight=params[0], bias=params[1],
                             kernel=(3, 3), num_filter=20)
    h1_activation = nd.relu(h1_conv)
    h1 = nd.Pooling(data=h1_activation, pool_type='avg', kernel=(2, 2),
                    stride=(2, 2))
    h2_conv = nd.Convolution(data=h1, weight=params[2], bias=params[3],
                             kernel=(5, 5), num_filter=50)
    h2_activation = nd.relu(h2_conv)
    h2 = nd.Pooling(data=h2_activation, pool_type='avg', kernel=(2, 2),
                    stride=(2, 2))
    h2 = nd.flatten(h2)
    h3_linear = nd.dot(h2, params[4]) + params[5]
    h3 = nd.relu(h3_linear)
    y_hat = nd.dot(h3, params[6]) + params[7]
    return y_hat

# cross-entropy loss function
loss = gloss.SoftmaxCrossEntropyLoss()

def get_params(params, ctx):
    new_params = [p.copyto(ctx) for p in params]
    for p in new_params:
        p.attach_grad()
    return new_params

def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[0].copyto(data[i])

def split_and_load(data, ctx):
    n, k = data.shape[0], len(ctx)
    m = n // k  # for simplicity, we assume the data is divisible
    assert m * k == n, '# examples is not divided by # devices.'
    return [data[i * m: (i + 1) * m].as_in_context(ctx[i]) for i in range(k)]

def train_batch(X, y, gpu_params, ctx, lr):
    gpu_Xs, gpu_ys = split_and_load(X, ctx), split_and_load(y, ctx)
    with autograd.record():  # loss is calculated separately on each GPU
        ls = [loss(lenet(gpu_X, gpu_W), gpu_y)
              for gpu_X, gpu_y, gpu_W in zip(gpu_Xs, gpu_ys, gpu_params)]
    for l in ls:  # back propagation is performed separately on each GPU
        l.backward()
    # add up all the gradients from each GPU and then broadcast them to all the GPUs
    for i in range(len(gpu_params[0])):
        allreduce([gpu_params[c][i].grad for c in range(len(ctx))])
    for param in gpu_params:  # the model parameters are updated separately on each GPU
        sgd(param, lr, X.shape[0])  # here, we use a full-size batch

def train(ctx, batch_size, lr, num_epochs=1):
    train_iter, test_iter = load_data_fashion_mnist(batch_size)
    print('running on:', ctx)
    # copy model parameters to num_gpus GPUs
    gpu_params = [get_params(params, c) for c in ctx]
    for epoch in range(num_epochs):
        start = time.time()
        for X, y in train_iter:
            # perform multi-GPU training for a single mini-batch
            train_batch(X, y, gpu_params, ctx, lr)
            nd.waitall()
        train_time = time.time() - start

        def net(x):  # verify the model on GPU 0
            return lenet(x, gpu_params[0])

        test_acc = evaluate_accuracy(test_iter, net, ctx[0])
        print('epoch %d, time %.1f sec, test acc %.2f' % (epoch + 1, train_time, test_acc))
    return gpu_params, test_acc

data = [nd.ones((1, 2), ctx=mx.gpu(i)) * (i + 1) for i in range(2)]
allreduce(data)
for d in data:
    np.testing.assert_array_equal(d.asnumpy(), [[3, 3]])

batch = nd.arange(24).reshape((6, 4))
ctx = [mx.gpu(0), mx.gpu(1)]
splitted = split_and_load(batch, ctx)
assert [s.context for s in splitted] == ctx and splitted[1].shape == (3, 4)

two, acc2 = train([mx.gpu(0), mx.gpu(1)], 64, 0.2, 2)
one, acc1 = train([mx.cpu()], 64, 0.2, 2)
for a, b in zip(two[0], two[1]):   # the copies on both GPUs stayed identical
    np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
for a, b in zip(two[0], one[0]):   # and equal one device on the whole batch
    np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=2e-3, atol=2e-5)
assert abs(acc1 - acc2) < 0.02, (acc1, acc2)
print('ok')
'''


def test_lenet_from_scratch_on_two_gpus():
    out = run_sim(D2LZH + SCRATCH)
    assert "running on: [gpu(0), gpu(1)]" in out and "ok" in out, out


# ---- 12.6 Concise multi-GPU computation (multiple-gpus-concise.md) ------------------------------

CONCISE = '''
import numpy as np
import kiln as mx
from kiln import autograd, gluon, init, nd
from kiln.gluon import loss as gloss, nn, utils as gutils
import time

def resnet18(num_classes):
    """A slightly modified ResNet-18 model."""
    def resnet_block(num_channels, num_residuals, first_block=False):
        blk = nn.Sequential()
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.add(Residual(num_channels, use_1x1conv=True, strides=2))
            else:
                blk.add(Residual(num_channels))
        return blk

    net = nn.Sequential()
    # this model uses a smaller convolution kernel, stride, and padding and removes the maximum pooling layer
    net.add(nn.Conv2D(64, kernel_size=3, strides=1, padding=1),
            nn.BatchNorm(), nn.Activation('relu'))
    net.add(resnet_block(64, 2, first_block=True),
            resnet_block(128, 2),
            resnet_block(256, 2),
            resnet_block(512, 2))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net

net = resnet18(10)

ctx = CTX
net.initialize(init=init.Normal(sigma=0.01), ctx=ctx)
x = nd.random.uniform(shape=(4, 1, 28, 28))
gpu_x = gutils.split_and_load(x, ctx)
net(gpu_x[0]), net(gpu_x[1])

weight = net[0].params.get('weight')
try:
    weight.data()
except RuntimeError:
    print('not initialized on', mx.cpu())
print(weight.data(ctx[0])[0].shape, weight.data(ctx[1])[0].shape)
np.testing.assert_array_equal(weight.data(ctx[0]).asnumpy(), weight.data(ctx[1]).asnumpy())

def train(num_gpus, batch_size, lr):
    train_iter, test_iter = load_data_fashion_mnist(batch_size, n_train=16, n_test=16)
    ctx = CTX[:num_gpus]
    print('running on:', ctx)
    net.initialize(init=init.Normal(sigma=0.01), ctx=ctx, force_reinit=True)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr})
    loss = gloss.SoftmaxCrossEntropyLoss()
    for epoch in range(1):
        start = time.time()
        for X, y in train_iter:
            gpu_Xs = gutils.split_and_load(X, ctx)
            gpu_ys = gutils.split_and_load(y, ctx)
            with autograd.record():
                ls = [loss(net(gpu_X), gpu_y) for gpu_X, gpu_y in zip(gpu_Xs, gpu_ys)]
            for l in ls:
                l.backward()
            trainer.step(batch_size)
        nd.waitall()
        train_time = time.time() - start
        test_acc = evaluate_accuracy(test_iter, net, ctx[0])
        print('epoch %d, time %.1f sec, test acc %.2f' % (epoch + 1, train_time, test_acc))
    return [p.data(ctx[0]).asnumpy() for p in net.collect_params().values()]

nd.random.seed(3)
params = train(2, 8, 0.1)
for p in net.collect_params().values():   # the Trainer kept every GPU's copy the same
    if p.grad_req != 'null':
        np.testing.assert_array_equal(p.data(ctx[0]).asnumpy(), p.data(ctx[1]).asnumpy())
print('trained', len(params), 'parameters')
'''


def test_concise_resnet18_with_split_and_load_and_trainer_on_two_gpus():
    out = run_sim(D2LZH + "CTX = [mx.gpu(0), mx.gpu(1)]\n" + CONCISE)
    assert "not initialized on cpu(0)" in out, out
    assert "running on: [gpu(0), gpu(1)]" in out and "trained" in out, out


def test_concise_resnet18_on_two_cpu_devices(capsys):
    # The same chapter code without a GPU: two CPU devices stand in for the two GPUs.
    g = _run_here("CTX = [mx.cpu(0), mx.cpu(1)]\n" + CONCISE)
    out = capsys.readouterr().out
    assert "running on: [cpu(0), cpu(1)]" in out and "trained 110 parameters" in out, out
    assert all(np.isfinite(p).all() for p in g["params"])


def test_hybridize_and_async_chapters_on_a_simulated_gpu(tmp_path):
    # The same chapter code, unchanged, with gpu(0) as the default device (MXNet's `with ctx:`).
    code = (f"EXPORT_PREFIX = {str(tmp_path / 'gpu_mlp')!r}\n" + "with mx.gpu(0):\n" +
            textwrap.indent(HYBRIDIZE + HYBRID_FORWARD + ASYNC, "    ") + '''
assert x.context == mx.gpu(0) and net[0].weight.data().context == mx.gpu(0)
assert hybrid.context == mx.gpu(0)
np.testing.assert_allclose(hybrid.asnumpy(), eager.asnumpy(), rtol=1e-5, atol=1e-6)
assert y_async.context == mx.gpu(0) and losses[-1] < losses[0], losses
np.testing.assert_allclose(norm, np.linalg.norm(x.asnumpy().astype(np.float64) @ x.asnumpy()), rtol=1e-4)
print('ok', arg_count)
''')
    code = code.replace("y_sym = net(x_sym)\n", "y_sym = net(x_sym)\n    arg_count = len(y_sym.list_arguments())\n")
    out = run_sim("import numpy as np\n" + D2LZH + code)
    assert "after hybridizing" in out and "asynchronous. time" in out and "ok 7" in out, out
