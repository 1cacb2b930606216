"""hybridize(): every block gives the same results, forward and gradients, eagerly and compiled;
the d2l.ai HybridNet prints only while tracing; reading values while tracing is an error naming
the line; a training loop is unchanged by hybridize()."""
import copy
import warnings

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn


def _residual():
    return nn.Residual(8, use_1x1conv=True, strides=2)


def _lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"), nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(16, kernel_size=5, activation="relu"), nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(), nn.Dense(32, activation="tanh"), nn.Dense(10))
    return net


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dense(16), nn.BatchNorm(), nn.Dense(3))
    return net


CASES = {
    "dense": (lambda: nn.Dense(5, activation="relu"), (4, 7)),
    "conv2d": (lambda: nn.Conv2D(4, kernel_size=3, padding=1, strides=2), (2, 3, 9, 9)),
    "maxpool": (lambda: nn.MaxPool2D(pool_size=3, strides=2, padding=1), (2, 3, 8, 8)),
    "avgpool": (lambda: nn.AvgPool2D(pool_size=2), (2, 3, 8, 8)),
    "globalavgpool": (lambda: nn.GlobalAvgPool2D(), (2, 3, 5, 5)),
    "batchnorm": (lambda: nn.BatchNorm(), (4, 3, 5, 5)),
    "flatten": (lambda: nn.Flatten(), (2, 3, 4)),
    "activation": (lambda: nn.Activation("softrelu"), (3, 4)),
    "residual": (_residual, (2, 3, 8, 8)),
    "lenet": (_lenet, (2, 1, 28, 28)),
    "mlp": (_mlp, (8, 20)),
    "dropout": (lambda: nn.Dropout(0.5), (4, 6)),  # outside training: the identity
    "embedding": (lambda: nn.Embedding(10, 4), None),
}


def _run(net, x, train):
    params = list(net.collect_params().values())
    for p in params:
        if p.grad_req != "null":
            p.zero_grad()
    floating = x._dtype_name.startswith("float")
    if train and floating:
        x.attach_grad()
    if train:
        with autograd.record():
            y = net(x)
            loss = (y * y).sum()
        loss.backward()
    else:
        y = net(x)
    grads = {p.name + str(i): p.grad().asnumpy().copy() for i, p in enumerate(params)
             if train and p.grad_req != "null"}
    if train and floating:
        grads["input"] = x.grad.asnumpy().copy()
    state = {p.name + str(i): p.data().asnumpy().copy() for i, p in enumerate(params)}
    return y.asnumpy(), grads, state


# Dropout in training draws differently in two runs: it is compared outside training only
# (test_nn checks its training behaviour).
@pytest.mark.parametrize("name,train", [(n, t) for n in sorted(CASES) for t in (False, True)
                                        if not (n == "dropout" and t)])
def test_block_eager_equals_hybridized(name, train):
    make, shape = CASES[name]
    nd.random.seed(3)
    eager = make()
    eager.initialize(kiln.init.Xavier())
    x = nd.array(np.array([[1, 3, 5], [9, 0, 2]]), dtype="int32") if shape is None else nd.random.normal(shape=shape)
    eager(x)  # deferred shapes
    hybrid = make()
    hybrid.initialize(kiln.init.Xavier())
    hybrid(x)
    for (k, p), (_, q) in zip(eager.collect_params().items(), hybrid.collect_params().items()):
        q.set_data(p.data().copy())
    hybrid.hybridize()
    for step in range(2):  # the second hybridized call runs the cached graph
        ye, ge, se = _run(eager, x, train)
        yh, gh, sh = _run(hybrid, x, train)
        np.testing.assert_allclose(yh, ye, rtol=1e-4, atol=1e-5)
        for k in ge:
            np.testing.assert_allclose(gh[k], ge[k], rtol=1e-3, atol=1e-5, err_msg=k)
        for k in se:  # batch norm's running statistics are updated the same way
            np.testing.assert_allclose(sh[k], se[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert len(hybrid._cache) == 1


class HybridNet(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Dense(4)
        self.output = nn.Dense(2)

    def hybrid_forward(self, F, x):
        print("module F:", F.__name__)
        print("value  x:", x)
        x = F.relu(self.hidden(x))
        return self.output(x)


def test_hybrid_forward_prints_only_while_tracing(capsys):
    net = HybridNet()
    net.initialize()
    x = nd.random.normal(shape=(1, 3))
    net(x)
    assert "module F: kiln.nd" in capsys.readouterr().out
    net.hybridize()
    net(x)
    out = capsys.readouterr().out
    assert "module F: kiln.sym" in out and "symbolic" in out
    y = net(x)
    assert capsys.readouterr().out == ""  # the compiled graph runs no Python
    assert y.shape == (1, 2)


class Branchy(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3)

    def forward(self, x):
        y = self.dense(x)
        if y.sum() > 0:  # a Python branch on a value cannot be traced
            return y
        return -y


def test_reading_values_while_tracing_names_the_line():
    net = Branchy()
    net.initialize()
    x = nd.ones((2, 4))
    net(x)
    net.hybridize()
    with pytest.raises(kiln.StateError) as info:
        net(x)
    msg = str(info.value)
    assert "test_hybridize.py" in msg and "if y.sum() > 0" in msg and "nd.where" in msg


def test_a_new_input_shape_traces_again_and_says_why():
    net = nn.Dense(3)
    net.initialize()
    net(nd.ones((2, 4)))
    net.hybridize()
    net(nd.ones((2, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # another batch size (a loader's last batch) traces quietly
        y = net(nd.ones((5, 4)))
    assert y.shape == (5, 3) and len(net._cache) == 2
    with pytest.warns(UserWarning, match=r"signature changed: argument 0: \(\([25], 4\).*\(\(2, 2, 2\)"):
        y = net(nd.ones((2, 2, 2)))  # another layout (Dense flattens it): churn worth a warning
    assert y.shape == (2, 3) and len(net._cache) == 3


def test_many_input_shapes_keep_the_cache_at_its_bound(monkeypatch):
    """200 distinct shapes: the block keeps KILN_GRAPH_CACHE_SIZE compiled graphs (least recently
    used dropped and freed), every result is right, and an evicted shape traces again."""
    monkeypatch.setenv("KILN_GRAPH_CACHE_SIZE", "8")
    net = nn.HybridSequential()
    net.add(nn.Dense(6, activation="tanh"), nn.Dense(3))
    net.initialize()
    net(nd.ones((1, 5)))  # deferred shapes found eagerly
    w1, b1, w2, b2 = (p.data().asnumpy() for p in net.collect_params().values())

    def expected(x):
        return np.tanh(x.asnumpy() @ w1.T + b1) @ w2.T + b2

    kiln.waitall()
    live_before = kiln._C.live_graphs()
    net.hybridize()
    assert net._cache.capacity == 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "traced again": expected here
        for rows in range(1, 201):
            x = nd.random.normal(shape=(rows, 5))
            y = net(x).asnumpy()
            assert y.shape == (rows, 3)
            np.testing.assert_allclose(y, expected(x), rtol=1e-4, atol=1e-5)
            assert len(net._cache) == min(rows, 8)
        assert net._cache.evictions == 192
        assert len(net._cache.keys()) == 8 and net._cache.keys()[0][2][0] == (200, 5)
        kiln.waitall()
        assert kiln._C.live_graphs() - live_before <= 8  # the dropped graphs' plans were freed
        # The least recently used shape was dropped: it traces (and is right) again.
        x = nd.random.normal(shape=(1, 5))
        np.testing.assert_allclose(net(x).asnumpy(), expected(x), rtol=1e-4, atol=1e-5)
    assert len(net._cache) == 8 and net._cache.evictions == 193


def test_a_dropped_hybridized_block_frees_its_graphs():
    import gc
    gc.collect()  # graphs held by earlier tests' cyclic garbage must not go during the count
    kiln.waitall()
    before = kiln._C.live_graphs()
    net = _mlp()
    net.initialize()
    x = nd.random.normal(shape=(4, 7))
    net(x)  # deferred shapes found eagerly
    net.hybridize()
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    with autograd.predict_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a training graph and an inference graph are expected
        net(x).wait_to_read()
    kiln.waitall()
    # The forward, its training variant, the inference forward, and the compiled backward (the
    # sum's gradient with the variant's backward, cached with the variant).
    assert kiln._C.live_graphs() - before == 4
    del net, loss
    import gc
    gc.collect()
    kiln.waitall()
    assert kiln._C.live_graphs() == before


def test_training_loop_is_unchanged_by_hybridize():
    def train(hybridize):
        nd.random.seed(7)
        net = _lenet()
        net.initialize(kiln.init.Xavier())
        x = nd.random.normal(shape=(16, 1, 28, 28))
        y = nd.array(np.arange(16) % 10, dtype="int32")
        net(x)
        if hybridize:
            net.hybridize()
        loss = kiln.loss.SoftmaxCrossEntropyLoss()
        trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
        losses = []
        for _ in range(4):
            with autograd.record():
                l = loss(net(x), y)
            l.backward()
            trainer.step(16)
            losses.append(l.mean().item())
        return losses, [p.data().asnumpy() for p in net.collect_params().values()]

    le, pe = train(False)
    lh, ph = train(True)
    np.testing.assert_allclose(lh, le, rtol=1e-4)
    for a, b in zip(ph, pe):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    assert le[-1] < le[0]


# Regressions found by review: each gave wrong numbers or read memory that was not there.

class _Square(nn.HybridBlock):
    def forward(self, x):
        a = x + 1
        b = a * a  # one node reading a value twice: its arena block must be freed once
        return (b + 1) * (b + 2)


def test_a_value_read_twice_by_one_node_keeps_its_own_memory():
    net = _Square()
    x = nd.ones((2, 3))
    want = net(x).asnumpy()
    net.hybridize()
    for _ in range(2):
        np.testing.assert_allclose(net(x).asnumpy(), want)


class _Constants(nn.HybridBlock):
    def forward(self, x):
        scale = nd.exp(nd.ones((3,)) * 0.5).reshape((1, 3))  # computed from constants only
        mask = (nd.ones((2, 3)) * 2 > 1).astype("float32")
        return x * scale * mask + (nd.full((2, 3), 7, dtype="int32") / 2).astype("float32")


def test_computations_on_constants_fold_and_give_the_eager_numbers():
    net = _Constants()
    x = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    want = net(x).asnumpy()
    net.hybridize()
    got = net(x).asnumpy()
    np.testing.assert_array_equal(got, want)  # folding runs the same kernels: bit for bit
    np.testing.assert_allclose(got, np.arange(6).reshape(2, 3) * np.exp(0.5) + 3.5, rtol=1e-6)


def test_a_compiled_graph_called_inside_another_keeps_the_outer_values(tmp_path):
    mlp = nn.HybridSequential()
    mlp.add(nn.Dense(64, activation="relu"), nn.Dense(64, activation="relu"), nn.Dense(8))
    mlp.initialize()
    x = nd.random.normal(shape=(4, 8))
    mlp.hybridize()
    mlp(x)
    sym_file, params_file = mlp.export(str(tmp_path / "mlp"))
    inner = nn.SymbolBlock.imports(sym_file, ["data"], params_file)

    class Outer(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            a = x * 2 + 1  # lives in the outer plan's arena across the inner call
            return self.inner(a) + a

    net = Outer()
    want = net(x).asnumpy()
    net.hybridize()
    for _ in range(2):
        np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-5)


class _KeepsFeature(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(5, in_units=3)

    def forward(self, x):
        self.feat = self.dense(x)
        return self.feat


def test_a_symbolic_tensor_kept_from_a_trace_cannot_be_computed_with():
    net = _KeepsFeature()
    net.initialize()
    net.hybridize()
    net(nd.ones((2, 3)))
    with pytest.raises(kiln.StateError, match="symbolic tensor"):
        (net.feat * 2).asnumpy()


def test_replaced_parameter_arrays_reach_the_compiled_graph():
    net = nn.Dense(3, in_units=4)
    net.initialize()
    net.hybridize()
    x = nd.ones((2, 4))
    net(x)
    net.cast("float64")  # replaces every parameter's arrays
    net.cast("float32")
    net.weight.set_data(nd.zeros((3, 4)))
    net.bias.set_data(nd.ones((3,)))
    np.testing.assert_allclose(net(x).asnumpy(), np.ones((2, 3)))


def test_the_shape_finding_first_call_compiles_no_child_alone():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, kernel_size=3, activation="relu"), nn.AvgPool2D(2, 2), nn.Flatten(), nn.Dense(3))
    net.initialize()
    net.hybridize()
    x = nd.ones((2, 1, 8, 8))
    want = net(x).asnumpy()  # eager: finds the parameters' shapes
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5)  # compiled, as one graph
    assert len(net._cache) == 1
    assert all(not child._cache for child in net._children.values())


def test_training_computes_no_gradient_for_a_data_batch_without_attach_grad():
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(3, in_units=16))
    net.initialize()
    net.hybridize()
    x = nd.random.normal(shape=(5, 8))

    def backward_bytes():
        with autograd.record():
            net(x).sum().backward()
        plans = {p["name"]: p for p in net.compile_report(as_dict=True)["plans"]}
        return plans["training backward"]["bytes_before"]

    without = backward_bytes()  # x needs no gradient: no matmul for it, a fill of zeros
    w_grad = net[0].weight.grad().asnumpy().copy()
    x.attach_grad()
    with_x = backward_bytes()   # another variant, which computes x's gradient too
    assert with_x > without
    np.testing.assert_allclose(net[0].weight.grad().asnumpy(), w_grad, rtol=1e-6)
    eager = nn.HybridSequential()
    eager.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(3, in_units=16))
    eager.initialize()
    for p, q in zip(net.collect_params().values(), eager.collect_params().values()):
        q.set_data(p.data().copy())
    x2 = x.copy()
    x2.attach_grad()
    with autograd.record():
        eager(x2).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), x2.grad.asnumpy(), rtol=1e-5, atol=1e-6)


def test_a_hybridized_block_deep_copies_with_an_empty_graph_cache():
    import copy
    net = nn.HybridSequential()
    net.add(nn.Dense(3, in_units=4))
    net.hybridize()
    twin = copy.deepcopy(net)  # the compiled-graph cache is copied empty, not refused
    assert twin is not net
    twin.initialize()
    assert twin(nd.random.normal(shape=(2, 4))).shape == (2, 3)


def test_each_call_finds_the_graph_of_its_arguments_and_mode():
    # A call is looked up by its arguments' shapes (dtypes, devices), the text of non-array
    # arguments, and the training flag: each combination gets its own graph and its own numbers.
    class Scaled(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(2, in_units=3)
            self.drop = nn.Dropout(0.5)

        def forward(self, x, scale):
            return self.drop(self.dense(x)) * scale

    net = Scaled()
    net.initialize()
    net.hybridize()
    x = nd.ones((4, 3))
    eager = net.dense(x).asnumpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the retraces below are meant
        for _ in range(2):  # the second round finds every graph traced in the first
            np.testing.assert_allclose(net(x, 2.0).asnumpy(), 2 * eager, rtol=1e-6)
            np.testing.assert_allclose(net(x, 3).asnumpy(), 3 * eager, rtol=1e-6)
            y5 = net(nd.ones((5, 3)), 2.0)
            assert y5.shape == (5, 2)
            np.testing.assert_allclose(y5.asnumpy()[:4], 2 * eager, rtol=1e-6)
            with autograd.train_mode():  # dropout is on: zeros, or twice the value
                y = net(x, 1.0).asnumpy()
            assert np.all((y == 0) | np.isclose(y, 2 * eager, rtol=1e-5))
            assert (y == 0).any()
    assert len(net._cache) == 4
