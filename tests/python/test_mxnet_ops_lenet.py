"""LeNet from scratch as d2lzh (the MXNet edition of d2l.ai, "Multi-GPU computation") writes it,
with nd.Convolution, nd.Pooling, nd.flatten and nd.dot on raw parameters, a hand-written
allreduce (copyto and a[:] +=) and SGD: it trains (the loss falls) on the CPU and on two simulated
GPUs (KILN_GPU_SIM=2, in a fresh interpreter, see test_gpu.py), to the same numbers; the same
network as a HybridBlock whose hybrid_forward uses F.Convolution... trains identically hybridized."""
import numpy as np

from test_gpu import run_sim

LENET = """
import numpy as np, kiln
from kiln import nd, autograd
from kiln import loss as gloss

def lenet(X, params):
    h1_conv = nd.Convolution(data=X, weight=params[0], bias=params[1], kernel=(3, 3), num_filter=20)
    h1_activation = nd.Activation(data=h1_conv, act_type='relu')
    h1 = nd.Pooling(data=h1_activation, pool_type='avg', kernel=(2, 2), stride=(2, 2))
    h2_conv = nd.Convolution(data=h1, weight=params[2], bias=params[3], kernel=(5, 5), num_filter=50)
    h2_activation = nd.relu(h2_conv)
    h2 = nd.Pooling(data=h2_activation, pool_type='max', kernel=(2, 2), stride=(2, 2))
    h2 = nd.flatten(h2)
    h3_linear = nd.dot(h2, params[4]) + params[5]
    h3 = nd.relu(h3_linear)
    y_hat = nd.dot(h3, params[6]) + params[7]
    return y_hat

def init_params():
    nd.random.seed(7)
    W1 = nd.random.normal(scale=0.5, shape=(20, 1, 3, 3))
    b1 = nd.zeros(shape=20)
    W2 = nd.random.normal(scale=0.06, shape=(50, 20, 5, 5))
    b2 = nd.zeros(shape=50)
    W3 = nd.random.normal(scale=0.05, shape=(800, 128))
    b3 = nd.zeros(shape=128)
    W4 = nd.random.normal(scale=0.1, shape=(128, 10))
    b4 = nd.zeros(shape=10)
    return [W1, b1, W2, b2, W3, b3, W4, b4]

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
    m = n // k
    assert m * k == n, '# examples is not divided by # devices.'
    return [data[i * m: (i + 1) * m].as_in_context(ctx[i]) for i in range(k)]

def sgd(params, lr, batch_size):
    for param in params:
        param[:] = param - lr * param.grad / batch_size

def train_batch(X, y, gpu_params, ctx, lr):
    gpu_Xs, gpu_ys = split_and_load(X, ctx), split_and_load(y, ctx)
    with autograd.record():
        ls = [loss(lenet(gpu_X, gpu_W), gpu_y) for gpu_X, gpu_y, gpu_W in zip(gpu_Xs, gpu_ys, gpu_params)]
    for l in ls:
        l.backward()
    for i in range(len(gpu_params[0])):
        allreduce([gpu_params[c][i].grad for c in range(len(ctx))])
    for param in gpu_params:
        sgd(param, lr, X.shape[0])
    return sum(l.sum().item() for l in ls) / X.shape[0]

def data():
    # 10 classes, each a fixed random 28x28 template plus noise: learnable in a few steps.
    rs = np.random.RandomState(0)
    templates = rs.randn(10, 1, 28, 28).astype(np.float32)
    y = np.arange(32) % 10
    X = templates[y] + 0.5 * rs.randn(32, 1, 28, 28).astype(np.float32)
    return nd.array(X), nd.array(y.astype(np.float32))

def train(ctx, steps=6, lr=0.05):
    X, y = data()
    gpu_params = [get_params(init_params(), c) for c in ctx]
    losses = [train_batch(X, y, gpu_params, ctx, lr) for _ in range(steps)]
    kiln.waitall()
    return losses, [p.asnumpy() for p in gpu_params[0]], [p.context for p in gpu_params[-1]]
"""


def _check(losses):
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < 0.7 * losses[0], losses


def test_lenet_from_scratch_trains_on_the_cpu():
    env = {}
    exec(LENET, env)
    losses, params, _ = env["train"]([env["kiln"].cpu()])
    _check(losses)
    two, params2, devices = env["train"]([env["kiln"].cpu(0), env["kiln"].cpu(1)])  # the batch split over two
    assert devices[0] == env["kiln"].cpu(1)
    np.testing.assert_allclose(two, losses, rtol=1e-4)
    for a, b in zip(params2, params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_lenet_from_scratch_trains_on_two_simulated_gpus_as_on_the_cpu():
    out = run_sim(LENET + """
ref_losses, ref_params, _ = train([kiln.cpu()])
losses, params, devices = train([kiln.gpu(0), kiln.gpu(1)])
assert devices[0] == kiln.gpu(1), devices
assert losses[-1] < 0.7 * losses[0], losses
np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
for a, b in zip(params, ref_params):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
print("ok", losses[0], losses[-1])
""")
    assert "ok" in out


HYBRID = LENET + """
from kiln import nn

class LeNet(nn.HybridBlock):
    def __init__(self, params):
        super().__init__()
        for i, p in enumerate(params):
            setattr(self, f"p{i}", nn.Parameter(f"p{i}", shape=p.shape))
        self._init = params

    def hybrid_forward(self, F, X, p0, p1, p2, p3, p4, p5, p6, p7):
        h = F.Convolution(data=X, weight=p0, bias=p1, kernel=(3, 3), num_filter=20)
        h = F.Pooling(data=F.Activation(h, act_type='relu'), pool_type='avg', kernel=(2, 2), stride=(2, 2))
        h = F.Convolution(data=h, weight=p2, bias=p3, kernel=(5, 5), num_filter=50)
        h = F.Pooling(data=F.relu(h), pool_type='max', kernel=(2, 2), stride=(2, 2))
        h = F.relu(F.FullyConnected(F.flatten(h), F.transpose(p4), p5, num_hidden=128))
        return F.dot(h, p6) + p7

def train_block(ctx, hybridize, steps=5):
    net = LeNet(init_params())
    net.initialize(ctx=ctx)
    for i, p in enumerate(net._init):
        getattr(net, f"p{i}").set_data(p.as_in_context(ctx))
    if hybridize:
        net.hybridize()
    X, y = data()
    X, y = X.as_in_context(ctx), y.as_in_context(ctx)
    trainer = kiln.Trainer(net.collect_params(), 'sgd', {"learning_rate": 0.05})
    losses = []
    for _ in range(steps):
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        trainer.step(X.shape[0])
        losses.append(l.mean().item())
    return losses, net.p0.data().asnumpy()
"""


def test_lenet_hybrid_forward_trains_the_same_hybridized_on_cpu_and_gpu():
    out = run_sim(HYBRID + """
eager, w_eager = train_block(kiln.cpu(), False)
assert eager[-1] < 0.7 * eager[0], eager
for ctx in (kiln.cpu(), kiln.gpu(1)):
    hybrid, w = train_block(ctx, True)
    np.testing.assert_allclose(hybrid, eager, rtol=1e-4)
    np.testing.assert_allclose(w, w_eager, rtol=1e-3, atol=1e-5)
print("ok")
""")
    assert "ok" in out
