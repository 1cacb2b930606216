"""kiln.sym: var, calling blocks on Symbols, tojson / list_arguments / list_outputs / infer_shape,
and the F.* re-export of the nd ops used while tracing."""
import json

import numpy as np
import pytest

import kiln
from kiln import nd, nn, sym


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(8, activation="relu"), nn.BatchNorm(), nn.Dense(2))
    net.initialize()
    return net


def test_var():
    data = sym.var("data", shape=(3, 5))
    assert data.name == "data" and repr(data) == "<Symbol data>"
    assert data.list_arguments() == ["data"] and data.list_outputs() == ["data"]
    assert data.infer_shape() == ([(3, 5)], [(3, 5)], [])
    assert data.infer_shape(data=(4, 5)) == ([(4, 5)], [(4, 5)], [])
    with pytest.raises(kiln.StateError, match="alone has no graph"):
        data.tojson()
    with pytest.raises(kiln.ShapeError, match="positive"):
        sym.var("x", shape=(0, 3))


def test_block_on_symbol_lists_arguments_and_outputs():
    net = _mlp()
    out = net(sym.var("data", shape=(3, 5)))  # deferred shapes are completed first
    assert isinstance(out, sym.Symbol)
    args = out.list_arguments()
    assert args[0] == "data"
    params = [a for a in args[1:] if not a.startswith("const")]
    assert sorted(params) == sorted(net.collect_params())
    assert out.list_outputs() == ["hybridsequential_output"]
    assert out.list_auxiliary_states() == []


def test_infer_shape_follows_the_inputs():
    net = _mlp()
    out = net(sym.var("data", shape=(3, 5)))
    arg_shapes, out_shapes, aux_shapes = out.infer_shape()
    shapes = dict(zip(out.list_arguments(), arg_shapes))
    assert shapes["data"] == (3, 5) and shapes["0.weight"] == (8, 5) and shapes["2.bias"] == (2,)
    assert out_shapes == [(3, 2)] and aux_shapes == []
    arg_shapes, out_shapes, _ = out.infer_shape(data=(7, 5))  # traced again for another batch
    assert arg_shapes[0] == (7, 5) and out_shapes == [(7, 2)]
    assert out.infer_shape((9, 5))[1] == [(9, 2)]
    with pytest.raises(kiln.ArgumentError, match="'x' is not an input"):
        out.infer_shape(x=(1, 5))
    assert out.infer_type()[1] == ["float32"]


def test_tojson_is_the_export_format(tmp_path):
    net = _mlp()
    x = nd.random.normal(shape=(3, 5))
    net.hybridize()
    net(x)
    out = net(sym.var("data", shape=(3, 5)))
    doc = json.loads(out.tojson())
    assert doc["format"] == "kiln-graph"
    assert [i["name"] for i in doc["inputs"]] == ["data"]
    assert [p["name"] for p in doc["params"]] == out.list_arguments()[1:]
    assert json.loads(open(net.export(str(tmp_path / "m"))[0]).read()) == doc
    out.save(str(tmp_path / "s.json"))
    assert kiln._C.load_graph(str(tmp_path / "s.json")).input_names == ["data"]


def test_var_without_a_known_shape_is_a_clear_error_when_a_graph_is_needed():
    net = _mlp()
    out = net(sym.var("data"))  # a Symbol, as in MXNet: nothing is traced yet
    assert isinstance(out, sym.Symbol)
    assert out.list_arguments()[0] == "data"  # names need no shapes
    assert json.loads(out.tojson())["format"] == "kiln-symbol"  # MXNet's JSON holds no shapes either
    with pytest.raises(kiln.ShapeError, match=r"Symbol.save: var 'data' has no shape yet.*"
                                              r"infer_shape\(data=\(batch, ...\)\)"):
        out.save("never-written.json")


def test_two_inputs_tuple_output_and_indexing():
    class Two(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(3)
            self.b = nn.Dense(4)

        def forward(self, x, y):
            return self.a(x), self.b(y)

    net = Two()
    net.initialize()
    out = net(sym.var("x", shape=(2, 6)), sym.var("y", shape=(2, 5)))
    assert out.list_arguments() == ["x", "y", "a.weight", "a.bias", "b.weight", "b.bias"]
    assert out.list_outputs() == ["two_output0", "two_output1"] and len(out) == 2
    assert out.infer_shape()[1] == [(2, 3), (2, 4)]
    assert out[1].infer_shape(y=(6, 5))[1] == [(6, 4)]
    with pytest.raises(kiln.ArgumentError, match="2 output"):
        out[2]


def test_blocks_compose_on_symbols():
    first, second = _mlp(), nn.Dense(5)
    second.initialize()
    out = second(first(sym.var("data", shape=(3, 5))))
    assert out.infer_shape()[1] == [(3, 5)]
    assert "weight" in out.list_arguments() and "0.weight" in out.list_arguments()
    clash = nn.HybridSequential()
    clash.add(nn.Dense(4))
    clash.initialize()
    out = clash(first(sym.var("data", shape=(3, 5))))  # both have '0.weight': prefixed by position
    assert "0.0.weight" in out.list_arguments() and "1.0.weight" in out.list_arguments()


def test_mixing_symbols_and_arrays_is_an_error():
    class Add(nn.HybridBlock):
        def forward(self, x, y):
            return x + y

    with pytest.raises(kiln.ArgumentError, match="Symbols and NDArrays"):
        Add()(sym.var("x", shape=(2,)), nd.ones((2,)))


def test_f_ops_are_the_nd_ops():
    x = nd.array([-1.0, 3.0])
    np.testing.assert_array_equal(sym.relu(x).asnumpy(), nd.relu(x).asnumpy())
    np.testing.assert_array_equal(sym.ones((2,)).asnumpy(), np.ones(2))


def test_nd_functions_and_operators_compose_symbols():
    net = nn.Dense(4)
    net.initialize()
    data = sym.var("data", shape=(2, 3))
    out = sym.relu(net(data)) * 2 + 1
    assert isinstance(out, sym.Symbol)
    assert out.list_arguments()[:3] == ["data", "weight", "bias"]
    arg_shapes, out_shapes, _ = out.infer_shape(data=(5, 3))
    assert out_shapes == [(5, 4)]
    import json
    doc = json.loads(out.tojson())
    ops = [n["op"] for n in doc["nodes"] if n["op"] != "full"]  # full: the scalar constants
    assert ops[-3:] == ["relu", "mul", "add"]
