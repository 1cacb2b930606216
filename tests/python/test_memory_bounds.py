"""Bounded memory: the CPU pool's statistics (kiln.cpu_memory_stats), emptying it on demand
(kiln.empty_cache), its bound (KILN_CPU_POOL_MB), and a loop over 400 distinct shapes, eager and
hybridized, whose pool and resident memory stay within stated bounds; the kernel cache's bound
(KILN_KERNEL_CACHE_SIZE); out-of-memory in a compiled graph's GPU arena. Each case runs in a fresh
interpreter, so that its statistics and resident memory are its own."""
import json
import os
import subprocess
import sys
import textwrap


def run(code, timeout=600, **env):
    """Runs `code` in a fresh interpreter with `env` added to the environment (None: removed)."""
    full = dict(os.environ, **env)
    for name in [k for k, v in full.items() if v is None]:
        del full[name]
    if "libasan" in full.get("LD_PRELOAD", ""):
        # make test-asan: ASan keeps freed blocks resident in its quarantine (256 MB) to catch uses
        # after free, which the resident-memory bounds here would count as growth.
        full["ASAN_OPTIONS"] = full.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                          timeout=timeout)


def test_cpu_memory_stats_count_allocations_frees_and_cached_bytes():
    r = run("""
        import kiln
        from kiln import nd
        MiB = 1 << 20
        kiln.waitall()
        s0 = kiln.cpu_memory_stats()
        for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_cached", "peak_bytes_cached", "bytes_reserved",
                    "cache_limit_bytes", "num_allocs", "num_frees", "num_system_allocs", "num_system_frees",
                    "num_trims", "num_ooms", "num_cache_flushes"):
            assert isinstance(s0[key], int), key
        assert s0["cache_limit_bytes"] == 1024 * MiB, s0        # the default of KILN_CPU_POOL_MB
        a = nd.zeros((1 << 20,))                                  # 4 MiB
        a.wait_to_read()
        s1 = kiln.cpu_memory_stats()
        assert s1["bytes_in_use"] >= s0["bytes_in_use"] + 4 * MiB, (s0, s1)
        assert s1["peak_bytes_in_use"] >= s1["bytes_in_use"]
        assert s1["num_allocs"] > s0["num_allocs"]
        assert s1["bytes_reserved"] == s1["bytes_in_use"] + s1["bytes_cached"]
        del a
        kiln.waitall()
        s2 = kiln.cpu_memory_stats(device_id=0)
        assert s2["num_frees"] > s1["num_frees"]
        assert s2["bytes_in_use"] <= s1["bytes_in_use"] - 4 * MiB, (s1, s2)
        assert s2["bytes_cached"] >= 4 * MiB, s2                 # kept for reuse, not given back
        assert s2["peak_bytes_cached"] >= s2["bytes_cached"] and s2["num_trims"] == 0, s2
        print("ok")
    """, KILN_CPU_POOL_MB=None)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_empty_cache_gives_the_cpu_pool_back():
    r = run("""
        import kiln
        from kiln import nd
        a = nd.ones((1 << 20,))
        a.wait_to_read()
        del a
        kiln.waitall()
        before = kiln.cpu_memory_stats()
        assert before["bytes_cached"] >= 4 << 20, before
        kiln.empty_cache()
        after = kiln.cpu_memory_stats()
        assert after["bytes_cached"] == 0, after
        assert after["num_cache_flushes"] == before["num_cache_flushes"] + 1
        assert after["num_system_frees"] > before["num_system_frees"]
        b = nd.ones((1 << 20,)) * 2                               # the pool works after being emptied
        assert float(b.sum().asscalar()) == 2.0 * (1 << 20)
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_empty_cache_also_empties_the_simulated_gpus_pools():
    r = run("""
        import kiln
        from kiln import nd
        a = nd.ones((1 << 20,)).as_in_context(kiln.gpu(1))
        a.wait_to_read()
        del a
        kiln.waitall()
        assert kiln.gpu_memory_stats(1)["bytes_cached"] >= 4 << 20
        assert kiln.cpu_memory_stats()["bytes_cached"] >= 4 << 20
        kiln.empty_cache()
        assert kiln.gpu_memory_stats(1)["bytes_cached"] == 0 and kiln.cpu_memory_stats()["bytes_cached"] == 0
        print("ok")
    """, KILN_GPU_SIM="2")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_pool_limit_zero_caches_nothing_and_a_bad_limit_is_refused():
    r = run("""
        import kiln
        from kiln import nd
        for n in (1000, 1 << 20, 12345):
            a = nd.ones((n,)) + 1
            a.wait_to_read()
            del a
            kiln.waitall()
            s = kiln.cpu_memory_stats()
            assert s["bytes_cached"] == 0 and s["cache_limit_bytes"] == 0, s
        assert s["num_system_frees"] >= 6, s
        print("ok")
    """, KILN_CPU_POOL_MB="0")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    r = run("import kiln; kiln.nd.ones((3,)).asnumpy()", KILN_CPU_POOL_MB="-5")
    assert r.returncode != 0
    assert "KILN_CPU_POOL_MB=-5" in r.stderr and "ArgumentError" in r.stderr, r.stderr


# The loop of the bound test: every iteration a batch size never seen before, through eager ops
# and a hybridized block (forward and backward), so each iteration allocates sizes the pool has
# not cached yet and the block compiles a new graph (it keeps KILN_GRAPH_CACHE_SIZE of them).
SHAPE_LOOP = """
    import gc, json, os, sys
    import kiln
    from kiln import autograd, nd, nn

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu", in_units=256), nn.Dense(10, in_units=64))
    net.initialize()
    net.hybridize()

    def step(i):
        n = 100 + i                                   # 400 distinct batch sizes
        x = nd.random.uniform(shape=(n, 1024))        # 0.4 .. 2 MB, eager
        y = ((x * 2 + 1).exp() - x).sum(axis=1)
        z = nd.random.normal(shape=(n, 256))
        z.attach_grad()
        with autograd.record():
            out = net(z)                              # hybridized: a new graph per shape
            loss = (out * out).sum() + y.sum()
        loss.backward()
        return float(loss.asscalar()) + float(z.grad.sum().asscalar())

    warm = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    for i in range(warm):                             # one-time costs: JIT, oneDNN, first graphs
        step(i)
    kiln.waitall(); gc.collect()
    base = rss_mb()
    peak = base
    for i in range(warm, 400):
        step(i)
        if i % 10 == 0:
            kiln.waitall()
            peak = max(peak, rss_mb())
    kiln.waitall(); gc.collect()
    end = rss_mb()
    s = kiln.cpu_memory_stats()
    print(json.dumps({"rss_base_mb": base, "rss_peak_mb": max(peak, end), "rss_end_mb": end,
                      "peak_cached_mb": s["peak_bytes_cached"] / 2**20, "cached_mb": s["bytes_cached"] / 2**20,
                      "trims": s["num_trims"], "limit_mb": s["cache_limit_bytes"] / 2**20}))
"""

POOL_MB = 64          # the pool's bound in this test (KILN_CPU_POOL_MB)
RSS_GROWTH_MB = 150   # the stated bound of the resident memory's growth over 360 new shapes


def test_400_distinct_shapes_stay_within_the_pool_and_rss_bounds():
    r = run(SHAPE_LOOP, KILN_CPU_POOL_MB=str(POOL_MB))
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    print(m)
    assert m["limit_mb"] == POOL_MB
    # The freed sizes add up to far more than the pool may keep, so it must have trimmed itself,
    # and the cache never went above the bound at any free.
    assert m["trims"] > 0, m
    assert m["peak_cached_mb"] <= POOL_MB, m
    assert m["rss_peak_mb"] - m["rss_base_mb"] <= RSS_GROWTH_MB, m


# A compiled graph's arena on a simulated GPU: three 1024x1024 products live at once (12 MiB).
ARENA_NET = """
    import re
    import numpy as np, kiln
    from kiln import nd, nn

    class Products(nn.HybridBlock):
        def forward(self, x):
            y = nd.dot(x, x)
            z = nd.dot(y, x)
            return (nd.dot(z, y) + z + y).sum()

    net = Products()
    net.initialize()
    net.hybridize()
    xn = np.random.default_rng(0).uniform(0, 0.01, (1024, 1024)).astype(np.float32)
    x = nd.array(xn).as_in_context(kiln.gpu(0))
    y = xn @ xn
    z = y @ xn
    expected = float((z @ y + z + y).sum())
"""


def test_a_gpu_arena_that_does_not_fit_is_an_out_of_memory_error_naming_device_and_size():
    r = run(ARENA_NET + """
    try:
        net(x).asnumpy()
    except kiln.OutOfMemoryError as e:
        msg = str(e)
        assert re.search(r"out of memory on gpu\\(0\\) allocating \\d+ bytes for the arena of a compiled graph", msg), msg
    else:
        raise AssertionError("expected OutOfMemoryError")
    small = nd.ones((4,)).as_in_context(kiln.gpu(0)) * 2  # the device is still usable
    assert small.asnumpy().tolist() == [2.0] * 4
    print("ok")
    """, KILN_GPU_SIM="1", KILN_GPU_SIM_MEM="12M")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_a_gpu_arena_empties_the_pool_and_retries_before_failing():
    r = run(ARENA_NET + """
    t = nd.zeros((6 << 20,)).as_in_context(kiln.gpu(0))  # 24 MiB freed into the pool: 28 of 40 reserved
    t.wait_to_read()
    del t
    kiln.waitall()
    flushes = kiln.gpu_memory_stats(0)["num_cache_flushes"]
    got = float(net(x).asnumpy())
    assert abs(got - expected) <= 1e-4 * abs(expected), (got, expected)
    assert kiln.gpu_memory_stats(0)["num_cache_flushes"] == flushes + 1
    print("ok")
    """, KILN_GPU_SIM="1", KILN_GPU_SIM_MEM="40M")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_kernels_for_ever_new_constants_stay_within_the_kernel_cache(tmp_path):
    # A hybridized block fed a new Python constant on every call compiles a new fused kernel each
    # time. The memory cache keeps KILN_KERNEL_CACHE_SIZE of them; the others leave the JIT once
    # their graphs are gone (measured before the bound: about 1 MB of resident memory per 100).
    r = run("""
        import json, os
        import numpy as np, kiln
        from kiln import nd, nn

        def rss_mb():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

        class Scaled(nn.HybridBlock):
            def forward(self, x, s):
                return ((x * s + 1).exp() * x - s).sum(axis=1)

        net = Scaled()
        net.initialize()
        net.hybridize()
        xn = np.random.default_rng(0).uniform(size=(50, 40)).astype(np.float32)
        x = nd.array(xn)
        def check(s):
            want = (np.exp(xn * np.float32(s) + 1) * xn - np.float32(s)).sum(axis=1)
            np.testing.assert_allclose(net(x, s).asnumpy(), want, rtol=1e-4)
        for i in range(900):
            check(0.001 * i)
            if i == 150:
                base = rss_mb()
        kiln.waitall()
        end = rss_mb()
        s = kiln.codegen_stats()
        disk_hits = s["disk_hits"]
        check(0.0)  # evicted long ago: read back from the disk cache, and right
        print(json.dumps({"rss_growth_mb": end - base, "compiles": s["compiles"], "evictions": s["evictions"],
                          "disk_hit_after_eviction": kiln.codegen_stats()["disk_hits"] - disk_hits}))
    """, KILN_KERNEL_CACHE_SIZE="16", KILN_GRAPH_CACHE_SIZE="4", KILN_CACHE_DIR=str(tmp_path),
        PYTHONWARNINGS="ignore")
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    print(m)
    assert m["compiles"] == 900 and m["evictions"] == 900 - 16, m
    assert m["disk_hit_after_eviction"] == 1, m
    assert m["rss_growth_mb"] <= 3.0, m  # 750 kernels: about 7.5 MB without the bound
