"""nd.matmul on a GPU device runs the platform's cuBLASLt GEMM: here on two simulated GPUs
(KILN_GPU_SIM=2), each test in a fresh interpreter (the GPU platform is chosen once per process),
against NumPy: transposes, batches with NumPy broadcasting, device 1, the engine's stream order,
and float64, float16 and bfloat16 (tests/cpp/test_gpu_gemm_epilogue.cc compares them with the CPU)."""
import subprocess
import sys
import textwrap

from conftest import gpu_env, skip_if_short_of_gpus


def run_sim(code, extra_env=None):
    env = gpu_env(code, **(extra_env or {}))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=300)
    skip_if_short_of_gpus(r)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


MATMULS = """
    import numpy as np, kiln
    from kiln import nd
    rng = np.random.default_rng(0)
    def check(x, w, dev, ta=False, tb=False):
        got = nd.matmul(nd.array(x).as_in_context(dev), nd.array(w).as_in_context(dev), transpose_a=ta,
                        transpose_b=tb)
        assert got.device == dev, got.device
        xx = np.swapaxes(x, -1, -2) if ta else x
        ww = np.swapaxes(w, -1, -2) if tb else w
        np.testing.assert_allclose(got.asnumpy(), np.matmul(xx, ww), rtol=1e-4, atol=1e-4)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    for dev in (kiln.gpu(0), kiln.gpu(1)):
        check(r(33, 65), r(65, 17), dev)                              # one matrix, rows != columns
        check(r(65, 33), r(65, 17), dev, ta=True)
        check(r(33, 65), r(17, 65), dev, tb=True)
        check(r(65, 33), r(17, 65), dev, ta=True, tb=True)
        check(r(4, 9, 12), r(4, 12, 5), dev)                          # strided batch
        check(r(4, 9, 12), r(12, 5), dev)                             # a weight shared by the batch
        check(r(9, 12), r(3, 12, 5), dev)
        check(r(2, 1, 9, 12), r(1, 3, 12, 5), dev)                    # both sides broadcast
        check(r(6, 0), r(0, 4), dev)                                  # k == 0: zeros
    print("ok")
"""


def test_matmul_on_simulated_gpus_matches_numpy():
    assert "ok" in run_sim(MATMULS)


def test_matmul_on_simulated_gpus_with_the_naive_engine():
    assert "ok" in run_sim(MATMULS, {"KILN_ENGINE": "naive"})


def test_gpu_matmul_is_ordered_after_the_work_that_writes_its_inputs():
    run_sim("""
        import numpy as np, kiln
        from kiln import nd
        g = kiln.gpu(0)
        x = (np.arange(256 * 256).reshape(256, 256) / 65536).astype(np.float32)
        a = nd.array(x).as_in_context(g)              # queued copy, then a product on the same data
        out = nd.matmul(a, a)
        for _ in range(3):                            # a chain: each product reads the last one
            out = nd.matmul(out, a)
        want = x @ x @ x @ x @ x
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-3)
        back = out.as_in_context(kiln.gpu(1))         # read by a copy to another GPU
        np.testing.assert_allclose(back.asnumpy(), want, rtol=1e-3)
    """)


def test_gpu_matmul_of_every_float_dtype_matches_numpy():
    run_sim("""
        import numpy as np, kiln
        from kiln import nd
        rng = np.random.default_rng(1)
        x, w = rng.standard_normal((5, 3, 24)), rng.standard_normal((24, 7))
        for dt, rtol in (("float64", 1e-12), ("float16", 2 ** -9), ("bfloat16", 2 ** -6)):
            a = nd.array(x, dtype=dt).as_in_context(kiln.gpu(0))
            b = nd.array(w, dtype=dt).as_in_context(kiln.gpu(0))
            got = nd.matmul(a, b)                     # float32 accumulation for the 16-bit types
            assert str(got.dtype) == dt or got.dtype == np.dtype(dt), got.dtype
            want = np.matmul(a.astype("float64").asnumpy(), b.astype("float64").asnumpy())
            np.testing.assert_allclose(got.astype("float64").asnumpy(), want, rtol=rtol, atol=rtol)
    """)
