"""kiln.loss: values against torch / NumPy formulas, gradients against torch, sample weights."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import autograd, loss, nd


def _value_and_grad(loss_fn, pred, *args, **kwargs):
    """kiln's per-sample loss and d(sum of loss)/d(pred)."""
    p = nd.array(pred)
    p.attach_grad()
    with autograd.record():
        out = loss_fn(p, *args, **kwargs)
        total = out.sum()
    total.backward()
    return out.asnumpy(), p.grad.asnumpy()


def _torch_value_and_grad(fn, pred):
    t = torch.tensor(pred, requires_grad=True)
    out = fn(t)
    out.sum().backward()
    return out.detach().numpy(), t.grad.numpy()


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_softmax_ce_sparse_matches_torch():
    logits = np.random.randn(6, 5).astype(np.float32) * 3
    labels = np.array([0, 4, 2, 2, 1, 3])
    out, grad = _value_and_grad(loss.SoftmaxCrossEntropyLoss(), logits, nd.array(labels))
    ref, ref_grad = _torch_value_and_grad(
        lambda t: F.cross_entropy(t, torch.from_numpy(labels), reduction="none"), logits)
    assert out.shape == (6,)
    _close(out, ref)
    _close(grad, ref_grad)


def test_softmax_ce_dense_labels_and_from_logits():
    logits = np.random.randn(4, 3).astype(np.float32)
    target = np.random.dirichlet(np.ones(3), size=4).astype(np.float32)
    log_p = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
    ref = -(log_p * target).sum(-1)
    dense, _ = _value_and_grad(loss.SoftmaxCrossEntropyLoss(sparse_label=False), logits, nd.array(target))
    _close(dense, ref)
    from_logits, grad = _value_and_grad(loss.SoftmaxCrossEntropyLoss(from_logits=True), log_p,
                                        nd.array([0, 1, 2, 0]))
    _close(from_logits, -log_p[np.arange(4), [0, 1, 2, 0]])
    expected_grad = np.zeros_like(log_p)
    expected_grad[np.arange(4), [0, 1, 2, 0]] = -1
    _close(grad, expected_grad)


def test_softmax_ce_class_axis_1_and_sequence_mean():
    # (batch, classes, time): the loss is the mean over time of the per-position cross-entropy.
    logits = np.random.randn(2, 4, 3).astype(np.float32)
    labels = np.random.randint(0, 4, size=(2, 3))
    ref = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels), reduction="none").numpy()
    for from_logits in (False, True):
        pred = torch.log_softmax(torch.from_numpy(logits), 1).numpy() if from_logits else logits
        out, _ = _value_and_grad(loss.SoftmaxCrossEntropyLoss(axis=1, from_logits=from_logits),
                                 pred, nd.array(labels))
        _close(out, ref.mean(axis=1))


def test_softmax_ce_rejects_mismatched_labels():
    with pytest.raises(kiln.ShapeError, match="class indices of shape"):
        loss.SoftmaxCrossEntropyLoss()(nd.zeros((4, 3)), nd.zeros((5,)))


def test_l2_and_l1_match_formulas_and_gradients():
    pred = np.random.randn(5, 3, 2).astype(np.float32)
    label = np.random.randn(5, 3, 2).astype(np.float32)
    out, grad = _value_and_grad(loss.L2Loss(), pred, nd.array(label))
    _close(out, (0.5 * (pred - label) ** 2).mean(axis=(1, 2)))
    _close(grad, (pred - label) / 6)
    out, grad = _value_and_grad(loss.L1Loss(), pred, nd.array(label))
    _close(out, np.abs(pred - label).mean(axis=(1, 2)))
    _close(grad, np.sign(pred - label) / 6)


def test_l2_reshapes_label_like_pred():
    out = loss.L2Loss()(nd.array([[1.0], [2.0]]), nd.array([0.0, 0.0])).asnumpy()
    _close(out, [0.5, 2.0])


@pytest.mark.parametrize("scale", [1.0, 40.0])  # 40: exp(40) would overflow a naive formula
def test_sigmoid_bce_matches_torch_and_is_stable(scale):
    logits = (np.random.randn(4, 6) * scale).astype(np.float32)
    labels = np.random.randint(0, 2, size=(4, 6)).astype(np.float32)
    out, grad = _value_and_grad(loss.SigmoidBinaryCrossEntropyLoss(), logits, nd.array(labels))
    ref, ref_grad = _torch_value_and_grad(
        lambda t: F.binary_cross_entropy_with_logits(t, torch.from_numpy(labels),
                                                     reduction="none").mean(1), logits)
    assert np.all(np.isfinite(out))
    _close(out, ref, 1e-4)
    _close(grad, ref_grad, 1e-5)


def test_sigmoid_bce_pos_weight_and_from_sigmoid():
    logits = np.random.randn(3, 4).astype(np.float32)
    labels = np.random.randint(0, 2, size=(3, 4)).astype(np.float32)
    pos_weight = np.array([1.0, 2.0, 0.5, 3.0], np.float32)
    out, _ = _value_and_grad(loss.SigmoidBCELoss(), logits, nd.array(labels),
                             pos_weight=nd.array(pos_weight))
    ref = F.binary_cross_entropy_with_logits(torch.from_numpy(logits), torch.from_numpy(labels),
                                             pos_weight=torch.from_numpy(pos_weight), reduction="none")
    _close(out, ref.numpy().mean(1), 1e-4)
    probs = 1 / (1 + np.exp(-logits))
    out, _ = _value_and_grad(loss.SigmoidBCELoss(from_sigmoid=True), probs, nd.array(labels))
    _close(out, -(labels * np.log(probs) + (1 - labels) * np.log(1 - probs)).mean(1), 1e-4)


def test_sample_weight_and_weight():
    pred = np.random.randn(4, 3).astype(np.float32)
    label = np.zeros((4, 3), np.float32)
    base = (0.5 * pred ** 2).mean(1)
    sw = np.array([1.0, 0.0, 2.0, 0.5], np.float32)
    l2 = loss.L2Loss()
    _close(l2(nd.array(pred), nd.array(label), nd.array(sw)).asnumpy(), base * sw)
    _close(l2(nd.array(pred), nd.array(label), nd.array(sw[:, None])).asnumpy(), base * sw)
    _close(loss.L2Loss(weight=4.0)(nd.array(pred), nd.array(label)).asnumpy(), base * 4)
    ce = loss.SoftmaxCrossEntropyLoss()
    labels = nd.array([0, 1, 2, 0])
    unweighted = ce(nd.array(pred), labels).asnumpy()
    _close(ce(nd.array(pred), labels, nd.array(sw[:, None])).asnumpy(), unweighted * sw)


def test_loss_batch_axis():
    pred = np.random.randn(3, 5).astype(np.float32)
    out = loss.L1Loss(batch_axis=1)(nd.array(pred), nd.zeros((3, 5))).asnumpy()
    _close(out, np.abs(pred).mean(axis=0))


def _dense(n):
    net = kiln.nn.HybridSequential()
    net.add(kiln.nn.Dense(n, in_units=4))
    net.initialize(init=kiln.init.Xavier())
    return net


@pytest.mark.parametrize("make, label", [
    (lambda: loss.SoftmaxCrossEntropyLoss(), lambda rng: rng.integers(0, 5, 6).astype(np.float32)),
    (lambda: loss.SoftmaxCrossEntropyLoss(sparse_label=False, weight=0.5),
     lambda rng: rng.dirichlet(np.ones(5), 6).astype(np.float32)),
    (lambda: loss.SoftmaxCrossEntropyLoss(from_logits=True), lambda rng: rng.integers(0, 5, 6).astype(np.float32)),
    (lambda: loss.L2Loss(), lambda rng: rng.standard_normal((6, 5)).astype(np.float32)),
    (lambda: loss.L1Loss(), lambda rng: rng.standard_normal((6, 5)).astype(np.float32)),
    (lambda: loss.SigmoidBCELoss(), lambda rng: (rng.random((6, 5)) > 0.5).astype(np.float32)),
])
def test_a_loss_over_a_hybridized_blocks_output_compiles_itself_with_the_eager_values_and_gradients(make, label):
    # d2l's loop does not hybridize the loss: `l = loss(net(X), y)` with net hybridized. The loss
    # then runs as one compiled plan (its backward inlined with the network's), with the eager
    # loss's values and the parameters' gradients, sample weights included.
    rng = np.random.default_rng(3)
    X, y = nd.array(rng.standard_normal((6, 4)).astype(np.float32)), nd.array(label(rng))
    w = nd.array(rng.random(6).astype(np.float32))
    results = []
    for compiled in (True, False):
        net = _dense(5)
        net.hybridize()
        params = net.collect_params()
        for p in params.values():  # the same parameters in both runs
            p.set_data(nd.array(np.arange(p.data().size, dtype=np.float32).reshape(p.shape) * 0.01 - 0.1))
        l_fn = make()
        if not compiled:
            l_fn.hybridize(False)
        out = []
        for args in ((y,), (y, w), (y, None)):
            with autograd.record():
                l = l_fn(net(X), *args)
            l.backward()
            out.append((l.asnumpy(), [p.grad().asnumpy().copy() for p in params.values()]))
        if compiled:
            assert "plan" in str(l_fn.compile_report()).lower()
        else:
            with pytest.raises(kiln.StateError):
                l_fn.compile_report()
        results.append(out)
    for (a, ga), (b, gb) in zip(*results):
        _close(a, b)
        for x, z in zip(ga, gb):
            _close(x, z)


def test_a_loss_stays_eager_outside_record_and_over_eager_inputs():
    net = _dense(5)
    net.hybridize()
    X, y = nd.ones((2, 4)), nd.array([1.0, 2.0])
    l_fn = loss.SoftmaxCrossEntropyLoss()
    l_fn(net(X), y)                         # not recording: an evaluation loop's loss
    with autograd.record():
        l_fn(_dense(5)(X), y)               # the prediction of an eager block
    with pytest.raises(kiln.StateError):
        l_fn.compile_report()
    with autograd.record():
        l_fn(net(X), y)
    l_fn.compile_report()


def test_a_users_loss_subclass_stays_eager_unless_hybridized():
    class Branchy(loss.Loss):  # branches on a value: a trace could not follow it
        def forward(self, pred, label):
            d = pred - label
            return (d * d).mean(axis=1) if d.sum().item() > 0 else d.abs().mean(axis=1)

    net = _dense(2)
    net.hybridize()
    l_fn = Branchy()
    with autograd.record():
        l = l_fn(net(nd.ones((3, 4))), nd.zeros((3, 2)))
    l.backward()
    assert l.shape == (3,)
    with pytest.raises(kiln.StateError):
        l_fn.compile_report()


def test_a_compiled_loss_rejects_a_class_index_out_of_range_as_the_eager_one_does():
    net = _dense(5)
    net.hybridize()
    X = nd.ones((2, 4))
    l_fn = loss.SoftmaxCrossEntropyLoss(from_logits=True)
    with autograd.record():
        l_fn(net(X), nd.array([1.0, 2.0])).wait_to_read()
    l_fn.compile_report()
    with pytest.raises(kiln.ArgumentError, match="label 5 .*out of range for 5 classes"):
        with autograd.record():
            l_fn(net(X), nd.array([1.0, 5.0])).wait_to_read()
