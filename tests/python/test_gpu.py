"""The GPU from Python on two simulated GPUs (KILN_GPU_SIM=2): each test runs its snippet in a
fresh interpreter with the simulator switched on (the GPU platform is chosen once per process),
so these run, never skip, on machines without a GPU."""
import os
import subprocess
import sys
import textwrap

from conftest import gpu_env, skip_if_short_of_gpus


def run_sim(code, mem=None):
    env = gpu_env(code, sim_mem=mem)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=300)
    skip_if_short_of_gpus(r)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_num_gpus_and_copies_between_simulated_gpus():
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd
        assert kiln.num_gpus() == 2 and kiln.gpus() == [kiln.gpu(0), kiln.gpu(1)]
        x = np.arange(3 * 1000 * 1000, dtype=np.float32).reshape(3, -1)
        a = nd.array(x).as_in_context(kiln.gpu(0))
        b = a.as_in_context(kiln.gpu(1))          # device to device, between two GPUs
        assert b.device == kiln.gpu(1)
        np.testing.assert_array_equal(b.asnumpy(), x)
        kiln.waitall()
        print("ok")
    """)
    assert "ok" in out


def test_gpu_memory_stats_and_empty_cache():
    run_sim("""
        import kiln
        from kiln import nd
        s0 = kiln.gpu_memory_stats(1)
        a = nd.zeros((1024, 1024)).as_in_context(kiln.gpu(1))
        a.wait_to_read()
        s = kiln.gpu_memory_stats(1)
        assert s["bytes_in_use"] >= 4 << 20, s
        assert s["peak_bytes_in_use"] >= s["bytes_in_use"]
        assert 0.0 <= s["fragmentation"] < 1.0
        del a
        kiln.waitall()
        s = kiln.gpu_memory_stats(1)
        assert s["bytes_cached"] >= 4 << 20, s      # freed into the cache, not to the device
        kiln.empty_cache()
        s = kiln.gpu_memory_stats(1)
        assert s["bytes_cached"] == 0 and s["num_cache_flushes"] >= 1, s
        try:
            kiln.gpu_memory_stats(2)
        except kiln.DeviceError as e:
            assert "gpu(2)" in str(e)
        else:
            raise AssertionError("gpu_memory_stats(2) should fail with two GPUs")
    """)


def test_out_of_memory_raises_with_statistics():
    run_sim("""
        import kiln
        from kiln import nd
        keep = [nd.zeros((8 << 20,)).as_in_context(kiln.gpu(0)) for _ in range(2)]   # 2 x 32 MiB of 64
        kiln.waitall()
        try:
            big = kiln.nd.zeros((8 << 20,)).as_in_context(kiln.gpu(0))
            big.wait_to_read()
        except kiln.OutOfMemoryError as e:
            msg = str(e)
            assert "out of memory on gpu(0)" in msg and "in use" in msg and "fragmentation" in msg, msg
        else:
            raise AssertionError("expected OutOfMemoryError")
        assert kiln.gpu_memory_stats(0)["num_ooms"] == 2      # the first try and the retry after emptying
        del keep
        kiln.waitall()
        ok = nd.zeros((8 << 20,)).as_in_context(kiln.gpu(0))   # room again after the frees
        ok.wait_to_read()
    """, mem="64M")


def test_collectives_between_simulated_gpus():
    run_sim("""
        import numpy as np, kiln
        from kiln import _C, nd
        xs = [nd.array(np.arange(1000, dtype=np.float32) * (i + 1)).as_in_context(kiln.gpu(i)) for i in range(2)]
        _C.allreduce([[x] for x in xs], op="sum")       # in-process collectives between simulated GPUs
        for x in xs:
            assert x.device.device_type == "gpu"
            np.testing.assert_array_equal(x.asnumpy(), np.arange(1000, dtype=np.float32) * 3)
    """)


def test_errors_on_simulated_gpus_are_typed():
    run_sim("""
        import kiln
        from kiln import nd
        try:
            nd.zeros((2,)).as_in_context(kiln.gpu(2))
        except kiln.DeviceError as e:
            assert "gpu(2) does not exist" in str(e), str(e)
        else:
            raise AssertionError("gpu(2) should not exist under KILN_GPU_SIM=2")
    """)


def test_bad_simulator_switches_are_errors_that_say_what_to_set():
    env = dict(os.environ, KILN_GPU_SIM="2", KILN_GPU_SIM_MEM="lots")
    r = subprocess.run([sys.executable, "-c", "import kiln; kiln.num_gpus()"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "KILN_GPU_SIM_MEM=lots is not a memory size: expected e.g. 4G, 512M" in r.stderr, r.stderr
    env = dict(os.environ, KILN_GPU_SIM="-1")
    r = subprocess.run([sys.executable, "-c", "import kiln; kiln.num_gpus()"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "KILN_GPU_SIM=-1 is not a number of simulated GPUs" in r.stderr, r.stderr


def test_naive_engine_on_simulated_gpus():
    env = gpu_env(KILN_ENGINE="naive")
    code = textwrap.dedent("""
        import numpy as np, kiln
        from kiln import nd
        x = np.arange(1 << 20, dtype=np.float32)
        a = nd.array(x).as_in_context(kiln.gpu(1))     # work of gpu(1) issued from the main thread
        np.testing.assert_array_equal(a.as_in_context(kiln.gpu(0)).asnumpy(), x)
    """)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    skip_if_short_of_gpus(r)
    assert r.returncode == 0, r.stdout + r.stderr


def test_split_and_load_onto_simulated_gpus():
    out = run_sim("""
        import numpy as np, kiln
        from kiln import utils
        x = np.arange(12, dtype=np.float32).reshape(6, 2)
        parts = utils.split_and_load(x, [kiln.cpu(), kiln.gpu(0), kiln.gpu(1)])
        assert [p.device for p in parts] == [kiln.cpu(), kiln.gpu(0), kiln.gpu(1)]
        np.testing.assert_array_equal(np.concatenate([p.asnumpy() for p in parts]), x)
        print("ok")
    """)
    assert "ok" in out


def test_elementwise_ops_on_simulated_gpus_match_the_cpu():
    # Every unary and binary elementwise op runs on a GPU as a kernel kiln generates (NVPTX; the
    # simulator runs its IR); float32 results match the CPU's, broadcasting scalars and biases.
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd, autograd
        rng = np.random.default_rng(0)
        x = rng.uniform(0.1, 2, (4, 257)).astype(np.float32)
        y = rng.uniform(-2, 2, (4, 257)).astype(np.float32)
        bias = rng.uniform(-1, 1, (257,)).astype(np.float32)
        column = rng.uniform(-1, 1, (4, 1)).astype(np.float32)
        unary = ["negative", "abs", "sign", "square", "sqrt", "rsqrt", "reciprocal", "exp", "log", "log1p",
                 "expm1", "sin", "cos", "tanh", "erf", "relu", "floor", "ceil", "round", "softplus", "mish"]
        binary = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum"]
        for dev in (kiln.gpu(0), kiln.gpu(1)):
            gx, gy, gb, gc = (nd.array(v).as_in_context(dev) for v in (x, y, bias, column))
            for name in unary:
                f = getattr(nd, name)
                got, want = f(gx), f(nd.array(x)).asnumpy()
                assert got.device == dev, (name, got.device)
                np.testing.assert_allclose(got.asnumpy(), want, rtol=2e-6, atol=1e-6, err_msg=name)
            for name in binary:
                f = getattr(nd, name)
                for b, cb in ((gy, y), (gb, bias), (gc, column)):
                    got = f(gx, b).asnumpy()
                    want = f(nd.array(x), nd.array(cb)).asnumpy()
                    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(((gx * 2.0 - 1.0) / gy).asnumpy(), (x * 2 - 1) / y, rtol=1e-6)
            # Autograd through GPU ops: the backward runs on the GPU too.
            gx.attach_grad()
            with autograd.record():
                z = (gx * gx + gb).exp()
            z.backward()
            np.testing.assert_allclose(gx.grad.asnumpy(), 2 * x * np.exp(x * x + bias), rtol=1e-5)
            assert gx.grad.device == dev
            o = nd.ones((3, 5), device=dev)
            assert o.device == dev and o.asnumpy().tolist() == [[1.0] * 5] * 3
            np.testing.assert_array_equal(gx.reshape((257, 4)).asnumpy(), x.reshape(257, 4))
        print("ok")
    """)
    assert "ok" in out


def test_gpu_ints_any_broadcast_and_bad_indices_as_python_errors():
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd
        g = kiln.gpu(0)
        i = nd.array(np.arange(6, dtype=np.int32)).as_in_context(g)
        f = nd.array(np.ones((2, 3), np.float32)).as_in_context(g)
        # Other dtypes and any broadcast have kernels now (codegen/cu/elementwise.cu).
        np.testing.assert_array_equal((i + i).asnumpy(), 2 * np.arange(6, dtype=np.int32))
        np.testing.assert_array_equal((nd.array(np.ones((2, 1, 3), np.float32)).as_in_context(g)
                                       + nd.array(np.ones((2, 4, 3), np.float32)).as_in_context(g)).asnumpy(),
                                      np.full((2, 4, 3), 2, np.float32))
        for fn, err, words in [
                (lambda: nd.take(f, i, axis=1).asnumpy(), ValueError, "index 3 (at position 3 of the indices) is out of range")]:
            try:
                fn()
            except err as e:
                assert words in str(e), str(e)
            else:
                raise AssertionError("expected " + err.__name__)
        print("ok")
    """)
    assert "ok" in out


def test_reductions_on_simulated_gpus_match_numpy_and_carry_gradients():
    # sum, mean, max and min over any axes: a block-per-row kernel kiln generates,
    # rows longer and shorter than a block; the gradient of a broadcast sums on the GPU.
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd, autograd
        rng = np.random.default_rng(1)
        cases = [((4, 300), None), ((4, 300), (1,)), ((4, 300), (0,)), ((3, 5, 7), (1,)), ((3, 5, 7), (1, 2)),
                 ((3, 5, 7), (0, 1)), ((1000,), (0,)), ((2, 3000), (1,)), ((5000, 2), (1,))]  # 5000 rows: more than the 4096 blocks
        for shape, axes in cases:
            x = rng.standard_normal(shape).astype(np.float32)
            g = nd.array(x).as_in_context(kiln.gpu(1))
            for name, ref in (("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)):
                kw = {} if axes is None else {"axis": axes}
                got = getattr(nd, name)(g, **kw)
                assert got.device == kiln.gpu(1)
                want = ref(x, **kw)
                np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-4, err_msg=f"{name} {shape} {axes}")
        x = np.array([[1, np.nan, 3], [4, 5, 6]], np.float32)
        g = nd.array(x).as_in_context(kiln.gpu(0))
        assert np.isnan(nd.max(g, axis=1).asnumpy()[0]) and nd.max(g, axis=1).asnumpy()[1] == 6
        x = rng.standard_normal((4, 6)).astype(np.float32)
        gx = nd.array(x).as_in_context(kiln.gpu(0)); gx.attach_grad()
        gb = nd.array(np.ones(6, np.float32)).as_in_context(kiln.gpu(0)); gb.attach_grad()
        with autograd.record():
            l = (gx * gb).exp().sum()
        l.backward()
        np.testing.assert_allclose(gx.grad.asnumpy(), np.exp(x), rtol=1e-5)
        np.testing.assert_allclose(gb.grad.asnumpy(), (x * np.exp(x)).sum(0), rtol=1e-5, atol=1e-5)
        # Any axes, of a strided view too (a transpose made on the CPU, copied as it is).
        x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
        g = nd.array(x).as_in_context(kiln.gpu(0))
        np.testing.assert_allclose(nd.sum(g, axis=(0, 2)).asnumpy(), x.sum((0, 2)), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(nd.max(g, axis=(1, 3)).asnumpy(), x.max((1, 3)))
        print("ok")
    """)
    assert "ok" in out


def test_full_broadcast_to_and_empty_matmul_on_simulated_gpus():
    # full and broadcast_to take every dtype on a GPU; full's value is exact (two values that
    # print alike are two fills); broadcast_to takes any broadcast, so the gradient of a sum over a
    # middle axis runs on the GPU; an empty matmul writes nothing.
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd, autograd
        g = kiln.gpu(1)
        a = nd.full((3,), 0.1, device=g).asnumpy()
        b = nd.full((3,), 0.1000001, device=g).asnumpy()
        assert a[0] == np.float32(0.1) and b[0] == np.float32(0.1000001) and a[0] != b[0], (a, b)
        for dt in ("int32", "int64", "float64", "float16", "bool", "uint8"):
            v = nd.full((2, 3), 7, dtype=dt, device=g)
            np.testing.assert_array_equal(v.asnumpy(), np.full((2, 3), 7, dtype=dt))
        x = np.arange(6, dtype=np.float64).reshape(2, 1, 3)
        y = nd.broadcast_to(nd.array(x, dtype="float64").as_in_context(g), (2, 4, 3))
        np.testing.assert_array_equal(y.asnumpy(), np.broadcast_to(x, (2, 4, 3)))
        x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
        gx = nd.array(x).as_in_context(g); gx.attach_grad()
        with autograd.record():
            l = (nd.sum(gx, axis=1) * nd.array(np.arange(6, dtype=np.float32).reshape(2, 3)).as_in_context(g)).sum()
        l.backward()
        np.testing.assert_allclose(gx.grad.asnumpy(), np.broadcast_to(np.arange(6, dtype=np.float32).reshape(2, 1, 3),
                                                                      (2, 5, 3)))
        e = nd.matmul(nd.zeros((0, 4, 5), device=g), nd.zeros((0, 5, 2), device=g))
        assert e.shape == (0, 4, 2) and e.asnumpy().shape == (0, 4, 2)
        print("ok")
    """)
    assert "ok" in out


def test_transpose_and_slice_on_simulated_gpus_as_views_and_copies():
    # Views where the layout allows (no copy), the strided copy where not; any dtype.
    out = run_sim("""
        import numpy as np, kiln
        from kiln import nd
        g = kiln.gpu(0)
        for dt in (np.float32, np.int64, np.float64):
            x = np.arange(2 * 3 * 4, dtype=dt).reshape(2, 3, 4)
            gx = nd.array(x, dtype=np.dtype(dt).name).as_in_context(g)
            t = nd.transpose(gx, axes=(2, 0, 1))
            np.testing.assert_array_equal(t.asnumpy(), x.transpose(2, 0, 1))
            np.testing.assert_array_equal(t.reshape((4, 6)).asnumpy(), x.transpose(2, 0, 1).reshape(4, 6))
            np.testing.assert_array_equal((t + 0 if dt == np.float32 else t).asnumpy(), x.transpose(2, 0, 1))
            s = gx[:, 1:3, ::2]
            np.testing.assert_array_equal(s.asnumpy(), x[:, 1:3, ::2])
            assert s.device == g and t.device == g
        print("ok")
    """)
    assert "ok" in out
