"""hybridize(freeze=True): in inference calls the parameters become constants of the compiled graph
and what is computed from them alone is folded at compile time. Frozen and unfrozen give the same
outputs (an MLP, a LeNet-like conv net with BatchNorm); a parameter expression in forward is
folded away; the frozen graph keeps the values it was compiled with until hybridize(freeze=True)
is called again; training calls run unfrozen (one warning) and get gradients; a frozen block
exports its constants and imports back."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(16, activation="relu"), nn.Dense(3))
    return net, (4, 20)


def _lenet_bn():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2), nn.BatchNorm(), nn.Activation("sigmoid"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(16, kernel_size=5), nn.BatchNorm(), nn.Activation("relu"), nn.AvgPool2D(pool_size=2, strides=2),
            nn.Flatten(), nn.Dense(32, activation="tanh"), nn.Dense(10))
    return net, (2, 1, 28, 28)


class _Scaled(nn.HybridBlock):
    """A parameter expression in forward: the doubled weight, transposed, depends on the weight alone."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter("weight", shape=(8, 5))

    def forward(self, x):
        w = self.weight.data(x.device) * 2
        return x @ w.T


def _frozen_report(net):
    return net.compile_report(as_dict=True)["plans"][0]["freeze"]


@pytest.mark.parametrize("make", [_mlp, _lenet_bn], ids=["mlp", "lenet_batchnorm"])
def test_frozen_outputs_equal_unfrozen(make):
    net, shape = make()
    net.initialize()
    x = nd.random.normal(shape=shape)
    with autograd.record():  # moves BatchNorm's running statistics away from 0 and 1
        net(x)
    want = net(x).asnumpy()  # eager, inference
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-5)
    assert _frozen_report(net) is None
    net.hybridize(freeze=True)
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-5)  # the cached graph
    report = _frozen_report(net)
    assert report["parameters"] == len(net.collect_params())
    assert report["constant_bytes"] > 0
    assert "parameters became constants" in net.compile_report()
    if make is _lenet_bn:
        # BatchNorm's inference arithmetic on its statistics: reshapes, var + eps, rsqrt.
        assert report["nodes_folded"] >= 2 * 6


def test_parameter_expression_is_folded():
    net = _Scaled()
    net.initialize()
    x = nd.random.normal(shape=(3, 5))
    want = (x.asnumpy() @ (net.weight.data().asnumpy() * 2).T)
    net.hybridize()
    net(x)
    unfrozen = net._last_used_graph
    net.hybridize(freeze=True)
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-6)
    frozen = net._last_used_graph
    assert frozen.frozen and not unfrozen.frozen
    assert frozen.num_nodes == 1 and unfrozen.num_nodes == 4  # only the matmul is left (no 2, mul, transpose)
    assert " mul(" not in frozen.graph_text() and " transpose(" not in frozen.graph_text()
    report = _frozen_report(net)
    assert (report["parameters"], report["nodes_folded"], report["constants"]) == (1, 2, 1)
    assert report["constant_bytes"] == 8 * 5 * 4
    assert "frozen: 1 parameter became constants, 2 nodes folded; the graph reads 1 constant" in net.compile_report()


def test_updates_reach_a_frozen_block_only_after_hybridize_again():
    net, shape = _mlp()
    net.initialize()
    x = nd.random.normal(shape=shape)
    net(x)  # the parameters' shapes are found eagerly
    net.hybridize(freeze=True)
    before = net(x).asnumpy()  # compiled now, frozen with the values the parameters have
    w = net[0].weight
    w.set_data(w.data() * 3)  # in place, as Trainer.step and load_parameters write
    np.testing.assert_array_equal(net(x).asnumpy(), before)  # the snapshot taken when compiled
    net.hybridize(freeze=True)
    after = net(x).asnumpy()
    assert not np.allclose(after, before)
    net.hybridize(freeze=False)  # unfrozen graphs read the parameters on every call
    np.testing.assert_allclose(net(x).asnumpy(), after, rtol=1e-5, atol=1e-6)
    w.set_data(w.data() * 2)
    assert not np.allclose(net(x).asnumpy(), after)


def test_training_calls_run_unfrozen_with_gradients():
    net, shape = _mlp()
    net.initialize()
    x = nd.random.normal(shape=shape)
    params = list(net.collect_params().values())

    def grads():
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        return [p.grad().asnumpy().copy() for p in params]

    want = grads()  # eager
    net.hybridize(freeze=True)
    net(x)  # an inference call: frozen
    with pytest.warns(UserWarning, match=r"freeze=True\) applies to inference calls only") as caught:
        got = grads()
    assert caught[0].filename == __file__  # the warning names the caller's line: net(x) in grads()
    assert caught[0].lineno == grads.__code__.co_firstlineno + 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    assert not net._last_used_graph.frozen
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per hybridize()
        grads()
    net(x)
    assert net._last_used_graph.frozen  # inference calls are frozen again


def test_frozen_block_exports_constants_and_imports_back(tmp_path):
    net, shape = _lenet_bn()
    net.initialize()
    x = nd.random.normal(shape=shape)
    with autograd.record():
        net(x)
    net.hybridize(freeze=True)
    want = net(x).asnumpy()
    sym_file, params_file = net.export(str(tmp_path / "frozen"))
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    np.testing.assert_array_equal(back(x).asnumpy(), want)
    names = list(back.collect_params())
    assert names and all(n.startswith("const") for n in names)
    assert all(p.grad_req == "null" for p in back.collect_params().values())  # for inference, as frozen
    assert len(names) == _frozen_report(net)["constants"]
