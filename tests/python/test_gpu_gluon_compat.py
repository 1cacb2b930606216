"""MXNet 1.x Gluon code on two simulated GPUs (KILN_GPU_SIM=2), written the way d2lzh writes it:
creation functions with ctx=, copyto / as_in_context, in-place slice assignment on GPU arrays,
`with mx.gpu(1):`, parameters on both GPUs (data(ctx), initialize(ctx=[...]), force_reinit), the
hand-written allreduce of the from-scratch chapter and the concise Trainer version. Each test runs
its snippet in a fresh interpreter (the GPU platform is chosen once per process), so these run,
never skip, on machines without a GPU. The CPU side is in test_gluon_compat.py."""
import subprocess
import sys
import textwrap

from conftest import gpu_env, skip_if_short_of_gpus


def run_sim(code):
    env = gpu_env(code)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=300)
    skip_if_short_of_gpus(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout, r.stdout
    return r.stdout


def test_sim_gpus_ctx_copyto_as_in_context_and_in_place():
    run_sim("""
        import numpy as np
        import kiln as mx
        from kiln import nd
        assert mx.context.num_gpus() == 2
        g0, g1 = mx.gpu(0), mx.gpu(1)
        for x in (nd.zeros((2, 3), ctx=g1), nd.ones((2, 3), g1), nd.full((2, 3), 2, ctx=g1),
                  nd.arange(6, ctx=g1), nd.array([1, 2], ctx=g1), nd.empty((1,), g1),
                  nd.random.uniform(shape=(2,), ctx=g1), nd.random.normal(shape=(2,), ctx=g1),
                  nd.random.randint(0, 3, shape=(2,), ctx=g1)):
            assert x.context == g1 and x.ctx.device_type == "gpu" and x.ctx.device_id == 1, x
        assert nd.ones((2,), ctx=g0, dtype="float64").dtype == np.float64
        with g1:                                 # the default device, as MXNet's `with mx.gpu(1):`
            assert nd.zeros((2,)).context == g1 and nd.array([1.0]).context == g1
            from kiln.gluon import nn
            dense = nn.Dense(2, in_units=2)
            dense.initialize()
            assert dense.weight.list_ctx() == [g1] and dense(nd.ones((1, 2))).context == g1
        assert nd.zeros((2,)).context == mx.cpu(0)
        a = nd.ones((2, 3), ctx=g0)
        alias = a
        assert a.as_in_context(g0) is a
        b = a.as_in_context(g1)
        assert b.context == g1 and b is not a
        c = a.copyto(g1)
        assert c.context == g1 and not c._shares_storage(b)
        dst = nd.zeros((2, 3), ctx=g1)
        assert (a * 4).copyto(dst) is dst
        a[:] += dst.copyto(a.context)            # the hand-written allreduce of d2lzh
        assert (alias.asnumpy() == 5).all()
        a[:] = nd.arange(6, ctx=g0).reshape((2, 3))
        a += 1
        assert a is alias and (alias.asnumpy() == np.arange(1, 7).reshape(2, 3)).all()
        assert alias.norm().asscalar() == np.float32(np.sqrt(91))
        # strided slices of a GPU array are written in place too
        ref = alias.asnumpy()
        a[1:, 1:] += 1; ref[1:, 1:] += 1
        a[:, 0] = nd.array([5, 6], ctx=g1); ref[:, 0] = [5, 6]
        a[1:, ::2] *= 2; ref[1:, ::2] *= 2
        a[:, 1:] = a[:, :-1]; ref[:, 1:] = ref[:, :-1].copy()
        np.testing.assert_array_equal(alias.asnumpy(), ref)
        host = nd.zeros((2, 3))
        host[:, 1] = nd.ones((2,), ctx=g0)
        np.testing.assert_array_equal(host.asnumpy(), [[0, 1, 0], [0, 1, 0]])
        print("ok")
    """)


def test_sim_gpus_params_and_allreduce_training_as_d2lzh():
    run_sim("""
        import numpy as np
        import kiln as mx
        from kiln import autograd, gluon, init, nd
        from kiln.gluon import loss as gloss, nn, utils as gutils
        ctx = [mx.gpu(0), mx.gpu(1)]

        # from scratch: parameters copied to each GPU, gradients summed by hand
        scale = 0.01
        W1, b1 = nd.random.normal(scale=scale, shape=(16, 8)), nd.zeros(shape=16)
        W2, b2 = nd.random.normal(scale=scale, shape=(2, 16)), nd.zeros(shape=2)
        params = [W1, b1, W2, b2]

        def get_params(params, ctx):
            new_params = [p.copyto(ctx) for p in params]
            for p in new_params:
                p.attach_grad()
            return new_params

        def allreduce(data):
            for i in range(1, len(data)):
                data[0][:] += data[i].copyto(data[0].context)
            for i in range(1, len(data)):
                data[0].copyto(data[i])

        def net_fn(X, p):
            h = nd.relu(nd.dot(X, p[0].T) + p[1])
            return nd.dot(h, p[2].T) + p[3]

        gpu_params = [get_params(params, c) for c in ctx]
        X = nd.random.uniform(shape=(8, 8))
        y = nd.array([0, 1] * 4)
        loss = gloss.SoftmaxCrossEntropyLoss()
        Xs, ys = gutils.split_and_load(X, ctx), gutils.split_and_load(y, ctx)
        with autograd.record():
            ls = [loss(net_fn(Xi, p), yi) for Xi, yi, p in zip(Xs, ys, gpu_params)]
        for l in ls:
            l.backward()
        g0 = gpu_params[0][0].grad
        g_own = [p[0].grad.asnumpy().copy() for p in gpu_params]
        for i in range(len(params)):
            allreduce([p[i].grad for p in gpu_params])
        np.testing.assert_allclose(g0.asnumpy(), g_own[0] + g_own[1], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(gpu_params[1][0].grad.asnumpy(), g0.asnumpy(), rtol=1e-6)
        for p in gpu_params:
            for param in p:
                param[:] = param - 0.1 * param.grad / 8
        np.testing.assert_allclose(gpu_params[0][0].asnumpy(), gpu_params[1][0].asnumpy(), rtol=1e-6)

        # concise: Gluon parameters on both GPUs and a Trainer
        net = nn.Sequential()
        net.add(nn.Dense(16, activation="relu"), nn.Dense(2))
        net.initialize(init=init.Normal(sigma=0.01), ctx=ctx)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        with autograd.record():
            ls = [loss(net(Xi), yi) for Xi, yi in zip(Xs, ys)]
        for l in ls:
            l.backward()
        trainer.step(8)
        nd.waitall()
        w = net[0].params.get("weight")
        try:
            w.data()                            # d2lzh: "not initialized on cpu(0)"
            raise AssertionError("no error")
        except RuntimeError as e:
            assert "not initialized on cpu(0)" in str(e), e
        assert w.list_ctx() == ctx and w.data(mx.gpu(1)).context == mx.gpu(1)
        np.testing.assert_allclose(w.data(ctx[0]).asnumpy(), w.data(ctx[1]).asnumpy(), rtol=1e-6)
        assert w.grad(ctx[1]).context == ctx[1]
        try:
            w.data(mx.cpu())
            raise AssertionError("no error")
        except RuntimeError as e:
            assert isinstance(e, mx.StateError) and "gpu(0)" in str(e)
        net.initialize(init=init.One(), ctx=ctx, force_reinit=True)
        assert (w.data(ctx[1]).asnumpy() == 1).all()
        net.collect_params().reset_ctx(mx.gpu(1))
        assert w.list_ctx() == [mx.gpu(1)]
        print("ok")
    """)
