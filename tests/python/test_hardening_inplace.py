"""Writes in place (issue 17, "Hardening"): writes into arrays recorded by autograd take part in the
backward, eagerly and hybridized alike (or are refused with a reason where they cannot); copies whose
source overlaps the destination (x[:] = x[::-1]) give NumPy's result, on the CPU and on two
simulated GPUs; and the training idioms that write in place outside recording keep working."""

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn
from test_gpu import run_sim


def _leaf(values):
    x = nd.array(np.asarray(values, dtype=np.float32))
    x.attach_grad()
    return x


# ---- autograd: writes recorded ------------------------------------------------------------------

def test_write_into_an_element_of_a_recorded_array_cuts_its_gradient():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        y[0] = 10
        y.sum().backward()
    np.testing.assert_array_equal(y.asnumpy(), [10, 4, 6])
    np.testing.assert_array_equal(x.grad.asnumpy(), [0, 2, 2])


def test_write_of_every_element_takes_the_new_values_gradient():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        y[:] = x * 5
        y.sum().backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [5, 5, 5])


def test_value_saved_for_backward_keeps_its_old_contents():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        z = y * y            # d/dx sum(z) = 8x, read from y before the write
        y[0] = 10
        s = z.sum() + y.sum()
    s.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [8, 18, 26])


def test_view_taken_before_the_write_sees_it():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        v = y[1:]
        y[1] = 0
        s = (v * 3).sum()
    s.backward()
    np.testing.assert_array_equal(v.asnumpy(), [0, 6])
    np.testing.assert_array_equal(x.grad.asnumpy(), [0, 0, 6])


def test_in_place_operator_while_recording():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        h = x * 2
        h += x               # h = 3x
        s = (h * h).sum()    # 9x^2
    s.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [18, 36, 54])


def test_differentiable_source_written_into_a_slice():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        y[0] = x[1] * 7
        s = y.sum()
    s.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [0, 9, 2])


def test_write_through_a_transposed_view():
    w = _leaf(np.arange(4.).reshape(2, 2))
    c = nd.array([[1., 2.], [3., 4.]])
    with autograd.record():
        y = w * 1
        y[:] = y.T * 3
        s = (y * c).sum()
    s.backward()
    np.testing.assert_array_equal(y.asnumpy(), 3 * np.arange(4.).reshape(2, 2).T)
    np.testing.assert_array_equal(w.grad.asnumpy(), 3 * c.asnumpy().T)


def test_buffer_made_before_recording_carries_the_gradient_written_into_it():
    x = _leaf([1., 2., 3.])
    buf = nd.zeros(3)
    with autograd.record():
        buf[1:] = x[:2] * 5
        s = (buf * buf).sum()
    s.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [50, 100, 0])


def test_copy_is_differentiable_and_can_be_written():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x.copy()
        y[0] = 0
        s = (y * 4).sum()
    s.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [0, 4, 4])


def test_backward_from_an_array_written_in_place():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        y[2] = 1
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [2, 2, 0])


def test_write_into_a_used_leaf_keeps_the_gradient_at_the_value_used():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * x            # backward reads x = [1, 2, 3]
        x[:] = 0             # not differentiated, as an optimizer step
        s = y.sum()
    s.backward()
    np.testing.assert_array_equal(x.asnumpy(), [0, 0, 0])
    np.testing.assert_array_equal(x.grad.asnumpy(), [2, 4, 6])


def test_uses_of_a_leaf_before_and_after_a_write_both_reach_its_gradient():
    x = _leaf([1., 2., 3.])
    with autograd.record():
        v = x[1:]
        y = x * x            # at x = [1, 2, 3]: 2x
        x[1] = 10
        z = x * 3 + (v * v).sum()   # after: 3, and v = [10, 3] read again: 2v at x[1:]
        s = y.sum() + z.sum()
    s.backward()
    np.testing.assert_array_equal(v.asnumpy(), [10, 3])
    np.testing.assert_array_equal(x.grad.asnumpy(), [2 + 3, 4 + 3 + 3 * 20, 6 + 3 + 3 * 6])


def test_optimizer_step_inside_the_record_scope():
    # the README's loop: backward and the update inside one scope
    w = _leaf([1., 2., 3.])
    for _ in range(3):
        with autograd.record():
            loss = (w * w).sum()
            loss.backward()
            expect = w.asnumpy() * (1 - 2 * 0.25)
            w[:] = w - 0.25 * w.grad
        np.testing.assert_allclose(w.asnumpy(), expect, rtol=1e-6)
    x = _leaf([1., 2., 3.])
    with autograd.record():
        y = x * 2
        x += 1               # in-place operator on a used leaf
        (x * 2).copyto(x)
        s = y.sum() + x.sum()
    s.backward()
    np.testing.assert_array_equal(x.asnumpy(), [4, 6, 8])
    np.testing.assert_array_equal(x.grad.asnumpy(), [3, 3, 3])


# ---- hybridized blocks that write into an intermediate ------------------------------------------

def _set_first(x):
    y = x * 2
    y[0] = 0
    return y


def _set_all(x):
    y = x * 2
    y[:] = x * 5
    return y


def _iadd_slice(x):
    y = x * 2
    y[0] += x[1] * 3
    return y


def _reverse(x):
    y = x * 1
    y[:] = y[::-1]
    return y * nd.array([1., 2., 3.])


def _stale_view(x):
    y = x * 2
    r = y[1:]
    y[1] = 7
    return r * 1 + y.sum()


def _through_reshape(x):
    z = (x * 1).reshape((1, 3))
    z2 = z * z
    z[0, 1:] = 0
    return z2 + z


# (forward, output, gradient of sum(out * [1, 2, ...]) by hand) for x = [1, 2, 3]
_CASES = [
    (_set_first, [0, 4, 6], [0, 4, 6]),
    (_set_all, [5, 10, 15], [5, 10, 15]),
    (_iadd_slice, [8, 4, 6], [2, 7, 6]),
    (_reverse, [3, 4, 3], [9, 4, 1]),
    (_stale_view, [22, 21], [6, 0, 10]),
    (_through_reshape, [[2, 4, 9]], [3, 8, 18]),
]


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("forward,expect_out,expect_grad", _CASES, ids=[c[0].__name__ for c in _CASES])
def test_block_writing_into_an_intermediate(forward, expect_out, expect_grad, hybridize):
    class Block(nn.HybridBlock):
        def forward(self, x):
            return forward(x)
    net = Block()
    net.initialize()
    if hybridize:
        net.hybridize()
    for _ in range(2):  # the second call runs the cached graph
        x = _leaf([1., 2., 3.])
        with autograd.record():
            out = net(x)
            w = nd.array(np.arange(1, out.size + 1, dtype=np.float32).reshape(out.shape))
            s = (out * w).sum()
        s.backward()
        np.testing.assert_array_equal(out.asnumpy(), expect_out)
        np.testing.assert_array_equal(x.grad.asnumpy(), expect_grad)


def test_hybridized_write_into_the_block_input_is_refused():
    class Block(nn.HybridBlock):
        def forward(self, x):
            x[0] = 0
            return x * 2
    net = Block()
    net.initialize()
    net.hybridize()
    with pytest.raises(kiln.StateError, match="input of the hybridized block"):
        net(nd.array([1., 2., 3.]))


# ---- overlapping copies --------------------------------------------------------------------------

def test_reversed_view_assigned_to_itself():
    x = nd.arange(6)
    x[:] = x[::-1]
    np.testing.assert_array_equal(x.asnumpy(), [5, 4, 3, 2, 1, 0])


def test_square_matrix_assigned_its_transpose():
    z = nd.array(np.arange(9.).reshape(3, 3))
    z[:] = z.T
    np.testing.assert_array_equal(z.asnumpy(), np.arange(9.).reshape(3, 3).T)


def test_copyto_from_reversed_view():
    x = nd.arange(6)
    x[::-1].copyto(x)
    np.testing.assert_array_equal(x.asnumpy(), [5, 4, 3, 2, 1, 0])


def test_shifted_and_disjoint_copies_within_one_array():
    a = np.arange(8, dtype=np.int32)
    x = nd.array(a)
    x[1:] = x[:-1]
    a[1:] = a[:-1].copy()
    np.testing.assert_array_equal(x.asnumpy(), a)
    x[:4] = x[4:]          # disjoint halves
    a[:4] = a[4:]
    np.testing.assert_array_equal(x.asnumpy(), a)
    m = nd.array(np.arange(12.).reshape(3, 4))
    m[:, ::2] = m[:, 1::2]  # interleaved columns
    e = np.arange(12.).reshape(3, 4)
    e[:, ::2] = e[:, 1::2]
    np.testing.assert_array_equal(m.asnumpy(), e)


def test_overlapping_copies_on_two_simulated_gpus():
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd
        for dev in (kiln.gpu(0), kiln.gpu(1)):
            x = nd.arange(6).as_in_context(dev)
            x[:] = x[::-1]
            np.testing.assert_array_equal(x.asnumpy(), [5, 4, 3, 2, 1, 0])
            z = nd.array(np.arange(9.).reshape(3, 3)).as_in_context(dev)
            z[:] = z.T
            np.testing.assert_array_equal(z.asnumpy(), np.arange(9.).reshape(3, 3).T)
            y = nd.arange(6).as_in_context(dev)
            y[::-1].copyto(y)
            np.testing.assert_array_equal(y.asnumpy(), [5, 4, 3, 2, 1, 0])
            s = nd.arange(8).as_in_context(dev)
            s[1:] = s[:-1]                         # contiguous, overlapping by all but one element
            np.testing.assert_array_equal(s.asnumpy(), [0, 0, 1, 2, 3, 4, 5, 6])
            m = nd.array(np.arange(12.).reshape(3, 4)).as_in_context(dev)
            m[1:, 1:] = m[:2, :3]                  # strided destination, overlapping source
            e = np.arange(12.).reshape(3, 4)
            e[1:, 1:] = e[:2, :3].copy()
            np.testing.assert_array_equal(m.asnumpy(), e)
        from kiln import autograd
        x = nd.array([1., 2., 3.]).as_in_context(kiln.gpu(1))
        x.attach_grad()
        with autograd.record():
            y = x * 2
            y[0] = 10
            y.sum().backward()
        np.testing.assert_array_equal(x.grad.asnumpy(), [0, 2, 2])
        kiln.waitall()
        print("ok")
    """)
    assert "ok" in out


# ---- writes outside recording: the training idioms -----------------------------------------------

def test_sgd_allreduce_and_accumulators_outside_recording():
    w = nd.array([1., 2., 3.])
    w.attach_grad()
    for step in range(2):
        with autograd.record():
            loss = (w * w).sum()
        loss.backward()
        expect = w.asnumpy() - 0.1 * 2 * w.asnumpy() / 2
        w[:] = w - 0.1 * w.grad / 2          # d2l's sgd
        np.testing.assert_allclose(w.asnumpy(), expect, rtol=1e-6)
    grads = [nd.array([1., 2.]), nd.array([3., 4.])]
    grads[0][:] += grads[1].copyto(grads[0].device)   # d2l's allreduce
    np.testing.assert_array_equal(grads[0].asnumpy(), [4, 6])
    acc = nd.zeros(1)
    acc += nd.array([2.])
    acc[:] += nd.array([3.])
    np.testing.assert_array_equal(acc.asnumpy(), [5])


def test_trainer_and_batch_norm_statistics_update_in_place():
    net = nn.HybridSequential()
    net.add(nn.Dense(4), nn.BatchNorm(), nn.Dense(1))
    net.initialize()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x = nd.array(np.random.RandomState(0).randn(8, 3).astype(np.float32))
    net(x)  # completes the deferred shapes
    bn = net[1]
    for hybridize in (False, True):
        if hybridize:
            net.hybridize()
        before = bn.running_mean.data().asnumpy().copy()
        w0 = net[0].weight.data().asnumpy().copy()
        with autograd.record():
            loss = (net(x) ** 2).mean()
        loss.backward()
        trainer.step(8)
        assert not np.array_equal(bn.running_mean.data().asnumpy(), before)
        assert not np.array_equal(net[0].weight.data().asnumpy(), w0)
        assert np.isfinite(net[0].weight.data().asnumpy()).all()
