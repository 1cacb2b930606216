"""kiln.nn and kiln.init: shapes, deferred initialization, numerics against NumPy and torch,
training vs inference behaviour, gradients to every parameter, parameter naming, initializers."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import autograd, nd, nn


def _np(x):
    return x.asnumpy()


def _lenet():
    net = nn.Sequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"), nn.AvgPool2D(2, 2),
            nn.Conv2D(16, kernel_size=5, activation="sigmoid"), nn.MaxPool2D(2, 2),
            nn.BatchNorm(), nn.Flatten(), nn.Dense(120, activation="relu"), nn.Dropout(0.5),
            nn.Dense(10))
    return net


# -- shapes and deferred initialization ------------------------------------------------------------

@pytest.mark.parametrize("layer, in_shape, out_shape", [
    (nn.Dense(7), (4, 3, 5), (4, 7)),
    (nn.Dense(7, flatten=False), (4, 3, 5), (4, 3, 7)),
    (nn.Conv2D(8, 3, padding=1, strides=2), (2, 3, 9, 9), (2, 8, 5, 5)),
    (nn.Conv2D(8, (3, 1), dilation=2, groups=1), (2, 3, 9, 9), (2, 8, 5, 9)),
    (nn.Conv2D(6, 3, groups=3, in_channels=3), (2, 3, 6, 6), (2, 6, 4, 4)),
    (nn.MaxPool2D(3, strides=2, padding=1), (2, 3, 8, 8), (2, 3, 4, 4)),
    (nn.AvgPool2D(2), (2, 3, 8, 6), (2, 3, 4, 3)),
    (nn.GlobalAvgPool2D(), (2, 3, 8, 6), (2, 3, 1, 1)),
    (nn.GlobalMaxPool2D(), (2, 3, 8, 6), (2, 3, 1, 1)),
    (nn.BatchNorm(), (2, 3, 4, 4), (2, 3, 4, 4)),
    (nn.Flatten(), (2, 3, 4, 5), (2, 60)),
    (nn.Dropout(0.3), (2, 5), (2, 5)),
    (nn.Activation("softrelu"), (2, 5), (2, 5)),
    (nn.Residual(3), (2, 3, 6, 6), (2, 3, 6, 6)),
    (nn.Residual(8, use_1x1conv=True, strides=2), (2, 3, 6, 6), (2, 8, 3, 3)),
])
def test_layer_output_shapes(layer, in_shape, out_shape):
    layer.initialize()
    assert layer(nd.random.normal(shape=in_shape)).shape == out_shape


def test_embedding_shape_and_rows():
    emb = nn.Embedding(10, 4)
    emb.initialize()
    idx = nd.array([[1, 2, 3], [9, 0, 1]])  # float indices, as Gluon accepts
    out = emb(idx)
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(_np(out)[1, 0], _np(emb.weight.data())[9])


def test_deferred_init_completes_shape_on_first_forward():
    net = _lenet()
    net.initialize()
    w = net[0].weight
    assert w.shape == (6, 0, 5, 5)
    with pytest.raises(nn.DeferredInitializationError, match="forward pass"):
        w.data()
    assert net(nd.random.normal(shape=(2, 1, 28, 28))).shape == (2, 10)
    assert w.shape == (6, 1, 5, 5)
    assert net[6].weight.shape == (120, 16 * 5 * 5)
    assert net[4].running_var.shape == (16,)
    np.testing.assert_array_equal(_np(net[4].running_var.data()), np.ones(16))


def test_known_shape_initializes_at_once_and_uninitialized_data_raises():
    dense = nn.Dense(3, in_units=4)
    with pytest.raises(kiln.StateError, match="initialize"):
        dense.weight.data()
    dense.initialize()
    assert dense.weight.data().shape == (3, 4)
    with pytest.warns(UserWarning, match="already initialized"):
        dense.initialize()


def test_parameter_without_deferred_init_rejects_unknown_shape():
    p = nn.Parameter("w", shape=(3, 0))
    with pytest.raises(kiln.ShapeError, match="not fully known"):
        p.initialize()
    with pytest.raises(kiln.StateError, match="call initialize") as info:
        p.data()
    assert not isinstance(info.value, nn.DeferredInitializationError)


def test_incompatible_input_after_inference_raises():
    dense = nn.Dense(3)
    dense.initialize()
    dense(nd.ones((2, 4)))
    with pytest.raises(ValueError):
        dense(nd.ones((2, 5)))


# -- numerics against references --------------------------------------------------------------------

def test_dense_matches_numpy():
    dense = nn.Dense(5, activation="tanh", in_units=3)
    dense.initialize(kiln.init.Normal(1.0))
    dense.bias.set_data(nd.array([0.1, 0.2, 0.3, 0.4, 0.5]))
    x = np.random.randn(4, 3).astype(np.float32)
    w, b = _np(dense.weight.data()), _np(dense.bias.data())
    np.testing.assert_allclose(_np(dense(nd.array(x))), np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(), dict(strides=2, padding=1), dict(dilation=2, padding=2),
                                    dict(groups=2, padding=1)])
def test_conv2d_matches_torch(kwargs):
    conv = nn.Conv2D(4, kernel_size=3, **kwargs)
    conv.initialize(kiln.init.Normal(0.5))
    conv.bias.set_data(nd.array([0.5, -0.5, 1.0, 0.0]))
    x = np.random.randn(2, 4, 7, 7).astype(np.float32)
    y = _np(conv(nd.array(x)))
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(_np(conv.weight.data())),
                   torch.from_numpy(_np(conv.bias.data())), stride=kwargs.get("strides", 1),
                   padding=kwargs.get("padding", 0), dilation=kwargs.get("dilation", 1),
                   groups=kwargs.get("groups", 1)).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_pooling_matches_torch():
    x = np.random.randn(2, 3, 7, 7).astype(np.float32)
    tx = torch.from_numpy(x)
    for layer, ref in [(nn.MaxPool2D(3, 2, 1), F.max_pool2d(tx, 3, 2, 1)),
                       (nn.AvgPool2D(3, 2, 1), F.avg_pool2d(tx, 3, 2, 1, count_include_pad=True)),
                       (nn.AvgPool2D(3, 2, 1, count_include_pad=False),
                        F.avg_pool2d(tx, 3, 2, 1, count_include_pad=False)),
                       (nn.GlobalAvgPool2D(), F.adaptive_avg_pool2d(tx, 1))]:
        np.testing.assert_allclose(_np(layer(nd.array(x))), ref.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, ref", [("relu", F.relu), ("sigmoid", torch.sigmoid),
                                       ("tanh", torch.tanh), ("softrelu", F.softplus),
                                       ("gelu", F.gelu)])
def test_activations_match_torch(name, ref):
    x = np.linspace(-30, 30, 41).astype(np.float32)
    np.testing.assert_allclose(_np(nn.Activation(name)(nd.array(x))), ref(torch.from_numpy(x)).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_unknown_activation_is_an_argument_error():
    with pytest.raises(kiln.ArgumentError, match="softrelu"):
        nn.Activation("swishy")


# -- training vs inference ---------------------------------------------------------------------------

def test_batchnorm_training_and_inference_match_torch():
    bn = nn.BatchNorm(momentum=0.9, epsilon=1e-5)
    bn.initialize()
    tbn = torch.nn.BatchNorm2d(3, eps=1e-5, momentum=0.1)
    x = (np.random.randn(8, 3, 4, 4) * 3 + 2).astype(np.float32)
    for _ in range(2):
        with autograd.record():  # training mode: batch statistics, running stats updated
            y = bn(nd.array(x))
        tbn.train()
        ty = tbn(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(_np(y), ty, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_np(bn.running_mean.data()), tbn.running_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(_np(bn.running_var.data()), tbn.running_var.numpy(), rtol=1e-5)
    before = _np(bn.running_mean.data()).copy()
    y = bn(nd.array(x))  # inference: running statistics, nothing updated
    tbn.eval()
    np.testing.assert_allclose(_np(y), tbn(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(_np(bn.running_mean.data()), before)
    assert bn.running_mean.grad_req == "null" and bn.running_var.grad_req == "null"


def test_batchnorm_train_mode_without_recording():
    bn = nn.BatchNorm(in_channels=2)
    bn.initialize()
    x = nd.array(np.random.randn(16, 2, 3, 3) * 5 + 3)
    with autograd.train_mode():
        y = _np(bn(x))
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    assert np.abs(_np(bn.running_mean.data())).sum() > 0


def test_dropout_is_identity_outside_training():
    drop = nn.Dropout(0.5)
    x = nd.ones((100, 100))
    np.testing.assert_array_equal(_np(drop(x)), np.ones((100, 100)))
    with autograd.predict_mode():
        np.testing.assert_array_equal(_np(drop(x)), np.ones((100, 100)))
    with autograd.record():
        y = _np(drop(x))
    assert set(np.unique(y)) == {0.0, 2.0}
    assert 0.4 < (y == 0).mean() < 0.6


# -- gradients ------------------------------------------------------------------------------------

def test_gradients_reach_every_parameter():
    net = nn.Sequential()
    net.add(nn.Conv2D(4, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.Residual(4), nn.Residual(6, use_1x1conv=True, strides=2),
            nn.GlobalAvgPool2D(), nn.Dense(5))
    net.initialize(kiln.init.Xavier())
    x = nd.random.normal(shape=(4, 2, 8, 8))
    with autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    trainable = {k: p for k, p in net.collect_params().items() if p.grad_req != "null"}
    assert len(trainable) == 2 + 2 + 8 + (8 + 2) + 2  # conv, bn, two Residuals, dense
    for name, p in trainable.items():
        assert np.abs(_np(p.grad())).sum() > 0, f"no gradient reached {name}"


def test_dense_gradient_matches_torch():
    dense = nn.Dense(3, in_units=4)
    dense.initialize(kiln.init.Normal(1.0))
    x = np.random.randn(5, 4).astype(np.float32)
    with autograd.record():
        y = (nd.sigmoid(dense(nd.array(x)))).sum()
    y.backward()
    tw = torch.tensor(_np(dense.weight.data()), requires_grad=True)
    tb = torch.tensor(_np(dense.bias.data()), requires_grad=True)
    torch.sigmoid(torch.from_numpy(x) @ tw.T + tb).sum().backward()
    np.testing.assert_allclose(_np(dense.weight.grad()), tw.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(_np(dense.bias.grad()), tb.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_grad_req_add_accumulates_and_zero_grad_clears():
    dense = nn.Dense(2, in_units=3)
    dense.initialize()
    dense.collect_params().setattr("grad_req", "add")
    x = nd.ones((1, 3))
    for _ in range(2):
        with autograd.record():
            y = dense(x).sum()
        y.backward()
    np.testing.assert_allclose(_np(dense.bias.grad()), [2.0, 2.0])
    dense.collect_params().zero_grad()
    np.testing.assert_array_equal(_np(dense.bias.grad()), [0.0, 0.0])
    dense.bias.grad_req = "null"
    with pytest.raises(kiln.StateError, match="grad_req='null'"):
        dense.bias.grad()


# -- parameters: names, select, data, devices --------------------------------------------------------

class _TwoBranch(nn.Block):
    def __init__(self):
        super().__init__()
        self.features = nn.HybridSequential()
        self.features.add(nn.Conv2D(4, 3), nn.BatchNorm())
        self.scale = nn.Parameter("scale", shape=(1,), init="ones")
        self.head = nn.Dense(2)

    def forward(self, x):
        return self.head(self.features(x)) * self.scale.data(x.device)


def test_collect_params_structural_names_and_select():
    net = _TwoBranch()
    names = list(net.collect_params())
    assert names == ["scale", "features.0.weight", "features.0.bias", "features.1.gamma",
                     "features.1.beta", "features.1.running_mean", "features.1.running_var",
                     "head.weight", "head.bias"]
    assert list(net.collect_params(".*weight|.*bias")) == [
        "features.0.weight", "features.0.bias", "head.weight", "head.bias"]
    assert list(net.collect_params("features.1")) == names[3:7]
    assert list(net.params) == ["scale"]
    assert net.collect_params()["head.weight"].name == "weight"


def test_shared_parameter_is_listed_once():
    shared = nn.Dense(3, in_units=3)
    net = nn.Sequential()
    net.add(shared, nn.Activation("relu"), shared)
    assert list(net.collect_params()) == ["0.weight", "0.bias"]


def test_reassignment_keeps_order_and_none_unregisters():
    class M(nn.Block):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(1)
            self.b = nn.Dense(1)
            self.a = nn.Dense(2)
            self.b = None

    assert list(M().collect_params()) == ["a.weight", "a.bias"]


def test_assigning_before_super_init_is_a_clear_error():
    class Bad(nn.Block):
        def __init__(self):
            self.dense = nn.Dense(1)

    with pytest.raises(kiln.StateError, match="super\\(\\).__init__"):
        Bad()


def test_own_initializer_wins_over_block_default():
    net = _TwoBranch()
    net.initialize(kiln.init.Constant(0.25))
    net(nd.ones((1, 3, 5, 5)))
    params = net.collect_params()
    np.testing.assert_array_equal(_np(params["scale"].data()), [1.0])             # its own 'ones'
    np.testing.assert_array_equal(_np(params["head.bias"].data()), np.zeros(2))     # 'zeros'
    np.testing.assert_array_equal(_np(params["features.1.gamma"].data()), np.ones(4))
    assert np.all(_np(params["head.weight"].data()) == 0.25)


def test_set_data_shape_check_and_force_reinit_keeps_arrays():
    dense = nn.Dense(2, in_units=2)
    dense.initialize()
    held = dense.weight.data()
    dense.weight.set_data(nd.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(_np(held), [[1, 2], [3, 4]])
    with pytest.raises(kiln.ShapeError, match=r"\(2, 2\)"):
        dense.weight.set_data(nd.ones((3, 2)))
    dense.initialize(kiln.init.Zero(), force_reinit=True)
    assert dense.weight.data() is held
    np.testing.assert_array_equal(_np(held), np.zeros((2, 2)))


def test_parameter_on_several_devices():
    devices = [kiln.cpu(0), kiln.cpu(1)]
    dense = nn.Dense(2, in_units=3)
    dense.initialize(device=devices)
    assert dense.weight.list_device() == devices
    copies = dense.weight.list_data()
    assert len(copies) == 2 and copies[1].device == kiln.cpu(1)
    np.testing.assert_array_equal(_np(copies[0]), _np(copies[1]))
    y = dense(nd.ones((1, 3), device=kiln.cpu(1)))
    assert y.device == kiln.cpu(1)
    with pytest.raises(kiln.StateError, match="not initialized on"):
        dense.weight.data(kiln.cpu(2))


def test_hybridize_records_flag_and_hybrid_forward_style():
    class Scale(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.alpha = nn.Parameter("alpha", shape=(1,), init=kiln.init.Constant(3.0))

        def hybrid_forward(self, F, x, alpha):
            return F.multiply(x, alpha)

    net = nn.HybridSequential()
    net.add(Scale(), nn.Dense(1, in_units=2))
    net.initialize()
    net.hybridize(static_alloc=True)
    assert net._active and net[0]._active and net[0]._flags == {"static_alloc": True}
    np.testing.assert_allclose(_np(net[0](nd.ones((1, 2)))), [[3.0, 3.0]])
    assert len(net) == 2 and isinstance(net[1:], nn.HybridSequential) and len(net[1:]) == 1


# -- initializers --------------------------------------------------------------------------------------

def _drawn(init, shape):
    p = nn.Parameter("weight", shape=shape)
    p.initialize(init)
    return _np(p.data())


def test_initializer_statistics():
    u = _drawn(kiln.init.Uniform(0.5), (200, 200))
    assert -0.5 <= u.min() < -0.49 and 0.49 < u.max() <= 0.5 and abs(u.mean()) < 0.01
    n = _drawn(kiln.init.Normal(0.2), (200, 200))
    assert abs(n.std() - 0.2) < 0.005 and abs(n.mean()) < 0.005
    fan_in, fan_out = 64 * 9, 32 * 9
    x = _drawn(kiln.init.Xavier(), (32, 64, 3, 3))
    bound = np.sqrt(3.0 / ((fan_in + fan_out) / 2))
    assert np.abs(x).max() <= bound and np.abs(x).max() > 0.98 * bound
    g = _drawn(kiln.init.Xavier("gaussian", "in", 2), (300, 400))
    assert abs(g.std() - np.sqrt(2.0 / 400)) < 0.002
    np.testing.assert_array_equal(_drawn("zeros", (2, 3)), np.zeros((2, 3)))
    np.testing.assert_array_equal(_drawn("ones", (2, 3)), np.ones((2, 3)))
    np.testing.assert_array_equal(_drawn(kiln.init.Constant(7), (2,)), [7.0, 7.0])


def test_initializer_follows_seed_and_names():
    nd.random.seed(3)
    a = _drawn(kiln.init.Uniform(), (5, 5))
    nd.random.seed(3)
    np.testing.assert_array_equal(_drawn(kiln.init.Uniform(), (5, 5)), a)
    arr = nd.ones((3,))
    kiln.init.Normal()("dense_bias", arr)
    np.testing.assert_array_equal(_np(arr), np.zeros(3))
    with pytest.raises(kiln.ArgumentError, match="unknown initializer"):
        kiln.init.create("nope")
    with pytest.raises(kiln.ShapeError, match="2 dimensions"):
        _drawn(kiln.init.Xavier(), (5,))
