"""kiln.utils: timers, split_and_load, accuracy, the progress bar and plot_curves."""
import builtins
import io
import os

import numpy as np
import pytest

import kiln
from kiln import utils


def test_timer_and_benchmark(capsys):
    t = utils.Timer()
    t.times = [1.0, 2.0, 3.0]
    assert t.sum() == 6.0 and t.avg() == 2.0 and t.cumsum() == [1.0, 3.0, 6.0]
    t.start()
    assert t.stop() >= 0 and len(t.times) == 4
    with utils.Benchmark("add") as b:
        kiln.nd.ones((100, 100)) + 1
    out = capsys.readouterr().out
    assert out.startswith("add: ") and out.rstrip().endswith(" sec") and b.seconds >= 0


def test_accumulator_and_accuracy():
    acc = utils.Accumulator(2)
    acc.add(1, 2)
    acc.add(kiln.nd.array(np.array(3.0)), 4)
    assert acc[0] == 4.0 and acc[1] == 6.0
    acc.reset()
    assert acc.data == [0.0, 0.0]
    y_hat = kiln.nd.array(np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], np.float32))
    assert utils.accuracy(y_hat, kiln.nd.array(np.array([1, 0, 0], np.int32))) == 2.0
    assert utils.accuracy(y_hat, kiln.nd.array(np.array([1, 0, 0], np.float32))) == 2.0
    assert utils.accuracy(np.array([[0, 1], [1, 0]]), np.array([1, 1])) == 1.0


def test_evaluate_accuracy_with_a_plain_function():
    X = np.eye(4, dtype=np.float32)
    loader = kiln.data.DataLoader(kiln.data.ArrayDataset(X, np.array([0, 1, 2, 0])), 2)
    assert utils.evaluate_accuracy(lambda x: x, loader) == 0.75


def test_split_and_load_one_and_many_devices():
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    one = utils.split_and_load(x, kiln.cpu())
    assert len(one) == 1 and isinstance(one[0], kiln.NDArray) and one[0].shape == (6, 4)
    parts = kiln.split_and_load(kiln.nd.array(x), [kiln.cpu(0), kiln.cpu(1), kiln.cpu(2)])
    assert [p.shape for p in parts] == [(2, 4)] * 3
    np.testing.assert_array_equal(np.concatenate([p.asnumpy() for p in parts]), x)
    cols = utils.split_and_load(x, [kiln.cpu()] * 2, batch_axis=1)
    np.testing.assert_array_equal(cols[1].asnumpy(), x[:, 2:])
    uneven = utils.split_and_load(np.arange(7), [kiln.cpu()] * 3, even_split=False)
    assert [p.asnumpy().tolist() for p in uneven] == [[0, 1, 2], [3, 4], [5, 6]]  # as Gluon 2: the first get more
    few = utils.split_and_load(np.arange(2), [kiln.cpu(0), kiln.cpu(1), kiln.cpu(2)], even_split=False)
    assert [p.asnumpy().tolist() for p in few] == [[0], [1]] and few[1].device == kiln.cpu(1)
    with pytest.raises(ValueError, match="cannot be split evenly into 4 slices"):
        utils.split_and_load(x, [kiln.cpu()] * 4)
    with pytest.raises(ValueError, match="devices is empty"):
        utils.split_and_load(x, [])


def test_progress_bar_off_the_terminal_prints_one_final_line():
    out = io.StringIO()
    bar = utils.ProgressBar(range(7), desc="epoch 1", file=out)
    assert not bar.enabled
    bar.set_postfix("loss 0.5")
    assert sum(bar) == 21
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("epoch 1 [") and "7/7" in lines[0] and "loss 0.5" in lines[0]


def test_progress_bar_on_a_terminal_redraws_unless_ci(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("CI", raising=False)
    out = Tty()
    with utils.ProgressBar(total=3, file=out) as bar:
        for _ in range(3):
            bar.update()
    assert bar.enabled and out.getvalue().count("\r") >= 2 and out.getvalue().endswith("\n")
    monkeypatch.setenv("CI", "1")
    assert not utils.ProgressBar(total=3, file=Tty()).enabled


def test_plot_curves_writes_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    paths = utils.plot_curves({"train loss": [1.0, 0.6, 0.5], "test acc": [0.6, 0.7, 0.75]},
                              str(tmp_path / "curves" / "lenet"))
    assert paths == [str(tmp_path / "curves" / "lenet.png"), str(tmp_path / "curves" / "lenet.svg")]
    with open(paths[0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in open(paths[1]).read()
    assert all(os.path.getsize(p) > 0 for p in paths)


def test_plot_curves_without_matplotlib_names_the_package(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(RuntimeError, match="python3-matplotlib"):
        utils.plot_curves({"a": [1]}, str(tmp_path / "x"))


def test_every_lazily_imported_name_is_a_module_of_kiln():
    import importlib
    for name in kiln._LAZY_MODULES + kiln._MXNET_MODULES:
        assert getattr(kiln, name) is importlib.import_module("kiln." + name)
    for mxnet_name, name in kiln._MXNET_ALIASES.items():
        assert getattr(kiln, mxnet_name) is importlib.import_module("kiln." + name)
    with pytest.raises(AttributeError, match="no_such_module"):
        kiln.no_such_module


def test_nn_block_and_sym_do_not_import_each_other():
    import ast
    import pathlib
    root = pathlib.Path(kiln.__file__).parent

    def imported(path):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names.add(("." * node.level) + (node.module or ""))
                names.update(("." * node.level) + (node.module + "." if node.module else "") + a.name
                             for a in node.names)
        return names

    assert not any(n.endswith("nn.block") for n in imported(root / "sym.py"))
    block_imports = imported(root / "nn" / "block.py")
    assert "..sym" in block_imports  # F while tracing: the one direction kept
    assert not any("block" in n for n in imported(root / "sym.py"))
