"""kiln.optim and kiln.Trainer: fused SGD/Adam/AdamW against torch.optim and a NumPy reference of
MXNet's SGD, Trainer semantics (batch-size rescaling, learning-rate setter, grad_req 'null',
several devices), errors, and one engine task per device per step."""
import numpy as np
import pytest
import torch

import kiln
from kiln import _C, nd, optim


class Param:
    """A stand-in for kiln.nn.Parameter with the interface the Trainer relies on."""

    def __init__(self, name, value, grad_req="write", lr_mult=1.0, wd_mult=1.0, devices=(None,)):
        self.name, self.grad_req, self.lr_mult, self.wd_mult = name, grad_req, lr_mult, wd_mult
        self._data = []
        for d in devices:
            a = nd.array(np.asarray(value, dtype=np.float32), device=d or kiln.cpu())
            if grad_req != "null":
                a.attach_grad(grad_req)
            self._data.append(a)

    def list_data(self):
        return list(self._data)

    def list_grad(self):
        return [a.grad for a in self._data] if self.grad_req != "null" else []

    def data(self):
        return self._data[0]

    def grad(self):
        return self._data[0].grad

    def set_grad(self, g, device=0):
        nd.array(np.asarray(g, dtype=np.float32), device=self._data[device].device).copyto(
            self._data[device].grad)
        self._data[device]._fresh_grad = True  # written by hand, not by backward (as in Gluon)


SHAPES = [(4, 3), (3,), (1,), (2, 2, 5)]
STEPS = 5


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    gs = [[(3 * rng.standard_normal(s)).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    return ws, gs


def _run_trainer(opt, ws, gs, batch_size=1):
    params = [Param(f"p{i}", w) for i, w in enumerate(ws)]
    trainer = kiln.Trainer({p.name: p for p in params}, opt)
    for step in gs:
        for p, g in zip(params, step):
            p.set_grad(g)
        trainer.step(batch_size)
    return [p.data().asnumpy() for p in params]


def _run_torch(make, ws, gs):
    ts = [torch.tensor(w, requires_grad=True) for w in ws]
    opt = make(ts)
    for step in gs:
        for t, g in zip(ts, step):
            t.grad = torch.tensor(g)
        opt.step()
    return [t.detach().numpy() for t in ts]


def _numpy_mxnet_sgd(ws, gs, lr, momentum, wd, rescale=1.0, clip=None):
    ws = [w.astype(np.float64) for w in ws]
    moms = [np.zeros_like(w) for w in ws]
    for step in gs:
        for i, g in enumerate(step):
            g = rescale * g.astype(np.float64)
            if clip is not None:
                g = np.clip(g, -clip, clip)
            g = g + wd * ws[i]
            if momentum:
                moms[i] = momentum * moms[i] - lr * g
                ws[i] = ws[i] + moms[i]
            else:
                ws[i] = ws[i] - lr * g
    return ws


def _close(got, want, rtol=1e-5, atol=1e-6):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ---- against references ----

@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.0, 0.01), (0.9, 0.0), (0.9, 0.01)])
def test_sgd_matches_mxnet_formula(momentum, wd):
    ws, gs = _problem()
    got = _run_trainer(optim.SGD(learning_rate=0.1, momentum=momentum, wd=wd), ws, gs)
    _close(got, _numpy_mxnet_sgd(ws, gs, 0.1, momentum, wd))


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.0, 0.01), (0.9, 0.01)])
def test_sgd_matches_torch(momentum, wd):
    # With a constant learning rate MXNet's momentum (mom = m*mom - lr*g) equals torch's
    # (buf = m*buf + g, w -= lr*buf) up to rounding.
    ws, gs = _problem(1)
    got = _run_trainer(optim.SGD(learning_rate=0.1, momentum=momentum, wd=wd), ws, gs)
    want = _run_torch(lambda ts: torch.optim.SGD(ts, lr=0.1, momentum=momentum, weight_decay=wd), ws, gs)
    _close(got, want)


def test_sgd_clip_gradient():
    ws, gs = _problem(2)
    got = _run_trainer(optim.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, clip_gradient=0.5), ws, gs)
    _close(got, _numpy_mxnet_sgd(ws, gs, 0.1, 0.9, 0.01, clip=0.5))


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_matches_torch(wd):
    ws, gs = _problem(3)
    got = _run_trainer(optim.Adam(learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-7, wd=wd), ws, gs)
    want = _run_torch(lambda ts: torch.optim.Adam(ts, lr=0.01, betas=(0.8, 0.99), eps=1e-7, weight_decay=wd),
                      ws, gs)
    _close(got, want)


def test_adamw_matches_torch():
    ws, gs = _problem(4)
    got = _run_trainer(optim.create("adamw", learning_rate=0.01, wd=0.1), ws, gs)
    want = _run_torch(lambda ts: torch.optim.AdamW(ts, lr=0.01, weight_decay=0.1), ws, gs)
    _close(got, want)


def test_create_names_and_defaults():
    assert isinstance(optim.create("SGD"), optim.SGD)
    adam = optim.create("adam")
    assert isinstance(adam, optim.Adam) and adam.learning_rate == 0.001 and adam.beta2 == 0.999
    assert isinstance(optim.create("adamw"), optim.AdamW)
    assert optim.SGD().learning_rate == 0.01
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        optim.create("rmsprop")


# ---- Trainer ----

def test_step_rescales_by_batch_size():
    ws, gs = _problem(5)
    got = _run_trainer(optim.SGD(learning_rate=0.1, momentum=0.9), ws, gs, batch_size=8)
    _close(got, _numpy_mxnet_sgd(ws, gs, 0.1, 0.9, 0.0, rescale=1 / 8))
    # the batch size rescales Adam's gradient too (Adam is not scale-invariant with epsilon large)
    ws, gs = _problem(6)
    got = _run_trainer(optim.Adam(learning_rate=0.01, epsilon=0.5), ws, gs, batch_size=4)
    gs4 = [[g / 4 for g in step] for step in gs]
    _close(got, _run_torch(lambda ts: torch.optim.Adam(ts, lr=0.01, eps=0.5), ws, gs4))


def test_learning_rate_setter_takes_effect():
    p = Param("w", np.ones(3))
    trainer = kiln.Trainer([p], "sgd", {"learning_rate": 0.5})
    assert trainer.learning_rate == 0.5
    p.set_grad(np.ones(3))
    trainer.step(1)
    trainer.set_learning_rate(0.25)
    assert trainer.learning_rate == 0.25
    p.set_grad(np.ones(3))
    trainer.step(1)
    np.testing.assert_allclose(p.data().asnumpy(), 1 - 0.5 - 0.25)


def test_lr_scheduler_and_mults():
    sched = lambda n: 0.1 / n  # noqa: E731  step n (from 1) uses 0.1 / n
    a = Param("a", np.ones(2), lr_mult=2.0)
    b = Param("b", np.ones(2), wd_mult=0.0)
    trainer = kiln.Trainer([a, b], optim.SGD(learning_rate=0.1, wd=0.5, lr_scheduler=sched))
    for _ in range(2):
        a.set_grad(np.zeros(2)), b.set_grad(np.ones(2))
        trainer.step(1)
    wa = 1.0
    for n in (1, 2):
        wa -= 2 * (0.1 / n) * 0.5 * wa
    np.testing.assert_allclose(a.data().asnumpy(), wa, rtol=1e-6)
    np.testing.assert_allclose(b.data().asnumpy(), 1 - 0.1 - 0.05, rtol=1e-6)


def test_null_grad_req_untouched():
    frozen = Param("frozen", np.full(3, 2.0), grad_req="null")
    live = Param("live", np.ones(3))
    trainer = kiln.Trainer([frozen, live], optim.Adam(learning_rate=0.1))
    live.set_grad(np.ones(3))
    trainer.step(1)
    np.testing.assert_array_equal(frozen.data().asnumpy(), np.full(3, 2.0, np.float32))
    assert not np.allclose(live.data().asnumpy(), 1.0)


def test_one_engine_task_per_step_per_device():
    params = [Param(f"p{i}", np.ones(s)) for i, s in enumerate(SHAPES * 5)]
    trainer = kiln.Trainer(params, optim.SGD(learning_rate=0.1, momentum=0.9))
    def mark():  # gradients written by hand count as fresh, as after a backward
        for p in params:
            p.data()._fresh_grad = True
    for p in params:
        p.set_grad(np.ones(p.data().shape))
    trainer.step(1)  # creates the momentum states
    for opt in (optim.Adam(), optim.AdamW()):
        t2 = kiln.Trainer(params, opt)
        mark()
        t2.step(1)
    kiln.waitall()
    for t in (trainer, t2):
        mark()
        before = _C.engine_stats()["pushed"]
        t.step(2)
        assert _C.engine_stats()["pushed"] - before == 1
        kiln.waitall()


def test_several_devices_allreduce_and_one_task_each():
    devices = (kiln.cpu(0), kiln.cpu(1))
    p = Param("w", np.zeros(4), devices=devices)
    trainer = kiln.Trainer([p], optim.SGD(learning_rate=1.0))
    p.set_grad(np.ones(4), 0), p.set_grad(2 * np.ones(4), 1)
    kiln.waitall()
    before = _C.engine_stats()["pushed"]
    trainer.update(2)  # no allreduce: each copy follows its own gradient, one task per device
    assert _C.engine_stats()["pushed"] - before == 2
    np.testing.assert_allclose(p.list_data()[0].asnumpy(), -0.5)
    np.testing.assert_allclose(p.list_data()[1].asnumpy(), -1.0)
    p.set_grad(np.ones(4), 0), p.set_grad(2 * np.ones(4), 1)  # a step consumes its gradients
    trainer.step(2)  # summed gradients (3) on both
    np.testing.assert_allclose(p.list_data()[0].asnumpy(), -0.5 - 1.5)
    np.testing.assert_allclose(p.list_data()[1].asnumpy(), -1.0 - 1.5)
    np.testing.assert_allclose(p.list_grad()[0].asnumpy(), 3.0)


def test_save_and_load_states(tmp_path):
    ws, gs = _problem(7)
    params = [Param(f"p{i}", w) for i, w in enumerate(ws)]
    trainer = kiln.Trainer(params, optim.Adam(learning_rate=0.01))
    for step in gs[:2]:
        for p, g in zip(params, step):
            p.set_grad(g)
        trainer.step(1)
    trainer.save_states(str(tmp_path / "t.states"))
    other = kiln.Trainer(params, optim.Adam(learning_rate=0.01))
    other.load_states(str(tmp_path / "t.states"))
    for step in gs[2:]:
        for p, g in zip(params, step):
            p.set_grad(g)
        other.step(1)
    _close([p.data().asnumpy() for p in params],
           _run_torch(lambda ts: torch.optim.Adam(ts, lr=0.01), ws, gs))


# ---- errors ----

def test_bad_inputs_are_kiln_errors():
    w = [nd.ones((2, 3)), nd.ones((3,))]
    with pytest.raises(kiln.ShapeError,
                       match=r"parameter 1 has shape \(4,\) but its weight has shape \(3,\)"):
        _C.sgd_update(w, [nd.ones((2, 3)), nd.ones((4,))], [], 0.1)
    assert issubclass(kiln.ShapeError, ValueError) and issubclass(kiln.DTypeError, TypeError)
    with pytest.raises(TypeError, match="parameter 1 has dtype float64"):
        _C.adam_update(w, [nd.ones((2, 3)), nd.ones((3,), dtype="float64")], w, w, 0.1)
    with pytest.raises(kiln.DTypeError, match="int32.*expected float32 or float64"):
        _C.sgd_update([nd.ones((2,), dtype="int32")], [nd.ones((2,), dtype="int32")], [], 0.1)
    with pytest.raises(kiln.DeviceError, match="cpu\\(1\\)"):
        _C.sgd_update(w, [nd.ones((2, 3)), nd.ones((3,), device=kiln.cpu(1))], [], 0.1)
    with pytest.raises(kiln.ArgumentError, match="not contiguous"):
        _C.sgd_update([nd.ones((2, 3)).T], [nd.ones((3, 2))], [], 0.1)
    with pytest.raises(ValueError, match="2 weights but 1 gradient"):
        _C.sgd_update(w, w[:1], [], 0.1)
    with pytest.raises(ValueError, match="momentum"):
        _C.sgd_update(w, w, [], 0.1, momentum=0.9)


def test_trainer_rejects_bad_arguments():
    with pytest.raises(TypeError, match="Parameter"):
        kiln.Trainer([nd.ones(2)], "sgd")
    p = Param("w", np.ones(2))
    with pytest.raises(ValueError, match="listed twice"):
        kiln.Trainer([p, p], "sgd")
    with pytest.raises(ValueError, match="optimizer_params"):
        kiln.Trainer([p], optim.SGD(), {"learning_rate": 1})
    with pytest.raises(ValueError, match="batch_size"):
        kiln.Trainer([p], "sgd").step(0)


def test_float64_weights():
    w = nd.array(np.ones(3), dtype="float64")
    g = nd.array(np.full(3, 0.5), dtype="float64")
    _C.sgd_update([w], [g], [], 0.1, wd=0.1)
    np.testing.assert_allclose(w.asnumpy(), 1 - 0.1 * (0.5 + 0.1), rtol=1e-12)
