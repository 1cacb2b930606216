"""GPU matmul through cuBLASLt from Python on simulated GPUs (KILN_GPU_SIM=2, see test_gpu.py): a
hybridized Dense(relu) runs its matmul, bias and relu as one GEMM with cuBLASLt's epilogue and
gives the eager numbers; float16 matmul on a GPU matches the CPU's."""
from test_gpu import run_sim


def test_hybridized_dense_relu_is_one_cublaslt_gemm_with_epilogue():
    out = run_sim("""
import numpy as np, kiln
from kiln import nd, nn
net = nn.HybridSequential()
net.add(nn.Dense(32, activation="relu"), nn.Dense(5))
net.initialize(ctx=kiln.gpu(0))
xs = [np.random.rand(4, 10).astype(np.float32) - 0.5 for _ in range(4)]
eager = [net(nd.array(x, ctx=kiln.gpu(0))).asnumpy() for x in xs]
net.hybridize()
for x, ref in zip(xs, eager):
    y = net(nd.array(x, ctx=kiln.gpu(0)))
    np.testing.assert_allclose(y.asnumpy(), ref, rtol=1e-5, atol=1e-6)
print(net.compile_report())
""")
    assert "fusion: 2 groups of 5 ops (GPU: elementwise groups; 2 on cuBLASLt epilogues)" in out, out
    assert "group 0: matmul, add, relu" in out and "cuBLASLt matmul(in0, in1) epilogue: bias(in2), relu" in out, out
    assert "group 1: matmul, add " in out and "cuBLASLt matmul(in0, in1) epilogue: bias(in2)  [" in out, out
    assert "kernels: 5 before fusion, 2 after" in out, out


def test_float16_matmul_on_a_gpu_matches_the_cpu():
    out = run_sim("""
import numpy as np, kiln
from kiln import nd
a = np.random.rand(3, 7, 40).astype(np.float16)
b = np.random.rand(40, 9).astype(np.float16)
cpu = nd.matmul(nd.array(a, dtype="float16"), nd.array(b, dtype="float16")).asnumpy()
gpu = nd.matmul(nd.array(a, dtype="float16", ctx=kiln.gpu(1)), nd.array(b, dtype="float16", ctx=kiln.gpu(1)))
assert gpu.dtype == np.float16, gpu.dtype
exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
np.testing.assert_allclose(gpu.asnumpy().astype(np.float64), exact, rtol=2 ** -10, atol=1e-3)
np.testing.assert_allclose(gpu.asnumpy(), cpu, rtol=2 ** -9)
print("ok")
""")
    assert "ok" in out
