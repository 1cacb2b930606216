"""Elementwise ops that come from one declaration in the op list (kiln/runtime/op_list.h):
softplus and mish are available eagerly as kiln.nd functions, differentiate, and fuse into one
generated kernel when hybridized, with torch.nn.functional's numbers."""
import numpy as np
import pytest
import torch

from kiln import autograd, nd, nn

_TORCH = {"softplus": torch.nn.functional.softplus, "mish": torch.nn.functional.mish}
_X = np.concatenate([np.linspace(-40, 40, 401), [-1e4, -90, -20.5, 20.5, 90, 1e4]]).astype(np.float32)


@pytest.mark.parametrize("name", ["softplus", "mish"])
def test_eager_matches_torch_including_large_magnitudes(name):
    got = getattr(nd, name)(nd.array(_X)).asnumpy()
    want = _TORCH[name](torch.tensor(_X)).numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", ["softplus", "mish"])
def test_gradient_matches_torch(name):
    x = nd.array(_X)
    x.attach_grad()
    with autograd.record():
        y = getattr(nd, name)(x)
    y.backward()
    t = torch.tensor(_X, requires_grad=True)
    _TORCH[name](t).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softplus", "mish"])
def test_hybridized_is_fused_and_matches_eager(name):
    f = getattr(nd, name)

    class Block(nn.HybridBlock):
        def forward(self, x):
            return f(x * 2.0) + 1.0

    block = Block()
    x = nd.array(_X)
    eager = block(x).asnumpy()
    block.hybridize()
    hybrid = block(x).asnumpy()
    np.testing.assert_allclose(hybrid, eager, rtol=2e-6, atol=2e-6)
    report = block.compile_report(as_dict=True)
    text = str(block.compile_report())
    assert f"mul, {name}, add -> 1 kernel" in text, text
    assert report is not None
