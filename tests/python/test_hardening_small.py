"""Regression tests of issue 17's smaller crashes and silent wrong answers, each with the exact
expression a user typed: unknown KILN_* variables warn instead of failing, Python integers that do
not fit the dtype raise (NumPy 2), zero-sized convolution kernels and reversed random ranges are
refused, 0-d arrays have no len(), DataLoader and mark_variables check their arguments, kiln-run
bounds --repeat, and deeply nested JSON (symbol files, params headers) is a FormatError, not a
segmentation fault."""
import os
import re
import struct
import subprocess
import textwrap
import sys

import numpy as np
import pytest

import kiln
from kiln import autograd, nd
from kiln.data import ArrayDataset, DataLoader

_BUILD_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(kiln._C.__file__)))


# ---- unknown KILN_* variables: one warning naming the closest switch, never an error ----------

def test_unknown_kiln_variables_warn_once_and_ops_still_work():
    code = ("from kiln import nd\n"
            "print((nd.ones(3) + 1).asnumpy().tolist())\n"
            "print(nd.ones((2, 2)).sum().item())\n")
    env = dict(os.environ, KILN_FOO="1", KILN_PROFLE="x", PYTHONPATH=_BUILD_PYTHON)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[2.0,", "2.0,", "2.0]", "4.0"]
    typo = [line for line in out.stderr.splitlines() if "KILN_PROFLE" in line]
    assert len(typo) == 1, out.stderr
    assert "did you mean KILN_PROFILE?" in typo[0] and "warning" in typo[0]
    assert len([line for line in out.stderr.splitlines() if "KILN_FOO" in line]) == 1, out.stderr


# ---- labels outside [0, classes) are refused by every op that indexes by label ---------------

_BAD_LABEL = r"label (-1|3|5) \(at position \d of the labels\) is out of range for 3 classes; labels must be " \
             r"class indices 0 to 2"


def _refused(fn, match=_BAD_LABEL):
    """fn() raises ArgumentError matching `match`; an error a queued task stored for the next
    waitall (the engine's contract) is that same error and is consumed here."""
    with pytest.raises(kiln.ArgumentError, match=match):
        fn()
    try:
        kiln.waitall()
    except kiln.ArgumentError as e:
        assert re.search(match, str(e)), str(e)


@pytest.mark.parametrize("bad", [3, 5, -1])
def test_softmax_cross_entropy_refuses_labels_out_of_range_eagerly(bad):
    logits = nd.random.normal(shape=(4, 3))
    _refused(lambda: nd.softmax_cross_entropy(logits, nd.array([0, 1, bad, 2])).asnumpy())
    _refused(lambda: nd.softmax_cross_entropy(logits, nd.array([0, 1, bad, 2], dtype='int32')).asnumpy())
    good = nd.softmax_cross_entropy(logits, nd.array([0, 1, 2, 2])).asnumpy()
    p = np.exp(logits.asnumpy()) / np.exp(logits.asnumpy()).sum(-1, keepdims=True)
    np.testing.assert_allclose(good, -np.log(p[np.arange(4), [0, 1, 2, 2]]), rtol=1e-5)


def test_the_gradient_is_never_silently_zero_for_a_bad_label():
    logits = nd.random.normal(shape=(2, 3))
    logits.attach_grad()

    def run():
        with autograd.record():
            loss = nd.softmax_cross_entropy(logits, nd.array([1, 3]))
        loss.backward()
        logits.grad.asnumpy()
    _refused(run)


@pytest.mark.parametrize("hybridize", [False, True])
def test_the_gluon_losses_refuse_labels_out_of_range(hybridize):
    from kiln import loss as gloss
    for fn in (gloss.SoftmaxCrossEntropyLoss(), gloss.SoftmaxCrossEntropyLoss(from_logits=True)):
        if hybridize:
            fn.hybridize()
        pred = nd.random.normal(shape=(4, 3))
        fn(pred, nd.array([0, 1, 2, 0])).asnumpy()  # traces (hybridized) with good labels
        _refused(lambda: fn(pred, nd.array([0, 1, 5, 0])).asnumpy())
        _refused(lambda: fn(pred, nd.array([0, -1, 2, 0])).asnumpy())


def test_a_hybridized_network_with_a_loss_refuses_bad_labels_in_its_compiled_plan():
    from kiln import loss as gloss, nn

    class Net(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(3)

        def hybrid_forward(self, F, x, y):
            return F.softmax_cross_entropy(self.dense(x), y)

    net = Net()
    net.initialize()
    net.hybridize()
    x = nd.random.normal(shape=(5, 4))
    net(x, nd.array([0, 1, 2, 0, 1])).asnumpy()
    _refused(lambda: net(x, nd.array([0, 1, 2, 3, 1])).asnumpy())
    assert gloss is not None


def test_softmax_output_refuses_bad_labels_but_keeps_ignored_ones():
    data = nd.random.normal(shape=(3, 3))
    _refused(lambda: nd.SoftmaxOutput(data, nd.array([0, 5, 1])).asnumpy())
    out = nd.SoftmaxOutput(data, nd.array([0, -1, 1]), use_ignore=True, ignore_label=-1).asnumpy()
    np.testing.assert_allclose(out.sum(-1), 1, rtol=1e-5)


def test_mxnet_one_hot_keeps_its_all_off_rows():
    # nd.one_hot is MXNet's: an index outside [0, depth) gives a row of off_value, by design.
    np.testing.assert_array_equal(nd.one_hot(nd.array([1, 5, -1]), 3).asnumpy(),
                                  [[0, 1, 0], [0, 0, 0], [0, 0, 0]])


def _on_simulated_gpus(code):
    """Runs `code` in a fresh interpreter on two simulated GPUs; it must exit cleanly and print no
    "not raised" (what its snippets print where an expected error did not come)."""
    env = dict(os.environ, KILN_GPU_SIM="2", PYTHONPATH=_BUILD_PYTHON)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "not raised" not in out.stdout, out.stdout
    return out


def test_bad_labels_on_a_simulated_gpu_raise_the_cpus_error():
    code = ("import kiln\n"
            "from kiln import nd\n"
            "x = nd.random.normal(shape=(4, 3), device=kiln.gpu(0))\n"
            "print(nd.softmax_cross_entropy(x, nd.array([0, 1, 2, 2], device=kiln.gpu(0))).shape)\n"
            "try:\n"
            "    nd.softmax_cross_entropy(x, nd.array([0, 1, 3, 2], device=kiln.gpu(0))).asnumpy()\n"
            "except kiln.ArgumentError as e:\n"
            "    print('refused:', e)\n")
    out = _on_simulated_gpus(code)
    assert "(4,)" in out.stdout
    assert "refused: " in out.stdout, out.stdout
    assert ("one_hot of class labels (softmax_cross_entropy, the losses): label 3 (at position 2 of "
            "the labels) is out of range for 3 classes") in out.stdout, out.stdout


def test_on_a_simulated_gpu_the_label_check_waits_for_nothing_and_raises_at_the_next_sync():
    # The GPU's check of the labels does not make the host wait (a plan with a loss in it is
    # captured into a CUDA graph): it records the first bad label on the device, and the next
    # sync point raises the CPU's error, from a replayed graph too; then the device works on.
    code = textwrap.dedent("""
        import kiln
        from kiln import nd, nn
        g = kiln.gpu(0)

        class Net(nn.HybridBlock):
            def __init__(self):
                super().__init__()
                self.dense = nn.Dense(3)

            def hybrid_forward(self, F, x, y):
                return F.softmax_cross_entropy(self.dense(x), y)

        net = Net()
        net.initialize(ctx=g)
        net.hybridize()
        x = nd.random.normal(shape=(5, 4), device=g)
        y = nd.array([0, 1, 2, 0, 1], device=g)
        for _ in range(4):
            net(x, y).asnumpy()
        kiln.gpu_step_stats()
        net(x, y)
        s = kiln.gpu_step_stats()            # a replay, and the check made the host wait nowhere
        assert s["graph_replays"] == 1 and s["graph_captures"] == 0 and s["host_syncs"] == 0, s
        y[3] = 7                             # the same buffer: the captured graph replays
        try:
            net(x, y).asnumpy()
            print("not raised")
        except kiln.ArgumentError as e:
            print("refused:", e)
        assert kiln.gpu_step_stats()["graph_replays"] == 1
        y[3] = 0
        print(net(x, y).asnumpy().shape)     # raised once: the record was cleared
        y[3] = 7
        net(x, y)                            # nobody reads it: waitall raises it
        try:
            kiln.waitall()
            print("not raised")
        except kiln.ArgumentError as e:
            print("waitall refused:", e)
        kiln.waitall()
        print("ok")
    """)
    out = _on_simulated_gpus(code)
    bad = ("label 7 (at position 3 of the labels) is out of range for 3 classes; labels must be class indices "
           "0 to 2; found by gpu(0)'s check of an earlier one_hot")
    assert out.stdout.count(bad) == 2, out.stdout
    assert "refused:" in out.stdout and "waitall refused:" in out.stdout and "(5,)" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("ok"), out.stdout


def test_on_a_simulated_gpu_an_embeddings_index_check_waits_for_nothing_and_raises_at_the_next_sync():
    # The same for take (an Embedding) and its gradient: a hybridized embedding is captured and
    # replayed with no host sync; an index out of range raises the CPU's error at the next sync,
    # once, from the forward's take or from the backward's take_grad.
    code = textwrap.dedent("""
        import kiln
        from kiln import nd, nn, autograd
        g = kiln.gpu(0)
        net = nn.HybridSequential()
        net.add(nn.Embedding(6, 3), nn.Dense(2))
        net.initialize(ctx=g)
        net.hybridize()
        ix = nd.array([0, 5, 2, 1], device=g)
        for _ in range(4):
            net(ix).asnumpy()
        kiln.gpu_step_stats()
        net(ix)
        s = kiln.gpu_step_stats()
        assert s["graph_replays"] == 1 and s["graph_captures"] == 0 and s["host_syncs"] == 0, s
        ix[2] = 6                                 # the same buffer: the captured graph replays
        try:
            net(ix).asnumpy()
            print("not raised")
        except kiln.ArgumentError as e:
            print("refused:", e)
        ix[2] = 2
        print(net(ix).asnumpy().shape)            # raised once: the record was cleared
        w = nd.array([[1.0, 2.0], [3.0, 4.0]], device=g)
        w.attach_grad()
        with autograd.record():
            y = nd.take(w, nd.array([1, -3], device=g, dtype="int64"), axis=0)
        try:
            y.wait_to_read()                      # the forward's take
            print("not raised")
        except kiln.ArgumentError as e:
            print("forward refused:", e)
        try:
            y.backward()                          # take_grad checks the same indices
            w.grad.asnumpy()
            print("not raised")
        except kiln.ArgumentError as e:
            print("backward refused:", e)
        kiln.waitall()
        print("ok")
    """)
    out = _on_simulated_gpus(code)
    assert ("take: index 6 (at position 2 of the indices) is out of range for axis 0 of size 6; valid indices "
            "are -6 to 5; found by gpu(0)'s check of an earlier take") in out.stdout, out.stdout
    assert out.stdout.count("refused:") == 3 and "(4, 2)" in out.stdout, out.stdout
    bad = "index -3 (at position 1 of the indices) is out of range for axis 0 of size 2"
    assert out.stdout.count(bad) == 2 and "take: " + bad in out.stdout and "take_grad: " + bad in out.stdout, out.stdout
    assert "an earlier take_grad" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("ok"), out.stdout


# ---- Python integers that do not fit the dtype (NumPy 2 raises OverflowError) -----------------

@pytest.mark.parametrize("expr, dtype, value", [
    (lambda: nd.ones(3, dtype='int32') + 2**40, "int32", 2**40),
    (lambda: nd.ones(3, dtype='uint8') + 300, "uint8", 300),
    (lambda: nd.ones(3, dtype='uint8') - (-1), "uint8", -1),
    (lambda: 300 * nd.ones(3, dtype='uint8'), "uint8", 300),
    (lambda: nd.ones(3, dtype='int64') + 2**63, "int64", 2**63),
    (lambda: nd.maximum(nd.ones(3, dtype='uint8'), 256), "uint8", 256),
])
def test_python_integers_out_of_the_dtypes_range_raise(expr, dtype, value):
    with pytest.raises(OverflowError, match=rf"Python integer {value} out of bounds for {dtype}"):
        expr()
    with pytest.raises(kiln.ArgumentError, match="cast the array to a wider dtype"):
        expr()
    assert issubclass(kiln.IntegerOverflowError, (ValueError, OverflowError))


def test_in_place_operators_check_the_integer_too():
    x = nd.ones(3, dtype='uint8')
    with pytest.raises(OverflowError, match="Python integer 300 out of bounds for uint8"):
        x += 300
    np.testing.assert_array_equal(x.asnumpy(), [1, 1, 1])  # untouched


def test_integers_that_fit_and_floats_still_compute():
    np.testing.assert_array_equal((nd.ones(3, dtype='uint8') + 254).asnumpy(), [255] * 3)
    np.testing.assert_array_equal((nd.ones(3, dtype='int32') + (2**31 - 2)).asnumpy(), [2**31 - 1] * 3)
    np.testing.assert_array_equal((nd.ones(3, dtype='int32') * 2.5).asnumpy(), [2.5] * 3)
    np.testing.assert_array_equal((nd.ones(3, dtype='float32') + 2**40).asnumpy(), [2.0**40] * 3)
    np.testing.assert_array_equal((nd.ones(3, dtype='bool') + 2**40).asnumpy(), [2**40 + 1] * 3)  # int64
    np.testing.assert_array_equal((nd.ones(3, dtype='uint8') == 300).asnumpy(), [False] * 3)


# ---- smaller argument checks ---------------------------------------------------------------------

def test_a_convolution_with_a_zero_sized_kernel_is_refused():
    x, w = nd.ones((1, 1, 4, 4)), nd.ones((1, 1, 0, 3))
    with pytest.raises(kiln.ShapeError, match=r"the kernel must be at least 1x1, found weight \(1, 1, 0, 3\)"):
        nd.conv2d(x, w).asnumpy()
    with pytest.raises(kiln.ShapeError, match="KH, KW >= 1"):
        nd.Convolution(data=x, weight=nd.ones((2, 1, 3, 0)), kernel=(3, 0), num_filter=2, no_bias=True)


def test_random_draws_refuse_reversed_or_negative_parameters():
    with pytest.raises(kiln.ArgumentError, match="expected finite bounds with low <= high, found low=1, high=0"):
        nd.random.uniform(1, 0)
    with pytest.raises(kiln.ArgumentError, match=r"expected a finite mean and a finite scale \(std\) >= 0"):
        nd.random.normal(0, -1, shape=(3,))
    assert float(nd.random.uniform(2, 2).asnumpy()[0]) == 2.0  # an empty range of one value is fine
    assert (nd.random.normal(3, 0, shape=(4,)).asnumpy() == 3).all()


def test_len_and_iteration_of_a_0d_array_raise_type_error_as_numpy():
    x = nd.array(5.0).reshape(())
    assert x.shape == ()
    with pytest.raises(TypeError, match="len\\(\\) of unsized object"):
        len(x)
    with pytest.raises(TypeError, match="iteration over a 0-d array"):
        iter(x)
    with pytest.raises(TypeError, match="iteration over a 0-d array"):
        list(x)
    rows = list(nd.array([[1, 2], [3, 4]]))
    assert [r.asnumpy().tolist() for r in rows] == [[1, 2], [3, 4]]
    assert len(nd.zeros((3, 2))) == 3


@pytest.mark.parametrize("bad", [2.5, "2", True, 0, -1])
def test_dataloader_refuses_a_batch_size_that_is_not_a_positive_integer(bad):
    data = ArrayDataset(np.arange(10, dtype=np.float32))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got"):
        DataLoader(data, batch_size=bad)
    assert len(DataLoader(data, batch_size=np.int64(4))) == 3


def test_mark_variables_checks_the_gradients_count_shape_and_dtype():
    x, y = nd.ones((2, 3)), nd.ones(4)
    with pytest.raises(kiln.ArgumentError, match="2 variables but 1 gradients"):
        autograd.mark_variables([x, y], [nd.zeros((2, 3))])
    with pytest.raises(kiln.ShapeError, match=r"gradients\[1\] has shape \(5,\) but variables\[1\] has shape \(4,\)"):
        autograd.mark_variables([x, y], [nd.zeros((2, 3)), nd.zeros(5)])
    with pytest.raises(kiln.DTypeError, match=r"gradients\[0\] has dtype float64 but variables\[0\] has dtype float32"):
        autograd.mark_variables([x], [nd.zeros((2, 3), dtype='float64')])
    with pytest.raises(kiln.ArgumentError, match="2 variables but 3 grad_reqs"):
        autograd.mark_variables([x, y], None, ["write"] * 3)
    autograd.mark_variables([x, y], [nd.zeros((2, 3)), nd.full(4, 10.0)], ["write", "add"])
    with autograd.record():
        z = (x * 2).sum() + (y * 3).sum()
    z.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(y.grad.asnumpy(), np.full(4, 13.0))  # 'add' starts from the given values


def test_kiln_run_refuses_a_repeat_count_it_cannot_hold(tmp_path):
    tool = os.path.join(os.path.dirname(_BUILD_PYTHON), "tools", "kiln-run")
    assert os.path.exists(tool), f"{tool} is built with the project (tools/); build it first"
    sym = tmp_path / "s-symbol.json"
    sym.write_text("{}")
    out = subprocess.run([tool, str(sym), "--repeat", "9223372036854775807"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "--repeat expects an integer from 1 to 100000000" in out.stderr, out.stderr
    assert "vector::reserve" not in out.stderr


# ---- deeply nested JSON ---------------------------------------------------------------------------

def test_a_symbol_file_that_nests_arrays_deeply_is_a_format_error(tmp_path):
    path = tmp_path / "deep-symbol.json"
    path.write_text('{"format": "kiln-graph", "nodes": ' + "[" * 200000 + "]" * 200000 + "}")
    with pytest.raises(kiln.FormatError, match="nest deeper than the limit of 128 levels"):
        kiln.nn.SymbolBlock.imports(str(path), ["data"])


def test_a_params_header_that_nests_arrays_deeply_is_a_format_error(tmp_path):
    header = ('{"w": {"dtype": "F32", "shape": ' + "[" * 100000 + "]" * 100000 + ', "data_offsets": [0, 0]}}').encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    path = tmp_path / "deep.params"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    net = kiln.nn.Dense(2, in_units=2)
    with pytest.raises(kiln.FormatError, match="nest deeper than the limit of 128 levels"):
        net.load_parameters(str(path))


def test_params_metadata_nested_without_end_is_a_format_error(tmp_path):
    import json
    from kiln import nn
    net = nn.HybridSequential()
    net.add(nn.Dense(2, in_units=3))
    net.initialize()
    net.hybridize()
    net(nd.ones((1, 3)))
    sym_file, param_file = net.export(str(tmp_path / "m"))
    blob = open(param_file, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.setdefault("__metadata__", {})["kiln.grad_req_null"] = "[" * 100000 + "]" * 100000
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(param_file, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob[8 + n:])
    with pytest.raises(kiln.FormatError, match="must be a JSON list of names"):
        nn.SymbolBlock.imports(sym_file, ["data"], param_file)
