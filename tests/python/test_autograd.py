"""kiln.autograd: recording scopes, gradient buffers, backward/grad, and gradients of composite
expressions against central finite differences in float64."""
import numpy as np
import pytest

import kiln
from kiln import autograd, nd


def _var(a, req="write"):
    x = nd.array(np.asarray(a, dtype=np.float64))
    x.attach_grad(req)
    return x


# ---- scopes ----

def test_record_pause_and_modes():
    assert not autograd.is_recording() and not autograd.is_training()
    with autograd.record():
        assert autograd.is_recording() and autograd.is_training()
        with autograd.pause():
            assert not autograd.is_recording() and not autograd.is_training()
        with autograd.pause(train_mode=True):
            assert autograd.is_training()
        assert autograd.is_recording()
    assert not autograd.is_recording()
    with autograd.record(train_mode=False):
        assert autograd.is_recording() and not autograd.is_training()
    with autograd.train_mode():
        assert autograd.is_training() and not autograd.is_recording()
        with autograd.predict_mode():
            assert not autograd.is_training()
    assert not autograd.is_training()


def test_scope_exits_on_exception():
    with pytest.raises(RuntimeError):
        with autograd.record():
            raise RuntimeError("boom")
    assert not autograd.is_recording()


def test_ops_outside_record_are_not_differentiated():
    x = _var([1.0, 2.0])
    y = (x * x).sum()
    with pytest.raises(kiln.StateError, match="autograd.record"):
        y.backward()


# ---- gradient buffers ----

def test_attach_grad_write_add_null():
    x = _var([1.0, 2.0, 3.0])
    assert x.grad_req == "write"
    np.testing.assert_array_equal(x.grad.asnumpy(), [0, 0, 0])
    for _ in range(2):
        with autograd.record():
            y = (x * x).sum()
        y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [2, 4, 6])  # write: overwritten, not summed

    x.attach_grad("add")
    assert x.grad_req == "add"
    for _ in range(3):
        with autograd.record():
            y = (x * 3).sum()
        y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [9, 9, 9])

    x.attach_grad("null")
    assert x.grad is None and x.grad_req == "null"
    with pytest.raises(kiln.ArgumentError, match="grad_req"):
        x.attach_grad("sometimes")


def test_mark_variables():
    a, b = nd.ones((2,), dtype="float64"), nd.ones((2,), dtype="float64")
    autograd.mark_variables([a, b], grad_reqs=["write", "add"])
    assert (a.grad_req, b.grad_req) == ("write", "add")


# ---- backward and grad ----

def test_backward_with_head_grads_and_retain_graph():
    x = _var([1.0, 2.0, 3.0])
    with autograd.record():
        y = x * x
    y.backward(nd.array(np.array([1.0, 0.0, 2.0])), retain_graph=True)
    np.testing.assert_allclose(x.grad.asnumpy(), [2, 0, 12])
    y.backward()  # the retained graph runs again, with ones as the head gradient
    np.testing.assert_allclose(x.grad.asnumpy(), [2, 4, 6])
    with pytest.raises(kiln.StateError, match="retain_graph"):
        y.backward()


def test_backward_several_heads():
    x = _var([1.0, 2.0])
    with autograd.record():
        y1 = (x * 2).sum()
        y2 = (x * x).sum()
    autograd.backward([y1, y2])
    np.testing.assert_allclose(x.grad.asnumpy(), [4, 6])
    with autograd.record():
        z = x * 1
    autograd.backward(z, head_grads=nd.array(np.array([3.0, 5.0])))
    np.testing.assert_allclose(x.grad.asnumpy(), [3, 5])
    with pytest.raises(ValueError, match="head gradients"):
        autograd.backward([z], [nd.ones((2,)), nd.ones((2,))])


def test_grad_returns_gradients_without_touching_dot_grad():
    x, w = _var([1.0, 2.0]), _var([3.0, -1.0])
    with autograd.record():
        y = (nd.exp(x) * w).sum()
    gx, gw = autograd.grad(y, [x, w], retain_graph=True)
    np.testing.assert_allclose(gx.asnumpy(), np.exp([1.0, 2.0]) * [3.0, -1.0])
    np.testing.assert_allclose(gw.asnumpy(), np.exp([1.0, 2.0]))
    np.testing.assert_array_equal(x.grad.asnumpy(), [0, 0])
    single = autograd.grad(y, x)  # one variable in, one gradient out
    np.testing.assert_allclose(single.asnumpy(), gx.asnumpy())
    with pytest.raises(NotImplementedError):
        autograd.grad(y, x, create_graph=True)


def test_detach_and_stop_gradient_cut_the_graph():
    x = _var([2.0])
    with autograd.record():
        y = (x * x.detach() + nd.stop_gradient(x) * x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [4.0])


# ---- composites vs finite differences ----

def _fd_grad(f, a, eps=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        hi, lo = a.copy(), a.copy()
        hi[i] += eps
        lo[i] -= eps
        g[i] = (f(nd.array(hi)).item() - f(nd.array(lo)).item()) / (2 * eps)
    return g


COMPOSITES = {
    "sigmoid_tanh_ratio": lambda x: (nd.sigmoid(x) * nd.tanh(x) / (1 + x ** 2)).sum(),
    "softmax_weighted": lambda x: (nd.softmax(x, axis=-1) * nd.array(np.arange(12.0).reshape(3, 4))).sum(),
    "log_softmax_mean": lambda x: nd.log_softmax(x, axis=0).mean(),
    "cross_entropy": lambda x: nd.softmax_cross_entropy(x, nd.array(np.array([0, 3, 1]))).sum(),
    "slices_and_broadcast": lambda x: (x[1:, ::-1] * x[:-1, :1] - x.mean(axis=0, keepdims=True)).sum(),
    "matmul_transpose_reshape": lambda x: (nd.matmul(x, x.T) * 0.1).reshape(-1).max(),
    "exp_log_sqrt": lambda x: (nd.log(nd.exp(x) + 1) * nd.sqrt(x * x + 1)).sum(),
    "power_and_scalar_ops": lambda x: ((2.0 - x) ** 2 / 3.0 + 1.5 * x).sum(),
}


@pytest.mark.parametrize("name", list(COMPOSITES))
def test_composite_gradient_matches_finite_differences(name):
    f = COMPOSITES[name]
    a = np.random.RandomState(1).uniform(-1, 1, size=(3, 4))
    x = nd.array(a)
    x.attach_grad()
    with autograd.record():
        y = f(x)
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), _fd_grad(f, a), rtol=1e-5, atol=1e-7, err_msg=name)


def test_separate_backward_per_device_loss():
    # d2l's multi-device training records one loss per device in one scope, then calls backward
    # on each: every backward frees only its own computation and writes only its own leaves.
    devices = [kiln.cpu(0), kiln.cpu(1)]
    ws = [nd.array(np.array([1.0, 2.0, 3.0], np.float32), device=d) for d in devices]
    for w in ws:
        w.attach_grad()
    with autograd.record():
        losses = [((w * (i + 2)) ** 2).sum() for i, w in enumerate(ws)]  # relu-free; constants per device
        hidden = [(nd.relu(w - 1.5) * w).sum() for w in ws]
    for l in losses:
        l.backward()
    np.testing.assert_allclose(ws[0].grad.asnumpy(), 2 * 4 * np.array([1, 2, 3]))
    np.testing.assert_allclose(ws[1].grad.asnumpy(), 2 * 9 * np.array([1, 2, 3]))
    assert ws[0]._fresh_grad and ws[1]._fresh_grad
    with pytest.raises(kiln.StateError, match="already freed"):
        losses[0].backward()
    hidden[1].backward()  # still whole: only the losses' graphs were freed, the leaves stay
    np.testing.assert_allclose(ws[1].grad.asnumpy(), [0, 2 * 2 - 1.5, 2 * 3 - 1.5])
    np.testing.assert_allclose(ws[0].grad.asnumpy(), 2 * 4 * np.array([1, 2, 3]))  # untouched


def test_two_losses_sharing_a_hidden_value_backward_one_after_the_other():
    w = nd.array(np.array([1.0, -2.0, 3.0], np.float32))
    w.attach_grad(grad_req="add")
    x = nd.array(np.array([2.0, 2.0, 2.0], np.float32))
    with autograd.record():
        h = nd.relu(w * x)
        l1 = (h * 3).sum()
        l2 = (h * h).sum()
        l3 = (w * w).sum()
    l1.backward()
    l2.backward()  # h and what it came from are shared with l1: still there
    l3.backward()
    hx = np.maximum(np.array([1.0, -2.0, 3.0]) * 2, 0)
    expected = (hx > 0) * 2 * 3 + (hx > 0) * 2 * 2 * hx + 2 * np.array([1.0, -2.0, 3.0])
    np.testing.assert_allclose(w.grad.asnumpy(), expected, rtol=1e-6)
    with pytest.raises(kiln.StateError, match="already freed"):
        l2.backward()


def test_backward_marks_every_used_leaf_fresh():
    a, b = nd.ones(3), nd.ones(3)
    a.attach_grad(), b.attach_grad()
    with autograd.record():
        l = (a * 2).sum() + nd.stop_gradient(b).sum()
    l.backward()
    assert a._fresh_grad and b._fresh_grad  # b took part, its gradient is zero
    np.testing.assert_array_equal(b.grad.asnumpy(), 0)
