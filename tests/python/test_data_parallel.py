"""Data parallelism in one process: a Trainer over several CPU devices (bucketed allreduce, fused
update), KVStore semantics, stale gradients, uneven splits; the results must equal training on
one device with the whole batch."""
import numpy as np
import pytest

import kiln
from kiln import _C, autograd, nd, nn

DEVICES = [kiln.cpu(0), kiln.cpu(1), kiln.cpu(2)]


def _mlp(hybridize):
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(8, activation="relu"), nn.Dense(3))
    if hybridize:
        net.hybridize()
    return net


def _train(devices, steps, hybridize, batch=10, bucket_mb=None, even_split=False,
           opt=("sgd", {"learning_rate": 0.1, "momentum": 0.9}), ignore_stale_grad=False):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((steps, batch, 5)).astype(np.float32)
    y = rng.integers(0, 3, (steps, batch)).astype(np.float32)
    nd.random.seed(1)
    net = _mlp(hybridize)
    net.initialize(init=kiln.init.Normal(0.5), device=devices)
    trainer = kiln.Trainer(net.collect_params(), opt[0], dict(opt[1]), bucket_mb=bucket_mb)
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    for s in range(steps):
        Xs = kiln.split_and_load(X[s], devices, even_split=even_split)
        ys = kiln.split_and_load(y[s], devices, even_split=even_split)
        with autograd.record():
            ls = [loss(net(a), b) for a, b in zip(Xs, ys)]
        autograd.backward(ls)
        trainer.step(batch, ignore_stale_grad=ignore_stale_grad)
    return net, trainer


def _weights(net, copy=0):
    return [p.list_data()[copy].asnumpy() for p in net.collect_params().values()]


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("ndev", [2, 3])
def test_same_parameters_as_one_device_on_the_whole_batch(hybridize, ndev):
    one, _ = _train([kiln.cpu(0)], 4, hybridize)
    many, _ = _train(DEVICES[:ndev], 4, hybridize)  # 10 samples over 3 devices: 4, 3, 3
    for a, b in zip(_weights(one), _weights(many)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    for c in range(1, ndev):  # the copies are bit-identical: the same sums, the same update
        for a, b in zip(_weights(many), _weights(many, c)):
            np.testing.assert_array_equal(a, b)


def test_bucket_size_does_not_change_results_and_sets_the_collective_count():
    small, t_small = _train(DEVICES[:2], 2, False, bucket_mb=1e-6)  # one parameter per bucket
    large, t_large = _train(DEVICES[:2], 2, False, bucket_mb=100)   # everything in one bucket
    for a, b in zip(_weights(small), _weights(large)):
        np.testing.assert_array_equal(a, b)
    n = len([p for p in small.collect_params().values() if p.grad_req != "null"])
    assert [len(b) for b in t_small._buckets[1]] == [1] * n
    assert [len(b) for b in t_large._buckets[1]] == [n]
    # reverse order: the last layer's parameters (produced first by backward) come first
    assert t_large._buckets[1][0] == list(reversed(range(n)))


def test_one_collective_per_bucket_queued_before_the_backward_finishes():
    net, trainer = _train(DEVICES[:2], 1, False, bucket_mb=100)
    kiln.waitall()
    X = np.ones((4, 5), np.float32)
    y = np.zeros(4, np.float32)
    Xs, ys = kiln.split_and_load(X, DEVICES[:2]), kiln.split_and_load(y, DEVICES[:2])
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        ls = [loss(net(a), b) for a, b in zip(Xs, ys)]
    autograd.backward(ls)
    before = _C.engine_stats()["pushed"]
    trainer.allreduce_grads()
    assert _C.engine_stats()["pushed"] - before == 1  # one bucket: one engine task for both devices
    trainer.update(4)
    assert _C.engine_stats()["pushed"] - before == 3  # plus one fused update per device


def test_stale_parameter_is_named_and_ignore_stale_grad_skips_it():
    class TwoHeads(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.used = nn.Dense(2)
            self.unused = nn.Dense(2)

        def forward(self, x):
            return self.used(x)

    net = TwoHeads()
    net.initialize(device=DEVICES[:2])
    net.unused(nd.ones((1, 3)))  # give it a shape
    net.unused(nd.ones((1, 3), device=DEVICES[1]))
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 1.0})
    Xs = kiln.split_and_load(np.ones((4, 3), np.float32), DEVICES[:2])
    with autograd.record():
        ls = [net(x).sum() for x in Xs]
    autograd.backward(ls)
    with pytest.raises(kiln.StateError, match=r"no gradient was computed for 'unused\.weight', 'unused\.bias'|"
                                              r"no gradient was computed for .*unused"):
        trainer.step(4)
    before = net.unused.weight.data().asnumpy()
    used_before = net.used.weight.data().asnumpy()
    trainer.step(4, ignore_stale_grad=True)
    np.testing.assert_array_equal(net.unused.weight.data().asnumpy(), before)
    assert not np.array_equal(net.used.weight.data().asnumpy(), used_before)  # the others did update
    with pytest.raises(kiln.StateError, match="no gradient was computed"):
        trainer.step(4)  # the step consumed the gradients: a second step without backward is stale


def test_fewer_samples_than_devices():
    # 1 sample over 2 devices: the second device gets nothing and adds nothing to the sum
    one, _ = _train([kiln.cpu(0)], 2, False, batch=1)
    two, _ = _train(DEVICES[:2], 2, False, batch=1)
    for a, b in zip(_weights(one), _weights(two)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    for a, b in zip(_weights(two), _weights(two, 1)):
        np.testing.assert_array_equal(a, b)


def test_fewer_samples_than_devices_with_ignore_stale_grad():
    # the device without samples counts as a zero gradient, ignore_stale_grad or not
    one, _ = _train([kiln.cpu(0)], 2, False, batch=1)
    two, _ = _train(DEVICES[:2], 2, False, batch=1, ignore_stale_grad=True)
    for a, b in zip(_weights(one), _weights(two)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    for a, b in zip(_weights(two), _weights(two, 1)):
        np.testing.assert_array_equal(a, b)


def test_mixed_dtypes_get_separate_buckets():
    w32 = nn.Parameter("w32", shape=(3,), dtype="float32", init=kiln.init.Constant(1.0))
    w64 = nn.Parameter("w64", shape=(3,), dtype="float64", init=kiln.init.Constant(1.0))
    for p in (w32, w64):
        p.initialize(device=DEVICES[:2])
    trainer = kiln.Trainer([w32, w64], "sgd", {"learning_rate": 1.0}, bucket_mb=100)
    with autograd.record():
        ls = [(w32.data(d) * (i + 1)).sum() + (w64.data(d) * (i + 1)).sum().astype("float32")
              for i, d in enumerate(DEVICES[:2])]
    autograd.backward(ls)
    trainer.step(1)
    assert [len(b) for b in trainer._buckets[1]] == [1, 1]
    for p in (w32, w64):
        for w in p.list_data():
            np.testing.assert_allclose(w.asnumpy(), 1 - 3.0)


def test_kvstore_and_distributed_import_lazily():
    import subprocess
    import sys
    code = "import kiln; print(kiln.kvstore.create('device').type, kiln.distributed.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["device", "kiln.distributed"]


def test_bucket_size_comes_from_the_switch_table(monkeypatch):
    net = _mlp(False)
    net.initialize()
    monkeypatch.delenv("KILN_BUCKET_MB", raising=False)
    assert kiln.Trainer(net.collect_params(), "sgd")._bucket_bytes == 25 << 20  # the table's default
    monkeypatch.setenv("KILN_BUCKET_MB", "0.5")
    assert kiln.Trainer(net.collect_params(), "sgd")._bucket_bytes == 1 << 19
    monkeypatch.setenv("KILN_BUCKET_MB", "lots")
    with pytest.raises(ValueError, match="KILN_BUCKET_MB='lots' is not a number"):
        kiln.Trainer(net.collect_params(), "sgd")


def test_trainer_arguments():
    net = _mlp(False)
    net.initialize()
    with pytest.raises(ValueError, match="update_on_kvstore"):
        kiln.Trainer(net.collect_params(), "sgd", update_on_kvstore=True)
    with pytest.raises(ValueError, match="bucket_mb"):
        kiln.Trainer(net.collect_params(), "sgd", bucket_mb=0)
    with pytest.raises(ValueError, match="unknown kind"):
        kiln.kvstore.create("dist_async")
    with pytest.raises(ValueError, match="kvstore must be None, a KVStore or one of"):
        kiln.Trainer(net.collect_params(), "sgd", kvstore="bogus")


def test_trainer_with_a_kvstore_instance_and_local():
    for kv in ("local", kiln.kvstore.create("device")):
        rng = np.random.default_rng(3)
        net = nn.Dense(2)
        net.initialize(device=DEVICES[:2])
        trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, kvstore=kv)
        Xs = kiln.split_and_load(rng.standard_normal((4, 3)).astype(np.float32), DEVICES[:2])
        with autograd.record():
            ls = [net(x).sum() for x in Xs]
        autograd.backward(ls)
        trainer.step(4)
        assert trainer.kvstore is not None and trainer.kvstore.type in ("local", "device")
        np.testing.assert_array_equal(net.weight.list_data()[0].asnumpy(), net.weight.list_data()[1].asnumpy())


# ---- KVStore ----

def test_kvstore_push_pull_sums_over_devices():
    kv = kiln.kvstore.create("device")
    assert kv.type == "device" and kv.rank == 0 and kv.num_workers == 1
    shape = (2, 3)
    kv.init(3, nd.zeros(shape))
    kv.push(3, [nd.full(shape, i + 1.0, device=d) for i, d in enumerate(DEVICES)])
    outs = [nd.zeros(shape, device=d) for d in DEVICES]
    kv.pull(3, out=outs)
    for o in outs:
        np.testing.assert_array_equal(o.asnumpy(), np.full(shape, 6.0))
    # a list of keys; str keys; pushpull in place
    kv.init(["a", "b"], [nd.zeros(2), nd.zeros(3)])
    vals = [[nd.ones(2, device=d) for d in DEVICES], [nd.full(3, 2.0, device=d) for d in DEVICES]]
    kv.pushpull(["a", "b"], vals)
    for v in vals[0]:
        np.testing.assert_array_equal(v.asnumpy(), [3, 3])
    for v in vals[1]:
        np.testing.assert_array_equal(v.asnumpy(), [6, 6, 6])
    # pushpull into separate outputs leaves the values alone
    src = [nd.ones(2, device=d) for d in DEVICES[:2]]
    dst = [nd.zeros(2, device=d) for d in DEVICES[:2]]
    kv.pushpull("a", src, out=dst)
    np.testing.assert_array_equal(dst[1].asnumpy(), [2, 2])
    np.testing.assert_array_equal(src[1].asnumpy(), [1, 1])
    # pushpull stores the sum, as push does
    out = nd.zeros(2)
    kv.pull("a", out=out)
    np.testing.assert_array_equal(out.asnumpy(), [2, 2])
    with pytest.raises(ValueError, match="never initialized"):
        kv.pushpull(99, [nd.ones(2)])


def test_kvstore_pushpull_in_place_on_views_is_one_collective():
    net = nn.Dense(3, in_units=4)
    net.initialize(device=DEVICES[:2])
    kv = kiln.kvstore.create("device")
    kv.init(0, net.weight.data())
    with autograd.record():
        ls = [net(nd.ones((2, 4), device=d)).sum() for d in DEVICES[:2]]
    autograd.backward(ls)
    kiln.waitall()
    before = _C.engine_stats()["pushed"]
    kv.pushpull(0, net.weight.list_grad(), out=net.weight.list_grad())  # fresh wrappers each call
    assert _C.engine_stats()["pushed"] - before == 2  # the collective, and the copy into the store
    np.testing.assert_allclose(net.weight.list_grad()[1].asnumpy(), 4.0)


def test_kvstore_local_keeps_the_value_on_the_cpu_and_updates_with_an_optimizer():
    kv = kiln.kvstore.create("local")
    kv.init(0, nd.ones(4, device=kiln.cpu(1)))
    kv.set_optimizer(kiln.optim.SGD(learning_rate=0.5))
    kv.push(0, [nd.ones(4, device=d) for d in DEVICES[:2]])  # gradient 2 -> w = 1 - 0.5 * 2
    out = nd.zeros(4, device=kiln.cpu(1))
    kv.pull(0, out=out)
    np.testing.assert_allclose(out.asnumpy(), 0.0)


def test_kvstore_errors():
    kv = kiln.kvstore.create("device")
    with pytest.raises(ValueError, match="never initialized"):
        kv.push(7, nd.ones(2))
    kv.init(7, nd.ones(2))
    with pytest.raises(ValueError, match="already initialized"):
        kv.init(7, nd.ones(2))
    with pytest.raises(ValueError, match=r"holds float32 \(2,\) but array 0 is float32 \(3,\)"):
        kv.push(7, nd.ones(3))
    with pytest.raises(ValueError, match="distinct devices"):
        kv.push(7, [nd.ones(2), nd.ones(2)])
    with pytest.raises(TypeError, match="keys are ints or strings"):
        kv.init(1.5, nd.ones(2))
    with pytest.raises(ValueError, match="pass out="):
        kv.pull(7)
    with pytest.raises(ValueError, match="GPU arrays only"):
        nccl = kiln.kvstore.create("nccl")
        nccl.init(0, nd.ones(2))
        nccl.push(0, [nd.ones(2), nd.ones(2, device=kiln.cpu(1))])


def test_split_and_load_uneven_as_gluon():
    parts = kiln.split_and_load(np.arange(10, dtype=np.float32), DEVICES, even_split=False)
    assert [p.shape[0] for p in parts] == [4, 3, 3]
    assert [p.device for p in parts] == DEVICES
