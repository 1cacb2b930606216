"""MXNet 1.x Gluon code on kiln with only its imports changed, written the way d2lzh (the MXNet
edition of d2l.ai) writes it: the namespace (kiln.gluon, mx.context, mx.random...), NDArray's
MXNet methods, creation functions with ctx= and dtype=, and Gluon 1.x parameters.
test_gpu_gluon_compat.py runs the same patterns on two simulated GPUs."""
import importlib

import numpy as np
import pytest

import kiln as mx
from kiln import autograd, gluon, init, nd
from kiln.gluon import data as gdata, loss as gloss, nn, utils as gutils


# ---- the namespace ----

def test_gluon_modules_and_classes_are_kilns_own():
    import kiln.gluon.nn as nn2
    from kiln.gluon.data.vision import transforms
    assert nn is nn2 is mx.nn and gloss is mx.loss and gdata is mx.data
    assert importlib.import_module("kiln.gluon.data.vision") is mx.data.vision
    assert transforms is mx.data.transforms
    assert gluon.nn.Dense is mx.nn.Dense and gluon.nn.HybridSequential is mx.nn.HybridSequential
    assert gluon.Block is mx.nn.Block and gluon.HybridBlock is mx.nn.HybridBlock
    assert gluon.SymbolBlock is mx.nn.SymbolBlock
    assert gluon.Trainer is mx.Trainer and gluon.Parameter is mx.nn.Parameter
    assert gluon.ParameterDict is mx.nn.ParameterDict
    assert gdata.vision.FashionMNIST is mx.data.FashionMNIST and gdata.DataLoader is mx.data.DataLoader
    assert gdata.ArrayDataset is mx.data.ArrayDataset and gdata.Dataset is mx.data.Dataset
    assert gutils.split_and_load is mx.utils.split_and_load
    for name in ("Dense", "Conv2D", "MaxPool2D", "AvgPool2D", "BatchNorm", "Dropout", "Flatten",
                 "Activation", "Embedding", "GlobalAvgPool2D", "Sequential", "SymbolBlock"):
        assert getattr(nn, name) is getattr(mx.nn, name)


def test_top_level_mxnet_names():
    assert mx.nd is nd and mx.autograd is autograd and mx.gluon is gluon
    assert mx.sym is mx.symbol and mx.sym is importlib.import_module("kiln.sym")
    assert mx.init is mx.initializer is init
    assert mx.kv is mx.kvstore and mx.kv.create("local").type == "local"
    assert mx.context.num_gpus() == mx.num_gpus() == 0
    assert mx.context.cpu(1) == mx.cpu(1) and mx.context.current_context() == mx.cpu(0)
    assert mx.Context is mx.context.Context
    assert mx.Context("gpu", 1) == mx.gpu(1) and mx.Context("cpu") == mx.cpu(0)
    assert isinstance(mx.gpu(1), mx.Context) and not isinstance("gpu", mx.Context)
    with pytest.raises(ValueError, match="'cpu' or 'gpu'"):
        mx.Context("tpu", 0)
    g = mx.gpu(1)
    assert (g.device_type, g.device_id) == ("gpu", 1) and mx.cpu().device_type == "cpu"
    assert mx.nd.waitall is mx.waitall
    assert mx.base.MXNetError is mx.MXNetError is mx.KilnError
    with pytest.raises(mx.base.MXNetError):  # d2lzh's try_gpu on a machine without a GPU
        nd.zeros((1,), ctx=mx.gpu())


def test_with_a_device_makes_it_the_default():
    assert mx.context.current_context() == mx.cpu(0)
    outside = nd.ones((1,))
    with mx.cpu(1) as c:
        assert c == mx.cpu(1) and mx.context.current_context() == mx.cpu(1)
        assert nd.zeros((2,)).context == mx.cpu(1) and nd.random.uniform(shape=(2,)).context == mx.cpu(1)
        assert nd.array([1, 2]).context == mx.cpu(1) and nd.arange(3).context == mx.cpu(1)
        assert nd.ones((1,), ctx=mx.cpu(2)).context == mx.cpu(2)            # an explicit ctx wins
        assert nd.array(outside).context == mx.cpu(0)                        # an NDArray stays put
        with mx.cpu(2):
            assert nd.full((1,), 3).context == mx.cpu(2)
        net = nn.Dense(2, in_units=3)
        net.initialize()
        assert net.weight.list_ctx() == [mx.cpu(1)]
        assert net.weight.data().context == mx.cpu(1)
    assert nd.zeros((2,)).context == mx.cpu(0) and mx.context.current_context() == mx.cpu(0)
    with pytest.raises(KeyError):
        with mx.cpu(1):
            raise KeyError("left through an exception")
    assert mx.context.current_context() == mx.cpu(0)


def test_mx_random_seed_makes_draws_repeat():
    mx.random.seed(7)
    a = mx.random.uniform(shape=(3,)).asnumpy()
    b = nd.random.normal(loc=2, scale=0.5, shape=(1000,)).asnumpy()
    mx.random.seed(7)
    np.testing.assert_array_equal(nd.random.uniform(shape=(3,)).asnumpy(), a)
    np.testing.assert_array_equal(mx.random.normal(2, 0.5, shape=(1000,)).asnumpy(), b)
    assert abs(b.mean() - 2) < 0.1 and abs(b.std() - 0.5) < 0.05


# ---- creation functions ----

def test_creation_functions_take_ctx_and_dtype_in_mxnets_order():
    c = mx.cpu(0)
    assert nd.zeros((2, 3), c, "int32").dtype == np.int32          # MXNet: (shape, ctx, dtype)
    assert nd.zeros((2, 3), "int32", c).dtype == np.int32          # kiln: (shape, dtype, device)
    assert nd.ones(shape=4, ctx=c, dtype=np.float64).dtype == np.float64
    assert nd.zeros(shape=20).shape == (20,)
    np.testing.assert_array_equal(nd.full((2,), 7, c, "int32").asnumpy(), [7, 7])
    assert nd.empty((3, 1), ctx=c).shape == (3, 1)
    assert nd.array([1, 2], c).dtype == np.float32 and nd.array([1, 2], ctx=c, dtype="int64").dtype == np.int64
    assert nd.array(np.zeros(2), dtype="float16").dtype == np.float16
    x = nd.ones((2, 2), dtype="int32")
    assert nd.zeros_like(x).dtype == np.int32 and nd.ones_like(x).asnumpy().sum() == 4
    assert nd.random.uniform(0, 1, shape=(2,), dtype="float64", ctx=c).dtype == np.float64
    assert nd.random.normal(shape=(2, 2), ctx=c).shape == (2, 2)
    assert nd.random.bernoulli(0.5, shape=(5,), ctx=c).shape == (5,)
    with pytest.raises(TypeError, match="both by position and by keyword"):
        nd.zeros((2,), "int32", dtype="float32")
    with pytest.raises(ValueError, match="disagree"):
        nd.ones((2,), device=mx.cpu(0), ctx=mx.cpu(1))
    with pytest.raises(ValueError, match="only dense"):
        nd.zeros((2,), stype="csr")


def test_arange_as_mxnet():
    a = nd.arange(3)
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a.asnumpy(), [0, 1, 2])
    np.testing.assert_array_equal(nd.arange(2, 8, 2, ctx=mx.cpu()).asnumpy(), [2, 4, 6])
    np.testing.assert_array_equal(nd.arange(0, 3, repeat=2).asnumpy(), [0, 0, 1, 1, 2, 2])
    assert nd.arange(5, dtype="int32").dtype == np.int32
    with pytest.raises(ValueError, match="repeat"):
        nd.arange(3, repeat=0)


def test_random_randint_stays_in_range():
    x = nd.random.randint(2, 5, shape=(2000,)).asnumpy()
    assert x.dtype == np.int32 and set(np.unique(x)) == {2, 3, 4}
    with pytest.raises(ValueError, match="greater than low"):
        nd.random.randint(3, 3, shape=(1,))


# ---- NDArray methods ----

def test_asscalar_asnumpy_and_their_errors():
    x = nd.array([[1, 2], [3, 4]])
    assert x.sum().asscalar() == 10 and isinstance(x.sum().asscalar(), np.float32)
    assert nd.array([2.5]).asscalar() == 2.5
    np.testing.assert_array_equal(x.asnumpy(), [[1, 2], [3, 4]])
    with pytest.raises(mx.ShapeError, match="exactly one") as e:
        x.asscalar()
    assert isinstance(e.value, ValueError)


def test_norm_is_l2_of_every_element_as_a_one_element_array_and_differentiable():
    x = nd.array([[3, 0], [0, 4]])
    n = x.norm()
    assert n.shape == (1,) and n.asscalar() == pytest.approx(5.0)
    assert nd.norm(x).asscalar() == pytest.approx(5.0)
    np.testing.assert_allclose(x.norm(axis=1).asnumpy(), [3, 4])
    assert x.norm(axis=0, keepdims=True).shape == (1, 2)
    assert x.norm(ord=1).asscalar() == pytest.approx(7.0)
    x.attach_grad()
    with autograd.record():
        y = x.norm()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [[0.6, 0], [0, 0.8]], rtol=1e-6)
    with pytest.raises(ValueError, match="ord"):
        x.norm(ord=3)


@pytest.mark.parametrize("shape, expected", [
    ((4, 0, 2), (4, 3, 2)), ((0, -1), (2, 12)), ((-2,), (2, 3, 4)), ((-3, 4), (6, 4)),
    ((0, -3), (2, 12)), ((-4, 1, 2, -2), (1, 2, 3, 4)), ((2, -4, -1, 3, 4), (2, 1, 3, 4)),
    ((-1,), (24,)), ((6, -1), (6, 4)), ((2, -2, 1), (2, 3, 4, 1)), ((-3, -2), (6, 4)),
])
def test_reshape_special_values(shape, expected):
    x = nd.arange(24).reshape((2, 3, 4))
    y = x.reshape(shape)
    assert y.shape == expected
    np.testing.assert_array_equal(y.asnumpy().ravel(), np.arange(24))
    assert x.reshape(*shape).shape == expected and nd.reshape(x, shape).shape == expected


def test_reshape_reverse_and_errors():
    x = nd.zeros((10, 5, 4))
    assert x.reshape((-1, 0), reverse=True).shape == (50, 4)     # MXNet's own example
    assert x.reshape((-1, 0)).shape == (40, 5)
    with pytest.raises(mx.ShapeError, match="only one dimension"):
        x.reshape((-1, -1))
    with pytest.raises(mx.ShapeError, match="does not divide"):
        x.reshape((-4, 3, -1, -2))
    with pytest.raises(mx.ShapeError, match="cannot reshape"):
        x.reshape((7, -1))
    with pytest.raises(mx.ShapeError, match="needs input dimension 3"):
        x.reshape((0, 0, 0, 0))
    with pytest.raises(ValueError, match="reverse"):
        x.reshape((-4, 2, 5, -2), reverse=True)


def test_reshape_special_values_inside_hybridize():
    class Net(nn.HybridBlock):
        def hybrid_forward(self, F, x):
            return x.reshape((0, -3, -2)).norm(axis=1) + x.reshape((-4, 1, -1, -2)).sum(axis=(0, 2, 3))

    net = Net()
    x = nd.random.uniform(shape=(2, 3, 4, 5))
    eager = net(x).asnumpy()
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), eager, rtol=1e-5)
    a = x.asnumpy()
    np.testing.assert_allclose(eager, np.linalg.norm(a.reshape(2, 12, 5), axis=1) + a.sum(axis=(1, 2)), rtol=1e-5)


def test_copyto_as_in_context_context_and_astype():
    x = nd.array([1, 2, 3])
    y = x.copyto(mx.cpu())                  # a device: a new array
    assert y is not x and not y._shares_storage(x)
    dst = nd.zeros((3,))
    assert x.copyto(dst) is dst             # an array: written into, and returned
    np.testing.assert_array_equal(dst.asnumpy(), [1, 2, 3])
    assert x.as_in_context(mx.cpu(0)) is x and x.as_in_context(x.context) is x
    assert x.as_in_context(mx.cpu(1)).context == mx.cpu(1)
    assert x.context == x.ctx == mx.cpu(0)
    z = x.astype("float32")                 # MXNet: copy=True by default
    assert z is not x and not z._shares_storage(x)
    assert x.astype("int32").dtype == np.int32
    with pytest.raises(mx.ShapeError):
        x.copyto(nd.zeros((4,)))


def test_in_place_updates_are_visible_through_every_reference():
    a = nd.ones((2, 3))
    alias = a
    view = a[1:]
    a[:] += nd.ones((2, 3)) * 2
    np.testing.assert_array_equal(alias.asnumpy(), np.full((2, 3), 3))
    a[:] = nd.arange(6).reshape((2, 3))
    np.testing.assert_array_equal(alias.asnumpy(), np.arange(6).reshape(2, 3))
    a += 1
    assert a is alias
    np.testing.assert_array_equal(alias.asnumpy(), np.arange(1, 7).reshape(2, 3))
    a[1:] -= 10                             # through a slice, seen by an earlier view
    np.testing.assert_array_equal(view.asnumpy(), [[-6, -5, -4]])
    a *= 2
    a[:] = 0.5
    np.testing.assert_array_equal(alias.asnumpy(), np.full((2, 3), 0.5))
    with pytest.raises(mx.ShapeError, match="in-place"):
        a += nd.ones((4, 2, 3))


def test_attach_grad_grad_and_wait_to_read():
    x = nd.arange(4).reshape((4, 1))
    x.attach_grad()
    assert x.grad.shape == (4, 1) and x.grad.asnumpy().sum() == 0
    with autograd.record():
        y = 2 * nd.dot(x.T, x)
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), 4 * x.asnumpy())
    y.wait_to_read()
    nd.waitall()
    assert y.asscalar() == 28


def test_nd_save_and_load_as_d2lzh(tmp_path):
    x = nd.ones(3)
    nd.save(str(tmp_path / "x"), x)
    x2 = nd.load(str(tmp_path / "x"))
    assert isinstance(x2, list) and len(x2) == 1
    np.testing.assert_array_equal(x2[0].asnumpy(), [1, 1, 1])
    y = nd.zeros(4, dtype="int32")
    nd.save(str(tmp_path / "xy"), [x, y])
    x2, y2 = nd.load(str(tmp_path / "xy"))
    assert y2.dtype == np.int32 and x2.shape == (3,)
    mydict = {"x": x, "y": y}
    nd.save(str(tmp_path / "mydict"), mydict)
    back = nd.load(str(tmp_path / "mydict"), ctx=mx.cpu(1))
    assert sorted(back) == ["x", "y"] and back["x"].context == mx.cpu(1)
    with pytest.raises(TypeError, match="not an NDArray"):
        nd.save(str(tmp_path / "bad"), [x, 3])
    with pytest.raises(mx.FormatError):
        (tmp_path / "junk").write_bytes(b"not a params file")
        nd.load(str(tmp_path / "junk"))


# ---- gluon.utils ----

def test_clip_global_norm_scales_in_place_only_above_the_limit():
    a, b = nd.ones((4,)), nd.full((1,), 2.0)
    keep = a
    total = gutils.clip_global_norm([a, b], 1.0)
    assert total == pytest.approx(np.sqrt(8.0))
    scale = 1.0 / np.sqrt(8.0)
    np.testing.assert_allclose(keep.asnumpy(), np.full(4, scale), rtol=1e-5)
    np.testing.assert_allclose(b.asnumpy(), [2 * scale], rtol=1e-5)
    c = nd.array([0.3, 0.4])
    assert gutils.clip_global_norm([c], 1.0) == pytest.approx(0.5)
    np.testing.assert_allclose(c.asnumpy(), [0.3, 0.4], rtol=1e-6)        # below: untouched
    lazy = gutils.clip_global_norm([nd.array([3.0, 4.0])], 1.0, check_isfinite=False)
    assert isinstance(lazy, nd.NDArray) and lazy.asscalar() == pytest.approx(5.0)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        gutils.clip_global_norm([nd.array([np.inf, 1.0])], 1.0)
    with pytest.raises(ValueError, match="empty"):
        gutils.clip_global_norm([], 1.0)


def test_split_and_load_as_d2lzh():
    X = nd.arange(8).reshape((4, 2))
    parts = gutils.split_and_load(X, [mx.cpu(0), mx.cpu(1)])
    assert [p.context for p in parts] == [mx.cpu(0), mx.cpu(1)]
    np.testing.assert_array_equal(parts[1].asnumpy(), [[4, 5], [6, 7]])


# ---- data ----

def test_fashion_mnist_loader_as_d2lzh():
    mnist_train = gdata.vision.FashionMNIST(train=True)
    assert len(mnist_train) == 60000
    feature, label = mnist_train[0]
    assert feature.shape == (28, 28, 1) and feature.dtype == np.uint8
    transformer = gdata.vision.transforms.ToTensor()
    loader = gdata.DataLoader(mnist_train.transform_first(transformer), 256, shuffle=True, num_workers=4)
    X, y = next(iter(loader))
    assert X.shape == (256, 1, 28, 28) and X.dtype == np.float32 and y.shape == (256,)
    assert 0 <= X.asnumpy().min() and X.asnumpy().max() <= 1


# ---- parameters as in Gluon 1.x ----

def _mlp():
    net = nn.Sequential()
    net.add(nn.Dense(256, activation="relu"))
    net.add(nn.Dense(10))
    net.initialize()
    net(nd.random.uniform(shape=(2, 20)))
    return net


def test_params_collect_params_and_get():
    net = _mlp()
    assert list(net.collect_params().keys()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert list(net.collect_params(".*weight").keys()) == ["0.weight", "1.weight"]
    assert list(net.collect_params("1.*|.*0.bias").keys()) == ["0.bias", "1.weight", "1.bias"]
    assert net[0].params.get("weight") is net[0].weight and net[0].weight.shape == (256, 20)
    assert net.collect_params().get("1.bias") is net[1].bias
    assert not net.params and list(net[1].params.keys()) == ["weight", "bias"]   # its own, as Gluon 1.x
    with pytest.raises(mx.ArgumentError, match="2 parameters end with it"):
        net.collect_params().get("weight")
    assert net[0].weight.name == "weight" and net[0].weight.list_ctx() == [mx.cpu()]
    assert net.collect_params().list_ctx() == [mx.cpu()]


def test_param_data_grad_set_data_and_grad_req():
    net = _mlp()
    w = net[0].weight
    x = nd.random.uniform(shape=(2, 20))
    with autograd.record():
        y = net(x).sum()
    y.backward()
    assert w.grad(mx.cpu()).shape == (256, 20) and w.grad().asnumpy().any()
    w.set_data(w.data() + 1)
    before = w.data(mx.cpu()).asnumpy()
    w.set_data(nd.ones((256, 20)))
    np.testing.assert_array_equal(w.data().asnumpy(), np.ones((256, 20)))
    assert not np.array_equal(before, w.data().asnumpy())
    with pytest.raises(mx.ShapeError, match="expected shape"):
        w.set_data(nd.ones((2, 2)))
    net.collect_params(".*bias").setattr("grad_req", "null")
    assert net[0].bias.grad_req == "null" and net[0].bias.data().grad is None
    net[0].bias.grad_req = "write"
    assert net[0].bias.data().grad is not None
    with pytest.raises(ValueError, match="grad_req"):
        w.grad_req = "sometimes"


def test_param_data_on_a_device_it_does_not_live_on_is_a_runtime_error():
    net = _mlp()
    with pytest.raises(RuntimeError, match=r"not initialized on cpu\(1\)") as e:
        net[0].weight.data(mx.cpu(1))
    assert isinstance(e.value, mx.StateError) and isinstance(e.value, mx.MXNetError)
    with pytest.raises(RuntimeError):
        net[0].weight.grad(mx.cpu(1))
    fresh = nn.Dense(3)
    with pytest.raises(RuntimeError, match="initialize"):
        fresh.weight.data()
    # as Gluon: with copies on several devices, data() means the one on the current context, cpu(0)
    two = nn.Dense(3, in_units=2)
    two.initialize(ctx=[mx.cpu(1), mx.cpu(2)])
    weight = two.params.get("weight")
    with pytest.raises(RuntimeError, match=r"not initialized on cpu\(0\).*\[cpu\(1\), cpu\(2\)\]"):
        weight.data()
    assert weight.data(mx.cpu(2)).context == mx.cpu(2)
    two.initialize(ctx=[mx.cpu(1), mx.cpu(0)], force_reinit=True)
    assert weight.data().context == mx.cpu(0) and weight.grad().context == mx.cpu(0)


def test_initialize_with_init_ctx_list_and_force_reinit():
    net = nn.Dense(3, in_units=4)
    net.initialize(init=init.Normal(sigma=0.01), ctx=[mx.cpu(0), mx.cpu(1)])
    w0, w1 = net.weight.data(mx.cpu(0)), net.weight.data(mx.cpu(1))
    assert net.weight.list_ctx() == [mx.cpu(0), mx.cpu(1)] and w1.context == mx.cpu(1)
    np.testing.assert_array_equal(w0.asnumpy(), w1.asnumpy())
    with pytest.warns(UserWarning, match="already initialized"):
        net.initialize(init=init.One())
    net.initialize(init=init.Constant(3), ctx=[mx.cpu(0), mx.cpu(1)], force_reinit=True)
    np.testing.assert_array_equal(w1.asnumpy(), np.full((3, 4), 3))        # refilled in place
    net.initialize(init=init.Xavier(), ctx=mx.cpu(1), force_reinit=True)
    assert net.weight.list_ctx() == [mx.cpu(1)]
    bound = np.sqrt(3.0 / ((3 + 4) / 2.0))
    assert np.abs(net.weight.data(mx.cpu(1)).asnumpy()).max() <= bound


def test_initializers_with_mxnets_keywords():
    arr = nd.zeros((200, 100))
    init.Normal(sigma=0.5)("weight", arr)
    assert arr.asnumpy().std() == pytest.approx(0.5, rel=0.05)
    init.Uniform(scale=0.2)("weight", arr)
    a = arr.asnumpy()
    assert a.min() >= -0.2 and a.max() <= 0.2 and a.max() > 0.19
    init.Constant(value=1.5)("weight", arr)
    assert (arr.asnumpy() == 1.5).all()
    init.Zero()("weight", arr)
    assert not arr.asnumpy().any()
    init.One()("bias", arr)
    assert (arr.asnumpy() == 1).all()
    init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)("weight", arr)
    assert arr.asnumpy().std() == pytest.approx(np.sqrt(2 / 100), rel=0.05)


def test_custom_layer_and_initializer_as_d2lzh():
    class MyDense(nn.Block):
        def __init__(self, units, in_units, **kwargs):
            super(MyDense, self).__init__(**kwargs)
            self.weight = self.params.get("weight", shape=(in_units, units))
            self.bias = self.params.get("bias", shape=(units,))

        def forward(self, x):
            linear = nd.dot(x, self.weight.data()) + self.bias.data()
            return nd.relu(linear)

    class MyInit(init.Initializer):
        def _init_weight(self, name, data):
            data[:] = nd.random.uniform(low=-10, high=10, shape=data.shape)
            data *= data.abs() >= 5

    dense = MyDense(units=3, in_units=5, prefix="my_dense_")
    assert list(dense.params.keys()) == ["weight", "bias"]
    assert list(dense.collect_params().keys()) == ["weight", "bias"]
    dense.initialize(MyInit())
    w = dense.weight.data().asnumpy()
    assert w.shape == (5, 3) and ((w == 0) | (np.abs(w) >= 5)).all() and (np.abs(w) >= 5).any()
    assert not dense.bias.data().asnumpy().any()                  # 'bias' names get zeros
    out = dense(nd.random.uniform(shape=(2, 5)))
    assert out.shape == (2, 3) and out.asnumpy().min() >= 0
    net = nn.Sequential()
    with net.name_scope():
        net.add(MyDense(8, in_units=64), MyDense(1, in_units=8))
    net.initialize()
    assert net(nd.random.uniform(shape=(2, 64))).shape == (2, 1)

    params = gluon.ParameterDict()                                # made by get, as d2lzh
    p = params.get("param2", shape=(2, 3))
    assert params.get("param2") is p and list(params) == ["param2"] and p.shape == (2, 3)
    with pytest.raises(mx.ShapeError, match="cannot change shape"):
        params.get("param2", shape=(4, 4))
    q = gluon.ParameterDict("block_").get("w", shape=(0, 2), allow_deferred_init=True)
    assert q.name == "block_w"
    shared = gluon.ParameterDict(shared=params)
    assert shared.get("param2") is p


def test_trainer_loop_as_d2lzh_linear_regression():
    true_w, true_b = nd.array([2, -3.4]), 4.2
    features = nd.random.normal(scale=1, shape=(1000, 2))
    # (d2lzh writes nd.dot(features, true_w); a matrix-vector dot is the operator API's business)
    labels = nd.dot(features, true_w.reshape((2, 1))).reshape((-1,)) + true_b
    labels += nd.random.normal(scale=0.01, shape=labels.shape)
    data_iter = gdata.DataLoader(gdata.ArrayDataset(features, labels), 10, shuffle=True)
    net = nn.Sequential()
    net.add(nn.Dense(1))
    net.initialize(init.Normal(sigma=0.01))
    loss = gloss.L2Loss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.03})
    for _ in range(3):
        for X, y in data_iter:
            with autograd.record():
                l = loss(net(X), y)
            l.backward()
            trainer.step(10)
    assert loss(net(features), labels).mean().asscalar() < 1e-3
    np.testing.assert_allclose(net[0].weight.data().asnumpy().ravel(), [2, -3.4], atol=0.02)
    assert net[0].bias.data().asscalar() == pytest.approx(4.2, abs=0.02)
