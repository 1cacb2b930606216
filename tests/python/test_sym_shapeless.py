"""Symbols without shapes (issue 16), in the d2l (MXNet edition) patterns: sym.var('data') with no
shape, net(x) returning a Symbol whose queries trace when shapes are known; composed symbols
exported and imported; exported graphs run at other batch sizes (SymbolBlock.imports, kiln-run);
a SymbolBlock inside a hybridized block exports inlined. GPU cases run on two simulated GPUs."""
import json
import os
import subprocess

import numpy as np
import pytest

import kiln
from kiln import nd, nn, sym
from test_gpu import run_sim


def get_net():
    """d2l's MLP (computational performance, "hybridize")."""
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def _cnn():
    """Convolution, pooling, flatten (a reshape whose target holds the batch) and BatchNorm."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, kernel_size=3, activation="relu"), nn.BatchNorm(), nn.MaxPool2D(2), nn.Flatten(),
            nn.Dense(6, activation="relu"), nn.Dense(3))
    net.initialize(kiln.init.Xavier())
    return net


MLP_ARGS = ["data", "0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]


def test_d2l_pattern_var_without_shape_on_a_hybridized_net():
    x = nd.random.normal(shape=(1, 512))
    net = get_net()
    net.hybridize()
    net(x)
    data = sym.var("data")
    y = net(data)
    assert isinstance(y, sym.Symbol)
    assert y.list_arguments() == MLP_ARGS
    assert y.list_outputs() == ["hybridsequential_output"]
    assert y.list_auxiliary_states() == []
    doc = json.loads(y.tojson())  # traced at the shape the net last ran with
    assert doc["format"] == "kiln-graph" and doc["inputs"][0]["shape"] == [1, 512]
    assert [p["name"] for p in doc["params"]] == MLP_ARGS[1:]
    arg_shapes, out_shapes, aux_shapes = y.infer_shape(data=(1, 512))
    assert arg_shapes == [(1, 512), (256, 512), (256,), (128, 256), (128,), (2, 128), (2,)]
    assert out_shapes == [(1, 2)] and aux_shapes == []
    assert y.infer_shape(data=(7, 512))[1] == [(7, 2)]
    assert y.infer_type()[1] == ["float32"]


def test_a_never_called_net_answers_names_at_once_and_graphs_once_shapes_are_given(tmp_path):
    net = get_net()  # not hybridized, not called: the parameters' shapes are deferred
    y = net(sym.var("data"))
    assert y.list_arguments() == MLP_ARGS  # no shapes needed
    assert json.loads(y.tojson())["format"] == "kiln-symbol"  # the recipe, without shapes (issue 28)
    with pytest.raises(kiln.ShapeError, match=r"var 'data' has no shape yet.*y?infer_shape\(data=\(batch, \.\.\.\)\)"):
        y.save(str(tmp_path / "never-symbol.json"))
    with pytest.raises(kiln.ShapeError, match="var 'data' has no shape yet"):
        y.list_outputs()
    assert y.infer_shape(data=(1, 512))[1] == [(1, 2)]
    # The shapes given are remembered: tojson() and save() trace at them now.
    assert json.loads(y.tojson())["inputs"][0]["shape"] == [1, 512]
    y.save(str(tmp_path / "y-symbol.json"))
    assert kiln._C.load_graph(str(tmp_path / "y-symbol.json")).param_names == MLP_ARGS[1:]
    assert y.list_outputs() == ["hybridsequential_output"]


def test_list_arguments_without_shapes_equals_the_traced_answer_and_the_file():
    net = _cnn()  # BatchNorm reads its running statistics before gamma and beta
    y = net(sym.var("data"))
    shapeless = y.list_arguments()
    y.infer_shape(data=(2, 1, 8, 8))
    assert y.list_arguments() == shapeless
    assert shapeless == ["data"] + list(net.collect_params())
    doc = json.loads(y.tojson())
    assert [p["name"] for p in doc["params"]] == shapeless[1:]
    arg_shapes = dict(zip(shapeless, y.infer_shape(data=(5, 1, 8, 8))[0]))
    assert arg_shapes["data"] == (5, 1, 8, 8) and arg_shapes["1.running_var"] == (4,)
    assert arg_shapes["4.weight"] == (6, 36)


def test_a_composed_symbol_exports_and_imports_with_the_eager_numbers(tmp_path):
    a, b = get_net(), nn.Dense(2)
    b.initialize()
    data = sym.var("data")
    out = sym.relu(a(data)) * 2 + b(data) - 1  # sym ops on vars and blocks
    x = nd.random.normal(shape=(4, 512))
    want = (nd.relu(a(x)) * 2 + b(x) - 1).asnumpy()
    block = nn.SymbolBlock(out, data)  # Gluon's SymbolBlock(outputs, inputs): shares the parameters
    assert set(block.collect_params()) == set(out.list_arguments()[1:])
    np.testing.assert_allclose(block(x).asnumpy(), want, rtol=1e-5, atol=1e-5)
    sym_file, params_file = block.export(str(tmp_path / "composed"))
    doc = json.load(open(sym_file))
    assert "call_graph" not in {n["op"] for n in doc["nodes"]}
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    for rows in (1, 3, 4):
        np.testing.assert_allclose(back(x[:rows]).asnumpy(), want[:rows], rtol=1e-5, atol=1e-5)
    # Symbol.save writes the same graph.
    out.save(str(tmp_path / "s-symbol.json"))
    assert json.load(open(tmp_path / "s-symbol.json")) == doc


def test_a_symbolblock_of_a_shapeless_symbol_takes_the_shapes_of_its_first_call():
    net = _cnn()
    data = sym.var("data")
    block = nn.SymbolBlock(net(data), data)
    assert "shapes from the first call" in repr(block)
    with pytest.raises(kiln.StateError, match="run a batch through the block first"):
        block.export("never")
    x = nd.random.normal(shape=(3, 1, 8, 8))
    want = net(x).asnumpy()
    np.testing.assert_allclose(block(x).asnumpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(block(x[:1]).asnumpy(), want[:1], rtol=1e-5, atol=1e-5)


@pytest.fixture
def exported_cnn(tmp_path):
    net = _cnn()
    x = nd.random.normal(shape=(4, 1, 8, 8))
    net.hybridize()
    net(x)
    sym_file, params_file = net.export(str(tmp_path / "cnn"))
    big = nd.random.normal(shape=(6, 1, 8, 8))
    return net, x, big, sym_file, params_file


def test_imports_runs_at_other_batch_sizes_with_the_eager_numbers(exported_cnn):
    net, x, big, sym_file, params_file = exported_cnn
    want = net(x).asnumpy()
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    for rows in (1, 3, 4, 1):
        got = back(x[:rows])
        assert got.shape == (rows, 3)
        np.testing.assert_allclose(got.asnumpy(), want[:rows], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back(big).asnumpy(), net(big).asnumpy(), rtol=1e-5, atol=1e-5)
    # One plan per (device, input shapes), bounded.
    assert len(back._compiled) == 4  # batches 1, 3, 4 (the exported one) and 6
    for rows in range(7, 7 + nn.symbol_block.MAX_PLANS):
        back(nd.zeros((rows, 1, 8, 8)))
    assert len(back._compiled) == nn.symbol_block.MAX_PLANS
    with pytest.raises(kiln.ShapeError, match="takes rank-4 inputs like"):
        back(nd.zeros((4, 64)))


def test_a_graph_that_cannot_be_re_shaped_soundly_says_which_node_and_input():
    class FirstTwo(nn.HybridBlock):
        def forward(self, x):
            return x[:2] * 2  # constant bounds on the batch axis

    net = FirstTwo()
    net.hybridize()
    x = nd.ones((4, 3))
    net(x)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        sym_file, params_file = net.export(os.path.join(d, "first2"))
        back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
        np.testing.assert_array_equal(back(x).asnumpy(), np.full((2, 3), 2.0))
        with pytest.raises(kiln.ShapeError, match=r"cannot re-shape node 0 \(slice.*input 'data' \(4, 3\) -> "
                                                  r"\(5, 3\).*constant bounds.*export the graph again"):
            back(nd.ones((5, 3)))


def test_kiln_run_runs_an_export_at_another_batch(exported_cnn, tmp_path):
    net, x, big, sym_file, params_file = exported_cnn
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(kiln._C.__file__))))
    tool = os.path.join(build, "tools", "kiln-run")
    np.save(tmp_path / "big.npy", big.asnumpy())
    r = subprocess.run([tool, sym_file, "--params", params_file, "--input", f"data={tmp_path / 'big.npy'}",
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output0.npy"), net(big).asnumpy(), rtol=1e-5, atol=1e-5)


class _Outer(nn.HybridBlock):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.head = nn.Dense(2)

    def forward(self, x):
        a = x * 2 + 1
        return self.head(self.inner(a) + a.mean())


def test_a_nested_symbolblock_exports_inlined_and_imports(exported_cnn, tmp_path):
    _, x, big, sym_file, params_file = exported_cnn
    inner = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    outer = _Outer(inner)
    outer.head.initialize()
    want = outer(x).asnumpy()
    outer.hybridize()
    np.testing.assert_allclose(outer(x).asnumpy(), want, rtol=1e-5, atol=1e-5)
    files = outer.export(str(tmp_path / "outer"))
    doc = json.load(open(files[0]))
    assert "call_graph" not in {n["op"] for n in doc["nodes"]}
    assert [p["name"] for p in doc["params"]] == list(outer.collect_params())
    back = nn.SymbolBlock.imports(files[0], ["data"], files[1])
    np.testing.assert_allclose(back(x).asnumpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back(big).asnumpy(), outer(big).asnumpy(), rtol=1e-5, atol=1e-5)


def test_executors_bind_simple_bind_and_eval():
    net = get_net()
    data = sym.var("data")
    y = net(data)
    x = nd.random.normal(shape=(3, 512))
    want = net(x).asnumpy()
    exe = y.simple_bind(kiln.cpu(), data=(3, 512))
    assert list(exe.arg_dict) == MLP_ARGS and exe.arg_dict["data"].shape == (3, 512)
    out = exe.forward(data=x)
    assert out is exe.outputs and len(out) == 1
    np.testing.assert_allclose(out[0].asnumpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(exe.forward(data=x[:1])[0].asnumpy(), want[:1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.eval(ctx=kiln.cpu(), data=x)[0].asnumpy(), want, rtol=1e-5, atol=1e-5)
    # bind with every argument given: other weights, other numbers.
    params = [p.data() * 0 for p in net.collect_params().values()]
    zeros = y.bind(kiln.cpu(), [x] + params).forward()[0]
    np.testing.assert_array_equal(zeros.asnumpy(), np.zeros((3, 2)))
    with pytest.raises(kiln.StateError, match="computes no gradients"):
        exe.forward(is_train=True)
    with pytest.raises(kiln.ArgumentError, match=r"no array for the input\(s\) \['data'\]"):
        y.bind(kiln.cpu(), {})


def test_on_two_simulated_gpus():
    run_sim("""
        import json, os, tempfile
        import numpy as np, kiln
        from kiln import nd, nn, sym
        for ctx in (kiln.gpu(0), kiln.gpu(1)):
            net = nn.HybridSequential()
            net.add(nn.Conv2D(4, kernel_size=3, activation="relu"), nn.MaxPool2D(2), nn.Flatten(), nn.Dense(3))
            net.initialize(kiln.init.Xavier(), ctx=ctx)
            x = nd.random.normal(shape=(4, 1, 8, 8), ctx=ctx)
            net.hybridize()
            want = net(x).asnumpy()
            y = net(sym.var("data"))
            assert y.infer_shape(data=(2, 1, 8, 8))[1] == [(2, 3)]
            np.testing.assert_allclose(y.eval(ctx=ctx, data=x)[0].asnumpy(), want, rtol=1e-5, atol=1e-5)
            with tempfile.TemporaryDirectory() as d:
                files = net.export(os.path.join(d, "cnn"))
                back = nn.SymbolBlock.imports(files[0], ["data"], files[1], ctx=ctx)
                for rows in (1, 3, 4):
                    got = back(x[:rows])
                    assert got.device == ctx
                    np.testing.assert_allclose(got.asnumpy(), want[:rows], rtol=1e-5, atol=1e-5)

                class Outer(nn.HybridBlock):
                    def __init__(self):
                        super().__init__()
                        self.inner = back
                    def forward(self, x):
                        return self.inner(x * 2) + 1
                outer = Outer()
                outer.hybridize()
                w = outer(x).asnumpy()
                files = outer.export(os.path.join(d, "outer"))
                again = nn.SymbolBlock.imports(files[0], ["data"], files[1], ctx=ctx)
                np.testing.assert_allclose(again(x[:3]).asnumpy(), w[:3], rtol=1e-5, atol=1e-5)
        print("ok")
    """)


def test_var_takes_mxnet_keywords():
    assert sym.var("data", dtype=None, lr_mult=1.0, attr={"a": "b"}).infer_type(data=(1, 2))[0] == ["float32"]
    with pytest.raises(kiln.ArgumentError, match=r"unknown argument\(s\) \['frobnicate'\]"):
        sym.var("data", frobnicate=1)


def test_a_nested_symbolblock_run_at_another_batch_exports_its_re_shaped_graph(exported_cnn, tmp_path):
    _, x, big, sym_file, params_file = exported_cnn
    outer = _Outer(nn.SymbolBlock.imports(sym_file, ["data"], params_file))
    outer.head.initialize()
    outer.hybridize()
    want = outer(big).asnumpy()  # the inner graph, exported at batch 4, runs re-shaped for 6
    files = outer.export(str(tmp_path / "outer6"))
    doc = json.load(open(files[0]))
    assert doc["inputs"][0]["shape"] == [6, 1, 8, 8]
    back = nn.SymbolBlock.imports(files[0], ["data"], files[1])
    np.testing.assert_allclose(back(big).asnumpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back(x).asnumpy(), outer(x).asnumpy(), rtol=1e-5, atol=1e-5)
