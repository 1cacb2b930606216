"""HybridBlock.export and nn.SymbolBlock.imports: a round trip gives the same outputs (MLP, LeNet,
BatchNorm in inference mode, a tuple output, two inputs); the files are plain JSON and safetensors;
an imported block fine-tunes with Trainer and exports again; every damaged or mismatched file is a
FormatError (or, for a wrong input shape at call time, a ShapeError) that says what differs."""
import json
import os

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn
from kiln.nn import serialization


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(16, activation="relu"), nn.Dense(2))
    return net, (4, 20)


def _lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"), nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(16, kernel_size=5, activation="relu"), nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(), nn.Dense(32, activation="tanh"), nn.Dense(10))
    return net, (2, 1, 28, 28)


class _TwoHeads(nn.HybridBlock):
    """BatchNorm in the trunk and a tuple (nested) output."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.HybridSequential()
        self.trunk.add(nn.Dense(16), nn.BatchNorm(), nn.Activation("relu"))
        self.a = nn.Dense(3)
        self.b = nn.Dense(2)

    def forward(self, x):
        h = self.trunk(x)
        return self.a(h), (self.b(h), h)


def _two_heads():
    return _TwoHeads(), (5, 8)


def _hybrid(make):
    net, shape = make()
    net.initialize()
    x = nd.random.normal(shape=shape)
    if isinstance(net, _TwoHeads):
        with autograd.record():  # moves BatchNorm's running statistics away from 0 and 1
            net(x)
    net.hybridize()
    net(x)
    return net, x


def _flat(out):
    return [a for o in out for a in _flat(o)] if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("make", [_mlp, _lenet, _two_heads], ids=["mlp", "lenet", "batchnorm_tuple"])
def test_round_trip_gives_identical_outputs(make, tmp_path):
    net, x = _hybrid(make)
    want = net(x)
    sym_file, params_file = net.export(str(tmp_path / "m"))
    assert (sym_file, params_file) == (str(tmp_path / "m-symbol.json"), str(tmp_path / "m-0000.params"))
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    got = back(x)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], tuple)
    for w, g in zip(_flat(want), _flat(got)):
        np.testing.assert_array_equal(g.asnumpy(), w.asnumpy())
    assert {n for n in back.collect_params() if not n.startswith("const")} == set(net.collect_params())
    back.hybridize()  # a no-op: it is compiled already
    np.testing.assert_array_equal(_flat(back(x))[0].asnumpy(), _flat(want)[0].asnumpy())


def test_files_are_plain_json_and_safetensors(tmp_path):
    net, x = _hybrid(_two_heads)
    sym_file, params_file = net.export(str(tmp_path / "net"), epoch=7)
    assert params_file.endswith("net-0007.params")
    doc = json.loads(open(sym_file).read())
    assert doc["format"] == "kiln-graph" and doc["version"] == 1
    assert [i["name"] for i in doc["inputs"]] == ["data"] and doc["inputs"][0]["shape"] == [5, 8]
    assert doc["output_structure"] == [0, [1, 2]]
    arrays, meta = serialization.load_arrays(params_file)
    params = net.collect_params()
    assert [p["name"] for p in doc["params"]] == list(arrays)
    for name, arr in arrays.items():
        if name.startswith("const"):
            continue
        np.testing.assert_array_equal(arr.asnumpy(), params[name].data().asnumpy())
    assert {"trunk.0.weight", "trunk.1.running_mean", "a.bias"} <= set(arrays)
    # Running statistics are exported frozen, so an imported block does not train them.
    frozen = json.loads(meta["kiln.grad_req_null"])
    assert "trunk.1.running_var" in frozen and "trunk.1.gamma" not in frozen
    back = nn.SymbolBlock.imports(sym_file, "data", params_file)
    assert back.collect_params()["trunk.1.running_var"].grad_req == "null"
    assert back.collect_params()["trunk.1.gamma"].grad_req == "write"


def test_export_after_training_trace_uses_inference_graph(tmp_path):
    net, shape = _two_heads()[0], (5, 8)
    net.initialize()
    net.hybridize()
    x = nd.random.normal(shape=shape)
    net(x)
    with autograd.record():
        net(x)  # the last trace is a training one (batch statistics)
    sym_file, params_file = net.export(str(tmp_path / "t"))
    want = net(x)  # inference: no new trace needed
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    np.testing.assert_array_equal(back(x)[0].asnumpy(), want[0].asnumpy())


def test_several_inputs_are_data0_data1(tmp_path):
    class Add(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.d = nn.Dense(3, in_units=4)

        def forward(self, x, y):
            return self.d(x) + y

    net = Add()
    net.initialize()
    net.hybridize()
    x, y = nd.random.normal(shape=(2, 4)), nd.random.normal(shape=(2, 3))
    want = net(x, y)
    files = net.export(str(tmp_path / "add"))
    back = nn.SymbolBlock.imports(files[0], ["data0", "data1"], files[1])
    np.testing.assert_array_equal(back(x, y).asnumpy(), want.asnumpy())


def test_export_needs_a_compiled_graph(tmp_path):
    net, shape = _mlp()
    net.initialize()
    with pytest.raises(kiln.StateError, match=r"call hybridize\(\) and run one batch"):
        net.export(str(tmp_path / "m"))
    net.hybridize()
    with pytest.raises(kiln.StateError, match="run one batch"):
        net.export(str(tmp_path / "m"))


def test_fine_tune_imported_block_and_export_again(tmp_path):
    net, x = _hybrid(_mlp)
    files = net.export(str(tmp_path / "m"))
    back = nn.SymbolBlock.imports(files[0], ["data"], files[1])
    before = back(x).asnumpy()
    trainer = kiln.Trainer(back.collect_params(), "sgd", {"learning_rate": 0.5})
    label = nd.array(np.array([0, 1, 0, 1]), dtype="int32")
    loss_fn = kiln.loss.SoftmaxCrossEntropyLoss()
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(back(x), label)
        loss.backward()
        assert np.abs(back.collect_params()["0.weight"].grad().asnumpy()).sum() > 0
        trainer.step(4)
    after = back(x).asnumpy()
    assert np.abs(after - before).max() > 1e-4
    np.testing.assert_array_equal(net(x).asnumpy(), before)  # the original is untouched
    files2 = back.export(str(tmp_path / "tuned"), epoch=3)
    assert files2[1].endswith("tuned-0003.params")
    again = nn.SymbolBlock.imports(files2[0], ["data"], files2[1])
    np.testing.assert_array_equal(again(x).asnumpy(), after)


def test_imports_without_params_then_load_parameters(tmp_path):
    net, x = _hybrid(_mlp)
    files = net.export(str(tmp_path / "m"))
    back = nn.SymbolBlock.imports(files[0], ["data"])
    with pytest.raises(kiln.StateError, match="initialize"):
        back(x)
    back.load_parameters(files[1])
    np.testing.assert_array_equal(back(x).asnumpy(), net(x).asnumpy())


# -- bad files ---------------------------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path):
    net, x = _hybrid(_mlp)
    sym_file, params_file = net.export(str(tmp_path / "m"))
    return net, x, sym_file, params_file


def _edit_json(path, fn):
    doc = json.loads(open(path).read())
    fn(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_missing_files(exported, tmp_path):
    _, _, sym_file, params_file = exported
    with pytest.raises(kiln.FormatError, match="cannot open"):
        nn.SymbolBlock.imports(str(tmp_path / "nope-symbol.json"), ["data"], params_file)
    with pytest.raises(kiln.FormatError, match="cannot open"):
        nn.SymbolBlock.imports(sym_file, ["data"], str(tmp_path / "nope-0000.params"))


def test_truncated_params(exported):
    _, _, sym_file, params_file = exported
    blob = open(params_file, "rb").read()
    with open(params_file, "wb") as f:
        f.write(blob[:-100])
    with pytest.raises(kiln.FormatError, match="truncated"):
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)


def test_newer_version(exported):
    _, _, sym_file, params_file = exported
    _edit_json(sym_file, lambda d: d.update(version=99))
    with pytest.raises(kiln.FormatError, match="version 99 is newer"):
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)


def test_unknown_op(exported):
    _, _, sym_file, params_file = exported
    _edit_json(sym_file, lambda d: d["nodes"][0].update(op="frobnicate"))
    with pytest.raises(kiln.FormatError, match="frobnicate"):
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)


def test_wrong_recorded_shape(exported):
    _, _, sym_file, params_file = exported
    _edit_json(sym_file, lambda d: d["nodes"][0]["outputs"][0].update(shape=[4, 33]))
    with pytest.raises(kiln.FormatError, match="shape"):
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)


def _resave(params_file, fn):
    arrays, meta = serialization.load_arrays(params_file)
    fn(arrays)
    serialization.save_arrays(params_file, arrays, meta)


def test_missing_param(exported):
    _, _, sym_file, params_file = exported
    _resave(params_file, lambda a: a.pop("1.bias"))
    with pytest.raises(kiln.FormatError, match=r"missing parameter\(s\) \['1.bias'\]"):
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)


def test_extra_param(exported):
    _, _, sym_file, params_file = exported
    _resave(params_file, lambda a: a.update(stray=nd.zeros((2,))))
    with pytest.raises(kiln.FormatError, match=r"extra parameter\(s\) \['stray'\]"):
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)


def test_mismatched_param_shape_and_dtype(exported):
    _, _, sym_file, params_file = exported
    _resave(params_file, lambda a: a.update({"2.bias": nd.zeros((3,)), "0.bias": nd.zeros((32,), "float64")}))
    with pytest.raises(kiln.FormatError) as info:
        nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    assert "'2.bias' has shape (3,), the graph expects (2,)" in str(info.value)
    assert "'0.bias' is float64, the graph expects float32" in str(info.value)


def test_wrong_input_names(exported):
    _, _, sym_file, params_file = exported
    with pytest.raises(kiln.FormatError, match=r"input_names \['x'\] do not match the graph's inputs \['data'\]"):
        nn.SymbolBlock.imports(sym_file, ["x"], params_file)


def test_wrong_input_shape_at_call(exported):
    _, x, sym_file, params_file = exported
    back = nn.SymbolBlock.imports(sym_file, ["data"], params_file)
    with pytest.raises(kiln.ShapeError, match=r"takes rank-2 inputs like \(4, 20\); only the sizes"):
        back(nd.zeros((4, 20, 1)))
    with pytest.raises(kiln.ArgumentError, match="expected 1 input"):
        back(x, x)


def _kiln_run():
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(kiln._C.__file__))))
    return os.path.join(build, "tools", "kiln-run")


def test_a_python_export_runs_the_same_in_cpp_through_kiln_run(tmp_path):
    """The exported files leave Python behind: kiln-run (plain C++, kiln::load) computes the same."""
    import subprocess
    tool = _kiln_run()
    assert os.path.exists(tool), f"{tool} is built with the project (tools/); build it first"
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, kernel_size=3, activation="relu"), nn.MaxPool2D(2), nn.Flatten(), nn.Dense(5))
    net.initialize(kiln.init.Xavier())
    x = nd.random.normal(shape=(2, 1, 8, 8))
    net.hybridize()
    want = net(x).asnumpy()
    sym, params = net.export(str(tmp_path / "cnn"))
    np.save(tmp_path / "x.npy", x.asnumpy())
    out = subprocess.run([tool, sym, "--params", params, "--input", f"data={tmp_path / 'x.npy'}",
                          "--output-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = np.load(tmp_path / "out" / "output0.npy")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_compiled_call_is_one_engine_task():
    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dense(64, activation="relu"), nn.Dense(4))
    net.initialize()
    x = nd.random.normal(shape=(3, 200))
    net(x)
    net.hybridize()
    net(x)
    kiln.waitall()
    before = kiln._C.engine_stats()["pushed"]
    net(x)
    assert kiln._C.engine_stats()["pushed"] - before == 1  # 8 ops eagerly, one task compiled
