"""Issue 28, items 5, 6 (empty batches, small gaps against MXNet/NumPy) and 7: a shape-free
Symbol's tojson(), dumps() after dump(), empty batches through flatten/tile/softmax/repeat (eager,
hybridized, gradients), NDArray % and //, the int8 refusal, quiet retracing for a data loader's
last batch, and the demo's plot title naming every device."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn, profiler, sym

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- item 5: MXNet behaviours ------------------------------------------------------------------

def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
    net.initialize()
    return net


def test_tojson_of_a_hybridized_block_on_a_shapeless_var_is_the_recipe_as_mxnet():
    net = _mlp()
    net.hybridize()  # never called: no shape is known anywhere
    y = net(sym.var("data"))
    doc = json.loads(y.tojson())  # MXNet's symbol JSON holds no shapes: no ShapeError
    assert doc["format"] == "kiln-symbol"
    ops = [n["op"] for n in doc["nodes"] if n["op"] != "null"]
    assert ops == ["Dense", "Dense"]  # a HybridSequential lists its layers in order
    assert [doc["nodes"][i]["name"] for i in doc["arg_nodes"]] == y.list_arguments()
    assert all(doc["nodes"][i]["op"] == "null" for i in doc["arg_nodes"])
    last = doc["nodes"][doc["heads"][0][0]]
    assert last["op"] == "Dense" and "-> 3" in last["attrs"]["block"]
    first = doc["nodes"][[n["op"] for n in doc["nodes"]].index("Dense")]
    assert [doc["nodes"][i]["name"] for i, _, _ in first["inputs"]] == ["data", "0.weight", "0.bias"]
    assert "shape" not in json.dumps(doc["nodes"][0]["attrs"])
    # A graph file needs shapes: save() still says how to give them.
    with pytest.raises(kiln.ShapeError, match=r"var 'data' has no shape yet.*infer_shape"):
        y.save("never-written.json")
    # Once shapes are known, tojson() is the traced graph, the export format.
    assert y.infer_shape(data=(2, 5))[1] == [(2, 3)]
    traced = json.loads(y.tojson())
    assert traced["format"] == "kiln-graph" and traced["inputs"][0]["shape"] == [2, 5]


def test_the_recipe_of_composed_symbols_names_ops_scalars_and_shared_vars():
    a, b = _mlp(), nn.Dense(3)
    b.initialize()
    data = sym.var("data")
    out = sym.relu(a(data)) * 2 + b(data)
    doc = json.loads(out.tojson())
    nodes = doc["nodes"]
    assert [n["name"] for n in nodes if n["op"] == "null" and n["attrs"]["kind"] == "data"] == ["data"]
    mul = next(n for n in nodes if n["op"] == "mul")
    assert mul["attrs"] == {"arg1": "2"}
    assert nodes[mul["inputs"][0][0]]["op"] == "relu"
    assert sorted(nodes[i]["name"] for i in doc["arg_nodes"]) == sorted(out.list_arguments())
    assert nodes[doc["heads"][0][0]]["op"] == "add"


def _record(workload):
    profiler.set_state("run")
    workload()
    kiln.waitall()
    profiler.set_state("stop")


def _count(table, name):
    rows = [line.split() for line in table.splitlines() if line.split()[:1] == [name]]
    return sum(int(r[1]) for r in rows)


def test_dumps_keeps_the_statistics_after_dump_until_reset(tmp_path):
    kiln.waitall()
    profiler.set_config(profile_all=True, aggregate_stats=True, filename=str(tmp_path / "t.json"))
    try:
        profiler.dumps(reset=True)
        a = nd.ones((8, 8))
        _record(lambda: nd.sqrt(a).wait_to_read())
        profiler.dump(finished=True)  # writes the trace, stops, forgets the trace's events
        trace = json.load(open(tmp_path / "t.json"))
        assert any(e.get("name") == "sqrt" for e in trace["traceEvents"])
        table = profiler.dumps()
        assert _count(table, "sqrt") == 1, table  # MXNet keeps the aggregate statistics
        _record(lambda: [nd.sqrt(a).wait_to_read() for _ in range(2)])
        profiler.dump(finished=True)
        trace = json.load(open(tmp_path / "t.json"))  # the second trace starts afresh
        assert sum(e.get("name") == "sqrt" for e in trace["traceEvents"]) == 2
        assert _count(profiler.dumps(), "sqrt") == 3
        assert _count(profiler.dumps(reset=True), "sqrt") == 3
        assert _count(profiler.dumps(), "sqrt") == 0  # reset forgot them
    finally:
        profiler.set_state("stop")
        profiler.set_config(aggregate_stats=False, filename="profile.json")


# ---- item 6: empty batches ---------------------------------------------------------------------

class _Wrap(nn.HybridBlock):
    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def forward(self, x):
        return self._fn(x)


def _eager_and_hybridized(fn, x):
    block = _Wrap(fn)
    eager = block(x)
    block.hybridize()
    hybrid = block(x)
    assert hybrid.shape == eager.shape
    np.testing.assert_allclose(hybrid.asnumpy(), eager.asnumpy())
    return eager


@pytest.mark.parametrize("shape,want", [((0, 2, 2, 2), (0, 8)), ((0, 3), (0, 3)), ((0,), (0, 1)),
                                        ((2, 0, 3), (2, 0)), ((3, 2, 2), (3, 4))])
def test_flatten_keeps_the_width_of_an_empty_batch(shape, want):
    x = nd.ones(shape)
    assert nd.flatten(x).shape == want
    assert x.flatten().shape == want
    assert nn.Flatten()(x).shape == want
    assert nd.Flatten(x).shape == want
    assert _eager_and_hybridized(nd.flatten, x).shape == want


def _convnet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, kernel_size=3, activation="relu"), nn.MaxPool2D(2), nn.Flatten(), nn.Dense(5))
    net.initialize(kiln.init.Xavier())
    return net


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_conv_net_takes_a_batch_of_zero_forward_and_backward(hybridize):
    net = _convnet()
    net(nd.ones((2, 1, 8, 8)))  # shapes known
    if hybridize:
        net.hybridize()
    x = nd.ones((0, 1, 8, 8))
    x.attach_grad()
    with autograd.record():
        y = net(x)
        loss = y.sum()
    assert y.shape == (0, 5)
    loss.backward()
    assert loss.item() == 0
    assert x.grad.shape == (0, 1, 8, 8)
    for name, p in net.collect_params().items():
        g = p.grad().asnumpy()
        assert g.shape == p.shape and not g.any(), name


@pytest.mark.parametrize("shape,reps", [((0, 3), (2, 1)), ((2, 3), (0, 2)), ((2, 3), (2, 0)), ((0,), 3),
                                        ((2, 3), (0,)), ((2,), (3, 0, 1)), ((2, 3), (2, 2))])
def test_tile_with_a_zero_size_input_or_a_zero_repeat_is_empty_as_numpy(shape, reps):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = np.tile(x, reps)
    got = nd.tile(nd.array(x), reps)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.asnumpy(), want)
    assert _eager_and_hybridized(lambda a: nd.tile(a, reps), nd.array(x)).shape == want.shape
    with pytest.raises(kiln.ArgumentError, match="tile: expected reps to be a non-negative integer"):
        nd.tile(nd.array(x), (-1,))


@pytest.mark.parametrize("fn,ref", [(nd.softmax, lambda a, ax: np.exp(a) / np.exp(a).sum(ax, keepdims=True)),
                                    (nd.log_softmax, lambda a, ax: a - np.log(np.exp(a).sum(ax, keepdims=True)))])
@pytest.mark.parametrize("shape,axis", [((2, 0), -1), ((0, 3), 0), ((0, 3), -1), ((2, 0, 4), 1)])
def test_softmax_over_a_zero_length_axis_is_empty_as_numpy(fn, ref, shape, axis):
    x = nd.ones(shape)
    with np.errstate(divide="ignore"):
        want = ref(np.ones(shape, np.float32), axis)
    y = fn(x, axis=axis)
    assert y.shape == want.shape == shape
    assert _eager_and_hybridized(lambda a: fn(a, axis=axis), x).shape == shape
    x.attach_grad()
    with autograd.record():
        loss = fn(x, axis=axis).sum()
    loss.backward()
    assert x.grad.shape == shape


def test_softmax_cross_entropy_of_an_empty_batch_is_empty():
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    pred = nd.ones((0, 4))
    pred.attach_grad()
    with autograd.record():
        out = loss(pred, nd.zeros((0,)))
    out.backward()
    assert out.shape == (0,) and pred.grad.shape == (0, 4)


# ---- item 6: small gaps against MXNet / NumPy --------------------------------------------------

A = np.array([7, -7, 7, -7, 0, 6, -6, 1], dtype=np.int64)
B = np.array([2, 2, -2, -2, 3, 3, -3, 5], dtype=np.int64)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_mod_and_floordiv_of_arrays_follow_numpy_signs(dtype):
    a, b = A.astype(dtype), B.astype(dtype)
    x, y = nd.array(a, dtype=dtype), nd.array(b, dtype=dtype)
    for got, want in ((x % y, np.mod(a, b)), (x // y, np.floor_divide(a, b)),
                      (nd.mod(x, y), np.mod(a, b)), (nd.floor_divide(x, y), np.floor_divide(a, b)),
                      (nd.remainder(x, y), np.remainder(a, b)), (nd.modulo(x, y), np.mod(a, b))):
        assert got._dtype_name == dtype
        np.testing.assert_array_equal(got.asnumpy(), want)
    q, r = divmod(x, y)
    np.testing.assert_array_equal(q.asnumpy(), np.floor_divide(a, b))
    np.testing.assert_array_equal(r.asnumpy(), np.mod(a, b))
    np.testing.assert_array_equal((q * y + r).asnumpy(), a)


def test_mod_and_floordiv_with_scalars_numpy_arrays_and_in_place():
    x = nd.array(A, dtype="int64")
    np.testing.assert_array_equal((x % 3).asnumpy(), A % 3)
    np.testing.assert_array_equal((x % -3).asnumpy(), A % -3)
    np.testing.assert_array_equal((x // -3).asnumpy(), A // -3)
    np.testing.assert_array_equal((10 % (x + 9)).asnumpy(), 10 % (A + 9))
    np.testing.assert_array_equal((10 // (x + 9)).asnumpy(), 10 // (A + 9))
    np.testing.assert_array_equal((x % B).asnumpy(), A % B)  # a NumPy operand
    np.testing.assert_array_equal((B // (x + 9)).asnumpy(), B // (A + 9))  # NumPy defers to NDArray
    f = x % 2.5  # a float scalar makes the integer array float32, as x / 2.5
    assert f._dtype_name == "float32"
    np.testing.assert_allclose(f.asnumpy(), A % 2.5, rtol=1e-6)
    fx = nd.array([5.5, -5.5, 0.25])
    np.testing.assert_allclose((fx % 2).asnumpy(), np.array([5.5, -5.5, 0.25]) % 2, rtol=1e-6)
    np.testing.assert_allclose((fx // -2).asnumpy(), np.array([5.5, -5.5, 0.25]) // -2)
    inplace = nd.array(A, dtype="int64")
    alias = inplace
    inplace %= 4
    assert inplace is alias
    np.testing.assert_array_equal(alias.asnumpy(), A % 4)
    inplace //= nd.array([2] * 8, dtype="int64")
    np.testing.assert_array_equal(alias.asnumpy(), (A % 4) // 2)
    u = nd.array(np.array([7, 200], np.uint8), dtype="uint8")
    np.testing.assert_array_equal((u % 3).asnumpy(), np.array([7, 200], np.uint8) % 3)
    with pytest.raises(ValueError, match="division by zero"):
        (x % nd.zeros((8,), dtype="int64")).asnumpy()
    with pytest.raises(kiln.IntegerOverflowError):
        u % 300


def test_mod_differentiates_and_hybridizes():
    a = nd.array([5.5, -5.5, 3.0, -1.25])
    b = nd.array([2.0, 2.0, -4.0, 0.5])
    a.attach_grad(), b.attach_grad()
    with autograd.record():
        loss = (a % b).sum() + (a // b).sum()
    loss.backward()
    np.testing.assert_allclose(a.grad.asnumpy(), np.ones(4))  # d(a % b)/da = 1, floor has none
    np.testing.assert_allclose(b.grad.asnumpy(), -np.floor(a.asnumpy() / b.asnumpy()))
    got = _eager_and_hybridized(lambda t: (t % 3) + (t // 2), nd.array([[7.0, -7.0, 2.5]]))
    np.testing.assert_allclose(got.asnumpy(), np.mod([[7.0, -7.0, 2.5]], 3) + np.floor_divide([[7.0, -7.0, 2.5]], 2))
    s = sym.var("data") % 3
    np.testing.assert_allclose(s.eval(data=nd.array([[-1.0, 4.0]]))[0].asnumpy(), [[2.0, 1.0]])


@pytest.mark.parametrize("shape,repeats,axis", [((2, 3), 0, 1), ((2, 3), 0, 0), ((2, 3), 0, None),
                                                ((0, 3), 2, 0), ((2, 3), 2, 1), ((2, 3), 3, None)])
def test_repeat_accepts_zero_as_numpy(shape, repeats, axis):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = np.repeat(x, repeats, axis=axis)
    got = nd.repeat(nd.array(x), repeats, axis=axis)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.asnumpy(), want)
    assert _eager_and_hybridized(lambda a: nd.repeat(a, repeats, axis=axis), nd.array(x)).shape == want.shape
    with pytest.raises(kiln.ArgumentError, match="repeat: expected repeats to be a non-negative integer"):
        nd.repeat(nd.array(x), -1, axis=axis)


def test_int8_is_refused_with_the_supported_dtypes_and_what_to_use():
    for make in (lambda: nd.ones((2,), dtype="int8"), lambda: nd.ones((2,)).astype("int8"),
                 lambda: nd.array([1, 2], dtype="int8"), lambda: nd.ones((2,), dtype=np.int8)):
        with pytest.raises(kiln.DTypeError) as info:
            make()
        text = str(info.value)
        assert "int8" in text and "float32, float64, float16, bfloat16, int32, int64, uint8, bool" in text
        assert "use int32" in text.lower() and "uint8 for bytes" in text


def test_the_empty_batch_and_mod_cases_on_a_simulated_gpu():
    from test_gpu import run_sim
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd, nn, autograd
        g = kiln.gpu(0)
        A = np.array([7, -7, 7, -7, 0, 6], np.int64)
        B = np.array([2, 2, -2, -2, 3, -4], np.int64)
        for dt in ("int32", "int64", "float32"):
            x, y = nd.array(A, dtype=dt, device=g), nd.array(B, dtype=dt, device=g)
            np.testing.assert_array_equal((x % y).asnumpy(), np.mod(A, B).astype(dt))
            np.testing.assert_array_equal((x // y).asnumpy(), np.floor_divide(A, B).astype(dt))
        assert nd.flatten(nd.ones((0, 2, 2, 2), device=g)).shape == (0, 8)
        assert nd.softmax(nd.ones((2, 0), device=g)).shape == (2, 0)
        assert nd.tile(nd.ones((2, 3), device=g), (0, 2)).shape == (0, 6)
        assert nd.repeat(nd.ones((2, 3), device=g), 0, axis=1).shape == (2, 0)
        net = nn.HybridSequential()
        net.add(nn.Conv2D(4, 3), nn.Flatten(), nn.Dense(5))
        net.initialize(device=g)
        net(nd.ones((2, 1, 8, 8), device=g))
        net.hybridize()
        with autograd.record():
            y = net(nd.ones((0, 1, 8, 8), device=g))
            loss = y.sum()
        loss.backward()
        assert y.shape == (0, 5) and loss.item() == 0
        print("ok")
    """)
    assert out.strip().endswith("ok")


# ---- item 7: the demo --------------------------------------------------------------------------

def test_a_data_loaders_smaller_last_batch_traces_quietly_but_churn_still_warns():
    net = _mlp()
    net.hybridize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        for rows in (8, 8, 3):  # two full batches, the smaller last one
            with autograd.record():
                net(nd.ones((rows, 5))).sum().backward()
        for rows in (16, 4):  # evaluation: another mode, other batch sizes
            net(nd.ones((rows, 5)))
        net(nd.ones((8, 5)))
    assert len(net._cache) == 5

    class Flexible(nn.HybridBlock):
        def forward(self, x):
            return x.sum(axis=-1)

    flex = Flexible()
    flex.hybridize()
    flex(nd.ones((4, 5)))
    with pytest.warns(UserWarning, match=r"input signature changed: argument 0: \(\(4, 5\).*\(\(4, 6\)"):
        flex(nd.ones((4, 6)))  # another feature size: churn a user should see
    many = _mlp()
    many.hybridize()
    with pytest.warns(UserWarning, match=r"7 batch sizes so far \(1, 2, 3, 4, 5, 6, 7\).*last_batch='discard'"):
        for rows in range(1, 8):
            many(nd.ones((rows, 5)))


def test_the_demo_trains_on_two_devices_without_a_retrace_warning_and_titles_both(tmp_path):
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("Fashion-MNIST is not installed")
    prefix = str(tmp_path / "lenet")
    env = dict(os.environ, PYTHONWARNINGS="default", MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples/python/lenet_fashion_mnist.py"),
                          "--device", "all", "--hybridize", "--limit", "600", "--test-limit", "300",
                          "--epochs", "1", "--plot", prefix],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "traced again" not in run.stdout + run.stderr
    assert "training on [cpu(0), cpu(1)]" in run.stdout
    svg = open(prefix + ".svg").read()
    assert "LeNet on Fashion-MNIST (cpu(0), cpu(1))" in svg
