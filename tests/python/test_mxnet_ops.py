"""The MXNet 1.x operator API (kiln.mxnet_ops, as nd.X, sym.X and F.X): every op's values and
gradients against PyTorch or NumPy, the same numbers from a hybridized hybrid_forward(F, ...) and
from its export re-imported as a SymbolBlock, Symbols composed with keyword arguments, and the
typed errors for bad arguments. LeNet from scratch (d2lzh) trains in test_mxnet_ops_lenet.py."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import kiln
from kiln import autograd, nd, nn, sym

R = np.random.RandomState(0)


def _r(*shape, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, shape).astype(np.float32)


X4, W4, B4 = _r(2, 3, 7, 7), _r(4, 3, 3, 3), _r(4)
XG, WG = _r(2, 4, 9, 9), _r(6, 2, 3, 3)
X3, X2 = _r(2, 3, 4), _r(3, 5)
IDX = np.array([[0, 2, 1, 2], [1, 0, 0, 2]], dtype=np.float32)   # for axis 1 of X3 (size 3)
EMB = np.array([[1, 9, 3], [0, 0, 7]], dtype=np.float32)
T = torch.tensor


def _head(shape):
    return np.random.RandomState(sum(shape) + len(shape)).uniform(0.5, 1.5, shape).astype(np.float32)


# name: (fn(F, *arrays), reference(*torch tensors), arrays, indices of the differentiated arrays)
CASES = {
    "conv": (lambda F, x, w, b: F.Convolution(data=x, weight=w, bias=b, kernel=(3, 3), num_filter=4,
                                               stride=(2, 2), pad=(1, 1)),
             lambda x, w, b: TF.conv2d(x, w, b, stride=2, padding=1), [X4, W4, B4], [0, 1, 2]),
    "conv_group_dilate_no_bias": (
        lambda F, x, w: F.Convolution(x, w, kernel=(3, 3), num_filter=6, num_group=2, dilate=(2, 2), no_bias=True),
        lambda x, w: TF.conv2d(x, w, None, dilation=2, groups=2), [XG, WG], [0, 1]),
    "conv1d": (lambda F, x, w, b: F.Convolution(x, w, b, kernel=(3,), num_filter=4, stride=(2,), pad=(1,), dilate=(2,)),
               lambda x, w, b: TF.conv1d(x, w, b, stride=2, padding=1, dilation=2), [X3, _r(4, 3, 3), B4], [0, 1, 2]),
    "pool1d_max": (lambda F, x: F.Pooling(x, kernel=(2,), stride=(1,), pool_type="max"),
                   lambda x: TF.max_pool1d(x, 2, 1), [X3], [0]),
    "pool1d_avg_global": (lambda F, x: F.Pooling(x, kernel=(3,), pool_type="avg", pad=(1,)) +
                          F.Pooling(x, pool_type="avg", global_pool=True),
                          lambda x: TF.avg_pool1d(x, 3, 1, 1) + x.mean(2, keepdim=True), [X3], [0]),
    "pool_max": (lambda F, x: F.Pooling(x, kernel=(3, 3), pool_type="max", stride=(2, 2), pad=(1, 1)),
                 lambda x: TF.max_pool2d(x, 3, 2, 1), [X4], [0]),
    "pool_avg_stride_defaults_to_1": (lambda F, x: F.Pooling(data=x, kernel=(2, 2), pool_type="avg"),
                                      lambda x: TF.avg_pool2d(x, 2, 1), [X4], [0]),
    "pool_avg_pad": (lambda F, x: F.Pooling(x, kernel=(3, 3), pool_type="avg", stride=(2, 2), pad=(1, 1)),
                     lambda x: TF.avg_pool2d(x, 3, 2, 1, count_include_pad=True), [X4], [0]),
    "pool_max_full": (lambda F, x: F.Pooling(x, kernel=(2, 2), stride=(2, 2), pooling_convention="full"),
                      lambda x: TF.max_pool2d(x, 2, 2, ceil_mode=True), [X4], [0]),
    "pool_sum": (lambda F, x: F.Pooling(x, kernel=(2, 2), pool_type="sum", stride=(2, 2)),
                 lambda x: TF.avg_pool2d(x, 2, 2) * 4, [X4], [0]),
    "pool_global_max": (lambda F, x: F.Pooling(x, pool_type="max", global_pool=True),
                        lambda x: x.amax(dim=(2, 3), keepdim=True), [X4], [0]),
    "pool_global_avg": (lambda F, x: F.Pooling(x, kernel=(1, 1), pool_type="avg", global_pool=True),
                        lambda x: x.mean(dim=(2, 3), keepdim=True), [X4], [0]),
    "fc_flatten": (lambda F, x, w, b: F.FullyConnected(data=x, weight=w, bias=b, num_hidden=5),
                   lambda x, w, b: TF.linear(x.flatten(1), w, b), [X4, _r(5, 147), _r(5)], [0, 1, 2]),
    "fc_no_flatten_no_bias": (lambda F, x, w: F.FullyConnected(x, w, num_hidden=5, no_bias=True, flatten=False),
                              lambda x, w: TF.linear(x, w), [X3, _r(5, 4)], [0, 1]),
    "act_relu": (lambda F, x: F.Activation(x, act_type="relu"), TF.relu, [X3], [0]),
    "act_sigmoid": (lambda F, x: F.Activation(data=x, act_type="sigmoid"), torch.sigmoid, [X3], [0]),
    "act_tanh": (lambda F, x: F.Activation(x, act_type="tanh"), torch.tanh, [X3], [0]),
    "act_softrelu": (lambda F, x: F.Activation(x, act_type="softrelu"), TF.softplus, [X3], [0]),
    "act_softsign": (lambda F, x: F.Activation(x, act_type="softsign"), TF.softsign, [X3], [0]),
    "leaky": (lambda F, x: F.LeakyReLU(x, act_type="leaky", slope=0.1), lambda x: TF.leaky_relu(x, 0.1), [X3], [0]),
    "prelu": (lambda F, x, g: F.LeakyReLU(x, gamma=g, act_type="prelu"), TF.prelu, [X4, _r(3)], [0, 1]),
    "elu": (lambda F, x: F.LeakyReLU(x, act_type="elu", slope=0.7), lambda x: TF.elu(x, 0.7), [X3], [0]),
    "selu": (lambda F, x: F.LeakyReLU(x, act_type="selu"), TF.selu, [X3], [0]),
    "gelu": (lambda F, x: F.LeakyReLU(x, act_type="gelu"), TF.gelu, [X3], [0]),
    "batchnorm_fix_gamma": (
        lambda F, x, g, b, m, v: F.BatchNorm(x, g, b, m, v),
        lambda x, g, b, m, v: TF.batch_norm(x, m.detach().clone(), v.detach().clone(), torch.ones_like(g), b,
                                            training=True, eps=1e-3),
        [X4, _r(3), _r(3), _r(3), _r(3, lo=0.5, hi=2)], [0, 2]),
    "batchnorm_gamma_axis": (
        lambda F, x, g, b, m, v: F.BatchNorm(data=x, gamma=g, beta=b, moving_mean=m, moving_var=v, fix_gamma=False,
                                             eps=1e-5, axis=-1),
        lambda x, g, b, m, v: TF.batch_norm(x.permute(0, 2, 1), m.detach().clone(), v.detach().clone(), g, b,
                                            training=True, eps=1e-5).permute(0, 2, 1),
        [X3, _r(4), _r(4), _r(4), _r(4, lo=0.5, hi=2)], [0, 1, 2]),
    "batchnorm_global_stats": (
        lambda F, x, g, b, m, v: F.BatchNorm(x, g, b, m, v, fix_gamma=False, use_global_stats=True),
        lambda x, g, b, m, v: TF.batch_norm(x, m, v, g, b, training=False, eps=1e-3),
        [X4, _r(3), _r(3), _r(3), _r(3, lo=0.5, hi=2)], [0, 1, 2]),
    "softmax_temperature": (lambda F, x: F.softmax(x, axis=1, temperature=2.0),
                            lambda x: torch.softmax(x / 2, 1), [X3], [0]),
    "log_softmax": (lambda F, x: F.log_softmax(data=x, axis=0), lambda x: torch.log_softmax(x, 0), [X3], [0]),
    "dot_2d_transpose_b": (lambda F, a, b: F.dot(a, b, transpose_b=True), lambda a, b: a @ b.T,
                           [X2, _r(4, 5)], [0, 1]),
    "dot_nd": (lambda F, a, b: F.dot(lhs=a, rhs=b), lambda a, b: torch.tensordot(a, b, 1), [X3, _r(4, 2, 3)], [0, 1]),
    "dot_transpose_a": (lambda F, a, b: F.dot(a, b, transpose_a=True), lambda a, b: a.T @ b, [X2, _r(3, 2)], [0, 1]),
    "batch_dot": (lambda F, a, b: F.batch_dot(a, b), torch.bmm, [X3, _r(2, 4, 5)], [0, 1]),
    "batch_dot_transposed": (lambda F, a, b: F.batch_dot(a, b, transpose_a=True, transpose_b=True),
                             lambda a, b: torch.bmm(a.transpose(1, 2), b.transpose(1, 2)),
                             [_r(2, 4, 3), _r(2, 5, 4)], [0, 1]),
    "pick": (lambda F, x, i: F.pick(x, i, axis=1), lambda x, i: x.gather(1, i.long()[:, None]).squeeze(1),
             [X3, IDX], [0]),
    "pick_keepdims_last_axis": (lambda F, x, i: F.pick(data=x, index=i, keepdims=True),
                                lambda x, i: x.gather(2, i.long()[..., None]),
                                [X3, np.array([[0, 3, 1], [2, 2, 0]], np.float32)], [0]),
    "topk_value": (lambda F, x: F.topk(x, k=2, ret_typ="value"), lambda x: torch.topk(x, 2, -1).values, [X3], [0]),
    "topk_value_ascending_axis0": (lambda F, x: F.topk(x, axis=0, k=2, ret_typ="value", is_ascend=True),
                                   lambda x: torch.topk(x, 2, 0, largest=False).values, [X2], [0]),
    "topk_value_by_rank": (lambda F, x: F.topk(x, axis=1, k=5, ret_typ="value"),
                           lambda x: torch.topk(x, 5, 1).values, [_r(2, 7, 3)], [0]),
    "topk_both_ascending_by_rank": (lambda F, x: F.topk(x, k=6, ret_typ="both", is_ascend=True)[0],
                                    lambda x: torch.topk(x, 6, -1, largest=False).values, [_r(3, 8)], [0]),
    "sort_descending": (lambda F, x: F.sort(x, axis=0, is_ascend=False),
                        lambda x: torch.sort(x, 0, descending=True).values, [_r(9, 2)], [0]),
    "concat": (lambda F, a, b, c: F.concat(a, b, c, dim=1), lambda a, b, c: torch.cat([a, b, c], 1),
               [X3, _r(2, 1, 4), _r(2, 2, 4)], [0, 1, 2]),
    "stack": (lambda F, a, b: F.stack(a, b, axis=1), lambda a, b: torch.stack([a, b], 1), [X3, _r(2, 3, 4)], [0, 1]),
    "split_squeeze": (lambda F, x: F.SliceChannel(x, num_outputs=3, axis=1, squeeze_axis=True),
                      lambda x: list(x.unbind(1)), [X3], [0]),
    "split": (lambda F, x: F.split(x, num_outputs=2, axis=2), lambda x: list(x.split(2, 2)), [X3], [0]),
    "broadcast_add": (lambda F, a, b: F.broadcast_add(a, b), torch.add, [_r(2, 3, 1), _r(1, 3, 4)], [0, 1]),
    "broadcast_sub": (lambda F, a, b: F.broadcast_sub(a, b), torch.sub, [_r(2, 3, 1), _r(1, 3, 4)], [0, 1]),
    "broadcast_mul": (lambda F, a, b: F.broadcast_mul(lhs=a, rhs=b), torch.mul, [_r(2, 3, 1), _r(3, 4)], [0, 1]),
    "broadcast_div": (lambda F, a, b: F.broadcast_div(a, b), torch.div, [_r(2, 3, 1), _r(3, 4, lo=1, hi=2)], [0, 1]),
    "broadcast_power": (lambda F, a, b: F.broadcast_power(a, b), torch.pow, [_r(2, 1, lo=0.5, hi=2), _r(1, 3)],
                        [0, 1]),
    "broadcast_maximum": (lambda F, a, b: F.broadcast_maximum(a, b), torch.maximum, [_r(2, 3, 1), _r(3, 4)], [0, 1]),
    "broadcast_minimum": (lambda F, a, b: F.broadcast_minimum(a, b), torch.minimum, [_r(2, 3, 1), _r(3, 4)], [0, 1]),
    "broadcast_greater_is_float": (lambda F, a, b: F.broadcast_greater(a, b) * a,
                                   lambda a, b: (a > b).float() * a, [_r(2, 3, 1), _r(3, 4)], [0]),
    "broadcast_to": (lambda F, x: F.broadcast_to(x, shape=(2, 0, 4)), lambda x: x.expand(2, 3, 4), [_r(1, 3, 1)], [0]),
    "broadcast_axis": (lambda F, x: F.broadcast_axis(x, axis=(0, 2), size=(2, 5)), lambda x: x.expand(2, 3, 5),
                       [_r(1, 3, 1)], [0]),
    "broadcast_like": (lambda F, a, b: F.broadcast_like(a, b), lambda a, b: a.expand_as(b), [_r(3, 1), X2], [0]),
    "elemwise_add": (lambda F, a, b: F.elemwise_add(a, b), torch.add, [X2, _r(3, 5)], [0, 1]),
    "elemwise_mul": (lambda F, a, b: F.elemwise_mul(a, b), torch.mul, [X2, _r(3, 5)], [0, 1]),
    "add_n": (lambda F, a, b, c: F.add_n(a, b, c), lambda a, b, c: a + b + c, [X2, _r(3, 5), _r(3, 5)], [0, 1, 2]),
    "sum_tuple_keepdims": (lambda F, x: F.sum(x, axis=(0, 2), keepdims=True),
                           lambda x: x.sum((0, 2), keepdim=True), [X3], [0]),
    "sum_exclude": (lambda F, x: F.sum(data=x, axis=1, exclude=True), lambda x: x.sum((0, 2)), [X3], [0]),
    "mean": (lambda F, x: F.mean(x, axis=-1), lambda x: x.mean(-1), [X3], [0]),
    "mean_all": (lambda F, x: F.mean(x), lambda x: x.mean(), [X3], [0]),
    "max": (lambda F, x: F.max(x, axis=1), lambda x: x.amax(1), [X3], [0]),
    "min_exclude": (lambda F, x: F.min(x, axis=(0,), exclude=True, keepdims=True),
                    lambda x: x.amin((1, 2), keepdim=True), [X3], [0]),
    "prod": (lambda F, x: F.prod(x, axis=1), lambda x: x.prod(1), [X3], [0]),
    "norm": (lambda F, x: F.norm(x), lambda x: torch.linalg.vector_norm(x), [X3], [0]),
    "norm_l1_axis": (lambda F, x: F.norm(x, ord=1, axis=1, keepdims=True),
                     lambda x: x.abs().sum(1, keepdim=True), [X3], [0]),
    "clip": (lambda F, x: F.clip(x, a_min=-0.5, a_max=0.3), lambda x: x.clamp(-0.5, 0.3), [X3], [0]),
    "where": (lambda F, c, a, b: F.where(condition=c, x=a, y=b), lambda c, a, b: torch.where(c != 0, a, b),
              [np.array([[1, 0, 2, 0, 1]] * 3, np.float32), X2, _r(3, 5)], [1, 2]),
    "where_rows": (lambda F, c, a, b: F.where(c, a, b), lambda c, a, b: torch.where(c[:, None] != 0, a, b),
                   [np.array([0, 1, 1], np.float32), X2, _r(3, 5)], [1, 2]),
    "slice_axis": (lambda F, x: F.slice_axis(x, axis=2, begin=-3, end=None), lambda x: x[:, :, -3:], [X3], [0]),
    "slice": (lambda F, x: F.slice(x, begin=(None, 1), end=(None, 3)), lambda x: x[:, 1:3], [X3], [0]),
    "transpose": (lambda F, x: F.transpose(x, axes=(2, 0, 1)), lambda x: x.permute(2, 0, 1), [X3], [0]),
    "swapaxes": (lambda F, x: F.swapaxes(x, dim1=0, dim2=2), lambda x: x.transpose(0, 2), [X3], [0]),
    "reshape": (lambda F, x: F.reshape(x, shape=(4, 6)), lambda x: x.reshape(4, 6), [X3], [0]),
    "expand_squeeze": (lambda F, x: F.squeeze(F.expand_dims(x, axis=1), axis=1) * 2, lambda x: x * 2, [X3], [0]),
    "tile": (lambda F, x: F.tile(x, reps=(2, 1, 3)), lambda x: x.repeat(2, 1, 3), [X3], [0]),
    "flatten": (lambda F, x: F.Flatten(x) + F.flatten(x), lambda x: x.flatten(1) * 2, [X4], [0]),
    "repeat": (lambda F, x: F.repeat(x, repeats=2, axis=1), lambda x: x.repeat_interleave(2, 1), [X3], [0]),
    "repeat_flat": (lambda F, x: F.repeat(x, 3), lambda x: x.flatten().repeat_interleave(3), [X2], [0]),
    "flip": (lambda F, x: F.flip(x, axis=(0, 2)), lambda x: x.flip((0, 2)), [X3], [0]),
    "sequence_mask": (lambda F, x, n: F.SequenceMask(x, n, use_sequence_length=True, value=-7.0, axis=1),
                      lambda x, n: torch.where(torch.arange(3)[None, :, None] < n[:, None, None], x, -7.0),
                      [X3, np.array([2, 0], np.float32)], [0]),
    "sequence_mask_time_first": (lambda F, x, n: F.SequenceMask(data=x, sequence_length=n, use_sequence_length=True),
                                 lambda x, n: torch.where(torch.arange(2)[:, None, None] < n[None, :, None], x, 0.0),
                                 [X3, np.array([1, 2, 0], np.float32)], [0]),
    "layer_norm": (lambda F, x, g, b: F.LayerNorm(x, g, b), lambda x, g, b: TF.layer_norm(x, (4,), g, b, 1e-5),
                   [X3, _r(4), _r(4)], [0, 1, 2]),
    "layer_norm_axis1": (lambda F, x, g, b: F.LayerNorm(data=x, gamma=g, beta=b, axis=1, eps=1e-3),
                         lambda x, g, b: TF.layer_norm(x.transpose(1, 2), (3,), g, b, 1e-3).transpose(1, 2),
                         [X3, _r(3), _r(3)], [0, 1, 2]),
    "instance_norm": (lambda F, x, g, b: F.InstanceNorm(x, g, b),
                      lambda x, g, b: TF.instance_norm(x, weight=g, bias=b, eps=1e-3), [X4, _r(3), _r(3)], [0, 1, 2]),
    "l2_normalization": (lambda F, x: F.L2Normalization(x),
                         lambda x: x / torch.sqrt((x * x).sum((1, 2, 3), True) + 1e-10), [X4], [0]),
    "l2_normalization_channel": (lambda F, x: F.L2Normalization(x, mode="channel"),
                                 lambda x: x / torch.sqrt((x * x).sum(1, True) + 1e-10), [X4], [0]),
    "smooth_l1": (lambda F, x: F.smooth_l1(x * 3, scalar=2.0),
                  lambda x: TF.smooth_l1_loss(x * 3, torch.zeros_like(x), reduction="none", beta=0.25), [X3], [0]),
    "gather_nd": (lambda F, x, i: F.gather_nd(x, i), lambda x, i: x[i[0].long(), i[1].long()],
                  [X3, np.array([[0, 1, 1], [2, 0, 2]], np.float32)], [0]),
    "upsampling": (lambda F, x: F.UpSampling(x, scale=2, sample_type="nearest"),
                   lambda x: TF.interpolate(x, scale_factor=2, mode="nearest"), [X4], [0]),
    "embedding": (lambda F, i, w: F.Embedding(data=i, weight=w, input_dim=10, output_dim=4),
                  lambda i, w: TF.embedding(i.long(), w), [EMB, _r(10, 4)], [1]),
    "one_hot": (lambda F, i, x: F.one_hot(i, depth=10, on_value=2.0, off_value=-1.0) * x,
                lambda i, x: (TF.one_hot(i.long(), 10) * 3.0 - 1.0) * x, [EMB, _r(2, 3, 10)], [1]),
    "cast_blockgrad": (lambda F, x: F.Cast(x, dtype="float64") * F.BlockGrad(F.exp(x)).astype("float64"),
                       lambda x: x.double() * torch.exp(x).detach().double(), [X2], [0]),
}


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _kiln(fn, arrays, diff, device=None):
    xs = [nd.array(a, device=device) for a in arrays]
    for i in diff:
        xs[i].attach_grad()
    with autograd.record():
        outs = _as_list(fn(nd, *xs))
        assert all(o.device == xs[0].device for o in outs), [o.device for o in outs]
        total = None
        for o in outs:
            t = (o * nd.array(_head(o.shape), device=device).astype(o.dtype)).sum()
            total = t if total is None else total + t
    total.backward()
    return [o.asnumpy() for o in outs], [xs[i].grad.asnumpy() for i in diff]


def _torch(ref, arrays, diff):
    ts = [T(a, requires_grad=i in diff) for i, a in enumerate(arrays)]
    outs = _as_list(ref(*ts))
    total = sum((o * T(_head(tuple(o.shape))).to(o.dtype)).sum() for o in outs)
    total.backward()
    return [o.detach().numpy() for o in outs], [ts[i].grad.numpy() for i in diff]


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch(name):
    fn, ref, arrays, diff = CASES[name]
    outs, grads = _kiln(fn, arrays, diff)
    want_outs, want_grads = _torch(ref, arrays, diff)
    assert len(outs) == len(want_outs)
    for got, want in zip(outs, want_outs):
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for i, (got, want) in enumerate(zip(grads, want_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=f"gradient of input {diff[i]}")


class _OpBlock(nn.HybridBlock):
    def __init__(self, fn):
        super().__init__()
        self._fn = fn
        self.traced_with = []

    def hybrid_forward(self, F, x, *args):
        self.traced_with.append(F)
        return self._fn(F, x, *args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hybridized_matches_eager_and_exports(name, tmp_path):
    fn, _, arrays, _ = CASES[name]
    block = _OpBlock(fn)
    xs = [nd.array(a) for a in arrays]
    eager = [o.asnumpy() for o in _as_list(block(*xs))]
    assert block.traced_with == [nd]
    block.hybridize()
    hybrid = [o.asnumpy() for o in _as_list(block(*xs))]
    assert block.traced_with[1:] == [sym]  # F is kiln.sym while tracing
    for a, b in zip(hybrid, eager):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    block.export(str(tmp_path / "op"))
    names = ["data"] if len(xs) == 1 else [f"data{i}" for i in range(len(xs))]
    back = nn.SymbolBlock.imports(str(tmp_path / "op-symbol.json"), names, str(tmp_path / "op-0000.params"))
    for a, b in zip(_as_list(back(*xs)), eager):
        np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-5, atol=1e-6)


def test_index_ops_values():
    x = nd.array(np.array([[1, 5, 3, 5], [4, -1, 2, 0]], np.float32))
    idx = nd.argmax(x, axis=1)
    assert idx.dtype == np.float32 and idx.asnumpy().tolist() == [1, 0]
    assert nd.argmin(x, axis=0, keepdims=True).asnumpy().tolist() == [[0, 1, 1, 1]]
    assert nd.argmax(x).asnumpy().tolist() == [1] and nd.argmax(x).dtype == np.float32
    i = nd.topk(x, k=2)
    assert i.dtype == np.float32 and i.asnumpy().tolist() == [[1, 3], [0, 2]]
    assert nd.topk(x, k=2, dtype="int64").dtype == np.int64
    v, i = nd.topk(x, axis=0, k=1, ret_typ="both", is_ascend=True)
    assert v.asnumpy().tolist() == [[1, -1, 2, 0]] and i.asnumpy().tolist() == [[0, 1, 1, 1]]
    assert nd.topk(x, k=3, ret_typ="mask").asnumpy().tolist() == [[0, 1, 1, 1], [1, 0, 1, 1]]
    assert nd.topk(x, k=0, ret_typ="value").asnumpy().tolist() == [[5, 5, 3, 1], [4, 2, 0, -1]]  # k < 1: all
    for k in (3, 6, 0):  # by argmax rounds, by pairwise ranks, everything sorted
        a = R.permutation(60).reshape(3, 20).astype(np.float32)
        for ascend in (False, True):
            v, i = nd.topk(nd.array(a), axis=1, k=k, ret_typ="both", is_ascend=ascend)
            t = torch.topk(T(a), k or 20, 1, largest=not ascend)
            assert v.asnumpy().tolist() == t.values.numpy().tolist()
            assert i.asnumpy().tolist() == t.indices.numpy().tolist() and i.dtype == np.float32
            mask = nd.topk(nd.array(a), axis=1, k=k, ret_typ="mask", is_ascend=ascend).asnumpy()
            assert set(np.unique(mask)) <= {0.0, 1.0}
            assert all(set(np.nonzero(mask[r])[0]) == set(t.indices.numpy()[r]) for r in range(3))
    ties = nd.array(np.array([[2, 7, 7, 1, 7, 2, 0]], np.float32))
    assert nd.topk(ties, k=5).asnumpy().tolist() == [[1, 2, 4, 0, 5]]  # ties: the lower index first
    assert nd.topk(ties, k=3).asnumpy().tolist() == [[1, 2, 4]]
    oh = nd.one_hot(nd.array([1, 0, 7]), 3)
    assert oh.dtype == np.float32 and oh.asnumpy().tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
    assert nd.pick(x, nd.array([9, -4]), axis=1).asnumpy().tolist() == [5, 4]  # mode 'clip'
    assert nd.pick(x, nd.array([5, -1]), mode="wrap").asnumpy().tolist() == [5, 0]
    assert nd.pick(x, nd.array([7, -1], dtype="int32")).asnumpy().tolist() == [5, 4]
    assert nd.pick(x, nd.array([-1, 6], dtype="int64"), mode="wrap").asnumpy().tolist() == [5, 2]
    assert nd.broadcast_equal(x, nd.array([5.0])).asnumpy().tolist() == [[0, 1, 0, 1], [0, 0, 0, 0]]
    assert nd.broadcast_lesser_equal(x, nd.array([2.0])).dtype == np.float32
    # kiln's own list forms keep working
    assert nd.concat([nd.ones((1, 2)), nd.zeros((1, 2))]).shape == (2, 2)
    assert nd.stack([nd.ones(2), nd.zeros(2)], 1).shape == (2, 2)
    assert nd.concat(nd.ones((1, 2)), nd.zeros((1, 2))).shape == (1, 4)  # MXNet's dim=1
    assert nd.split(nd.ones((2, 4)), num_outputs=1).shape == (2, 4)   # one part: an array, as MXNet


def test_sort_argsort_and_out():
    a = R.permutation(24).reshape(2, 12).astype(np.float32)
    assert nd.sort(nd.array(a)).asnumpy().tolist() == np.sort(a, 1).tolist()
    assert nd.sort(nd.array(a), axis=0, is_ascend=False).asnumpy().tolist() == (-np.sort(-a, 0)).tolist()
    i = nd.argsort(nd.array(a))
    assert i.dtype == np.float32 and i.asnumpy().tolist() == np.argsort(a, 1).tolist()
    z = nd.zeros((2, 12))
    assert nd.elemwise_add(nd.array(a), nd.ones((2, 12)), out=z) is z  # MXNet's out=
    assert z.asnumpy().tolist() == (a + 1).tolist()
    _raises(lambda: nd.sum(nd.array(a), axis=1, out=z), kiln.ShapeError, "out= must be an array of shape (2,)")
    _raises(lambda: nd.topk(nd.ones((1, 5000)), k=300), kiln.ArgumentError, "too large", "np.sort")


def test_prod_multiplies_exactly_for_every_dtype():
    # It was exp(sum(log|x|)): 3*5*7*11*13 came out 15015.001, and integer arrays were refused.
    a = np.array([3, 5, 7, 11, 13], np.float32)
    assert nd.prod(nd.array(a)).asnumpy().item() == 15015.0
    f = np.arange(1, 13, dtype=np.float64).reshape(3, 4)
    assert nd.prod(nd.array(f)).asnumpy().item() == 479001600.0  # 12!, exact in float64
    i = np.array([[2, -3, 4], [5, 6, 7], [1, 0, 9]], np.int32)
    for axis, keepdims in [(0, False), (1, True), ((0, 1), False)]:
        got = nd.prod(nd.array(i), axis=axis, keepdims=keepdims)
        assert got.dtype == np.int32
        assert got.asnumpy().tolist() == np.prod(i, axis=axis, keepdims=keepdims).tolist()
    assert nd.prod(nd.array(i), axis=0, exclude=True).asnumpy().tolist() == [-24, 210, 0]
    assert nd.prod(nd.zeros((2, 0, 3)), axis=1).asnumpy().tolist() == [[1.0] * 3] * 2  # empty: 1
    x = nd.array(np.array([[3, -5, 0], [2, 2, -2]], np.float32))
    x.attach_grad()
    with autograd.record():
        nd.prod(x, axis=1).sum().backward()
    assert x.grad.asnumpy().tolist() == [[0, 0, -15], [-4, -4, 4]]  # zeros have their gradient


def test_dropout_follows_training_mode_and_p():
    x = nd.ones((200, 50))
    assert np.array_equal(nd.Dropout(x, p=0.5).asnumpy(), x.asnumpy())  # not training: the identity
    with autograd.record():
        y = nd.Dropout(data=x, p=0.5).asnumpy()
    kept = y != 0
    assert 0.4 < kept.mean() < 0.6 and np.allclose(y[kept], 2.0)
    y = nd.Dropout(x, p=0.25, mode="always").asnumpy()
    assert 0.65 < (y != 0).mean() < 0.85 and np.allclose(y[y != 0], 1 / 0.75)


def test_batchnorm_moving_statistics_and_fixed_gamma():
    x = nd.array(_r(8, 3, 4, 4))
    g, b = nd.array([2.0, 3.0, 4.0]), nd.zeros(3)
    m, v = nd.zeros(3), nd.ones(3)
    g.attach_grad()
    with autograd.record():
        y = nd.BatchNorm(x, g, b, m, v, momentum=0.8)
    y.backward()
    a = x.asnumpy()
    mean, var = a.mean((0, 2, 3)), a.var((0, 2, 3))
    np.testing.assert_allclose(m.asnumpy(), 0.2 * mean, rtol=1e-5, atol=1e-6)
    n = a.size // 3  # kiln: the unbiased variance
    np.testing.assert_allclose(v.asnumpy(), 0.8 + 0.2 * var * n / (n - 1), rtol=1e-5)
    assert np.all(g.grad.asnumpy() == 0)  # fix_gamma: gamma is 1 and learns nothing
    np.testing.assert_allclose(y.asnumpy().std((0, 2, 3)), np.sqrt(var / (var + 1e-3)), rtol=1e-3)
    # inference (no record): the moving statistics, not the batch's
    out = nd.BatchNorm(x, g, b, m, v, fix_gamma=False).asnumpy()
    mm, vv = m.asnumpy()[None, :, None, None], v.asnumpy()[None, :, None, None]
    np.testing.assert_allclose(out, (a - mm) / np.sqrt(vv + 1e-3) * g.asnumpy()[None, :, None, None], rtol=1e-4,
                               atol=1e-5)


def _softmax_output_grad(x, label, **kw):
    xa = nd.array(x)
    xa.attach_grad()
    with autograd.record():
        out = nd.SoftmaxOutput(xa, nd.array(label), **kw)
    out.backward()
    return out.asnumpy(), xa.grad.asnumpy()


def test_softmax_output_value_and_mxnet_gradient():
    x, label = _r(4, 5), np.array([0, 3, 1, 4], np.float32)
    p = torch.softmax(T(x), -1).numpy()
    onehot = np.eye(5, dtype=np.float32)[label.astype(int)]
    out, grad = _softmax_output_grad(x, label)
    np.testing.assert_allclose(out, p, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, p - onehot, rtol=1e-5, atol=1e-6)
    _, grad = _softmax_output_grad(x, label, grad_scale=2.0, normalization="batch")
    np.testing.assert_allclose(grad, (p - onehot) * 2 / 4, rtol=1e-5, atol=1e-6)
    ignore = np.array([0, -1, 1, -1], np.float32)
    _, grad = _softmax_output_grad(x, ignore, use_ignore=True, normalization="valid")
    keep = (ignore != -1)[:, None]
    want = (p - np.eye(5, dtype=np.float32)[np.maximum(ignore, 0).astype(int)]) * keep / 2
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)
    _, grad = _softmax_output_grad(x, label, smooth_alpha=0.2)
    smooth = onehot * 0.8 + (1 - onehot) * 0.05
    np.testing.assert_allclose(grad, p - smooth, rtol=1e-5, atol=1e-6)


def test_softmax_output_multi_output_and_preserve_shape():
    x, label = _r(2, 4, 3), np.array([[0, 3, 1], [2, 2, 0]], np.float32)  # 4 classes on axis 1
    p = torch.softmax(T(x), 1).numpy()
    out, grad = _softmax_output_grad(x, label, multi_output=True)
    np.testing.assert_allclose(out, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, p - np.eye(4, dtype=np.float32)[label.astype(int)].transpose(0, 2, 1),
                               rtol=1e-5, atol=1e-6)
    x, label = _r(2, 2, 3), np.array([[0, 2], [1, 1]], np.float32)  # 3 classes on the last axis
    p = torch.softmax(T(x), -1).numpy()
    out, grad = _softmax_output_grad(x, label, preserve_shape=True, normalization="valid")
    np.testing.assert_allclose(out, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, (p - np.eye(3, dtype=np.float32)[label.astype(int)]) / 4, rtol=1e-5, atol=1e-6)


def test_softmax_output_as_the_head_of_a_hybridized_network(tmp_path):
    class Net(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter("weight", shape=(3, 6))
            self.bias = nn.Parameter("bias", shape=(3,))

        def hybrid_forward(self, F, x, label, weight, bias):
            h = F.FullyConnected(x, weight, bias, num_hidden=3)
            return F.SoftmaxOutput(h, label, name="softmax")

    x, label = nd.array(_r(5, 6)), nd.array(np.array([0, 2, 1, 1, 0], np.float32))
    grads = []
    for hybridize in (False, True):
        net = Net()
        nd.random.seed(3)
        net.initialize()
        if hybridize:
            net.hybridize()
        with autograd.record():
            out = net(x, label)
        out.backward()
        w = net.weight.data().asnumpy()
        logits = x.asnumpy() @ w.T + net.bias.data().asnumpy()
        p = torch.softmax(T(logits), -1).numpy()
        np.testing.assert_allclose(out.asnumpy(), p, rtol=1e-5, atol=1e-6)
        d = p - np.eye(3, dtype=np.float32)[label.asnumpy().astype(int)]
        np.testing.assert_allclose(net.weight.grad().asnumpy(), d.T @ x.asnumpy(), rtol=1e-4, atol=1e-5)
        grads.append(net.weight.grad().asnumpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)
    net.export(str(tmp_path / "head"))
    back = nn.SymbolBlock.imports(str(tmp_path / "head-symbol.json"), ["data0", "data1"],
                                  str(tmp_path / "head-0000.params"))
    np.testing.assert_allclose(back(x, label).asnumpy(), p, rtol=1e-5, atol=1e-6)


def test_symbols_compose_with_keyword_arguments():
    data = sym.var("data", shape=(2, 3, 7, 7))
    weight, bias = sym.var("w", shape=(4, 3, 3, 3)), sym.var("b", shape=(4,))
    conv = sym.Convolution(data=data, weight=weight, bias=bias, kernel=(3, 3), num_filter=4)
    out = sym.Pooling(data=sym.Activation(data=conv, act_type="relu"), pool_type="max", kernel=(2, 2), stride=(2, 2))
    flat = sym.flatten(out)
    assert isinstance(flat, sym.Symbol) and flat.list_arguments()[:3] == ["data", "w", "b"]
    _, out_shapes, _ = flat.infer_shape(data=(5, 3, 7, 7))
    assert out_shapes == [(5, 16)]
    assert "conv2d" in flat.tojson() and "max_pool2d" in flat.tojson()
    two = sym.concat(data, data, dim=1)
    assert two.infer_shape()[1] == [(2, 6, 7, 7)]


def _raises(fn, exc, *fragments):
    with pytest.raises(exc) as info:
        fn()
    for f in fragments:
        assert f in str(info.value), str(info.value)


X, W = nd.array(X4), nd.array(W4)
ERRORS = {
    "conv_weight_shape": (lambda: nd.Convolution(X, W, kernel=(3, 3), num_filter=5, no_bias=True),
                          kiln.ShapeError, "weight must have shape (5, 3, 3, 3)", "found (4, 3, 3, 3)"),
    "conv_kernel_len": (lambda: nd.Convolution(X, W, kernel=(3, 3, 3), num_filter=4, no_bias=True),
                        kiln.ArgumentError, "kernel must be 2 ints", "(3, 3, 3)"),
    "conv_stride_len": (lambda: nd.Convolution(X, W, kernel=(3, 3), stride=(1, 1, 1), num_filter=4, no_bias=True),
                        kiln.ArgumentError, "stride must be 2 ints"),
    "conv_layout": (lambda: nd.Convolution(X, W, kernel=(3, 3), num_filter=4, no_bias=True, layout="NHWC"),
                    kiln.ArgumentError, "layout 'NHWC' is not supported", "transpose"),
    "conv_needs_bias": (lambda: nd.Convolution(X, W, kernel=(3, 3), num_filter=4),
                        kiln.ArgumentError, "bias is required unless no_bias=True"),
    "conv_needs_kernel": (lambda: nd.Convolution(X, W, num_filter=4, no_bias=True),
                          kiln.ArgumentError, "'kernel' is required"),
    "conv_3d_data": (lambda: nd.Convolution(nd.ones((2, 3, 7)), W, kernel=(3, 3), num_filter=4, no_bias=True),
                     kiln.ShapeError, "data must be 4-D"),
    "conv_groups": (lambda: nd.Convolution(X, W, kernel=(3, 3), num_filter=4, num_group=2, no_bias=True),
                    kiln.ArgumentError, "num_group=2 must divide"),
    "pool_type": (lambda: nd.Pooling(X, kernel=(2, 2), pool_type="lp"), kiln.ArgumentError,
                  "pool_type must be 'max', 'avg' or 'sum', found 'lp'"),
    "pool_kernel": (lambda: nd.Pooling(X, kernel=(2,) * 3), kiln.ArgumentError, "kernel must be 2 ints"),
    "pool_no_kernel": (lambda: nd.Pooling(X), kiln.ArgumentError, "kernel is required unless global_pool"),
    "pool_convention": (lambda: nd.Pooling(X, kernel=(2, 2), pooling_convention="same"), kiln.ArgumentError,
                        "pooling_convention must be 'valid' or 'full'"),
    "pool_full_avg": (lambda: nd.Pooling(X, kernel=(2, 2), stride=(2, 2), pool_type="avg", pooling_convention="full"),
                      kiln.ArgumentError, "pool_type='max' only"),
    "pool_too_big": (lambda: nd.Pooling(X, kernel=(9, 9)), kiln.ShapeError, "larger than the padded input"),
    "fc_weight": (lambda: nd.FullyConnected(X, nd.ones((5, 10)), nd.ones(5), num_hidden=5), kiln.ShapeError,
                  "weight must have shape (5, 147)", "found (5, 10)"),
    "fc_bias": (lambda: nd.FullyConnected(X, nd.ones((5, 147)), nd.ones(4), num_hidden=5), kiln.ShapeError,
                "bias must have shape (5,)"),
    "act_type": (lambda: nd.Activation(X, act_type="swish"), kiln.ArgumentError,
                 "act_type must be one of", "found 'swish'"),
    "leaky_type": (lambda: nd.LeakyReLU(X, act_type="rrelu"), kiln.ArgumentError, "kiln has no rrelu"),
    "bn_shape": (lambda: nd.BatchNorm(X, nd.ones(4), nd.ones(3), nd.ones(3), nd.ones(3)), kiln.ShapeError,
                 "gamma must have shape (3,)"),
    "bn_axis": (lambda: nd.BatchNorm(X, nd.ones(3), nd.ones(3), nd.ones(3), nd.ones(3), axis=4),
                kiln.ArgumentError, "axis=4 is out of range"),
    "dropout_p": (lambda: nd.Dropout(X, p=1.5), kiln.ArgumentError, "p must be in [0, 1)"),
    "softmax_output_norm": (lambda: nd.SoftmaxOutput(nd.ones((2, 3)), nd.ones(2), normalization="all"),
                            kiln.ArgumentError, "normalization must be"),
    "softmax_output_label": (lambda: nd.SoftmaxOutput(nd.ones((2, 3)), nd.ones((3, 2))), kiln.ShapeError,
                             "label must have shape (2,)"),
    "dot_inner": (lambda: nd.dot(nd.ones((2, 3)), nd.ones((4, 2))), kiln.KilnError, ""),
    "dot_nd_inner": (lambda: nd.dot(nd.ones((2, 2, 3)), nd.ones((4, 2))), kiln.ShapeError,
                     "last axis of lhs"),
    "batch_dot_rank": (lambda: nd.batch_dot(nd.ones((2, 3)), nd.ones((3, 2))), kiln.ShapeError, "must be 3-D"),
    "batch_dot_inner": (lambda: nd.batch_dot(nd.ones((2, 2, 3)), nd.ones((2, 4, 2))), kiln.ShapeError,
                        "inner sizes differ"),
    "pick_shape": (lambda: nd.pick(nd.ones((2, 3)), nd.ones(3)), kiln.ShapeError, "index must have shape (2,)"),
    "pick_mode": (lambda: nd.pick(nd.ones((2, 3)), nd.ones(2), mode="raise"), kiln.ArgumentError, "mode must be"),
    "topk_k": (lambda: nd.topk(nd.ones((2, 3)), k=4), kiln.ArgumentError, "k=4 is larger than axis 1"),
    "topk_ret": (lambda: nd.topk(nd.ones((2, 3)), ret_typ="values"), kiln.ArgumentError, "ret_typ must be"),
    "split_uneven": (lambda: nd.split(nd.ones((2, 5)), num_outputs=2), kiln.ShapeError, "do not split into 2"),
    "split_squeeze": (lambda: nd.split(nd.ones((2, 4)), num_outputs=2, squeeze_axis=True), kiln.ShapeError,
                      "squeeze_axis=True needs parts of size 1"),
    "elemwise_shape": (lambda: nd.elemwise_add(nd.ones((2, 3)), nd.ones((1, 3))), kiln.ShapeError,
                       "same shape", "broadcast_add"),
    "sum_axis": (lambda: nd.sum(nd.ones((2, 3)), axis=(0, 2)), kiln.ArgumentError, "axis=2 is out of range"),
    "mean_axis": (lambda: nd.mean(nd.ones((2, 3)), axis=-3), kiln.ShapeError, "axis -3 is out of range"),
    "clip_bounds": (lambda: nd.clip(X, 1, 0), kiln.ArgumentError, "a_min (1) must not exceed a_max (0)"),
    "broadcast_axis_size": (lambda: nd.broadcast_axis(nd.ones((2, 3)), axis=0, size=4), kiln.ShapeError,
                            "must have size 1"),
    "embedding_weight": (lambda: nd.Embedding(nd.ones(2), nd.ones((10, 4)), input_dim=10, output_dim=5),
                         kiln.ShapeError, "weight must have shape (10, 5)"),
    "one_hot_depth": (lambda: nd.one_hot(nd.ones(2), 0), kiln.ArgumentError, "depth must be a positive int"),
    "sequence_mask_lengths": (lambda: nd.SequenceMask(nd.ones((4, 2, 3)), nd.ones(3), use_sequence_length=True),
                              kiln.ShapeError, "sequence_length must have shape (2,)"),
    "sequence_mask_axis": (lambda: nd.SequenceMask(nd.ones((4, 2)), nd.ones(2), use_sequence_length=True, axis=2),
                           kiln.ArgumentError, "axis must be 0 or 1"),
    "repeat_count": (lambda: nd.repeat(nd.ones(2), -1), kiln.ArgumentError,
                     "expected repeats to be a non-negative integer (0 gives an empty axis), found -1"),
    "layer_norm_gamma": (lambda: nd.LayerNorm(X, nd.ones(3), nd.ones(7)), kiln.ShapeError,
                         "gamma must have shape (7,)"),
    "l2norm_mode": (lambda: nd.L2Normalization(X, mode="all"), kiln.ArgumentError, "mode must be"),
    "gather_nd_indices": (lambda: nd.gather_nd(X, nd.ones((5, 2))), kiln.ShapeError, "first axis of 1 to 4"),
    "upsampling_type": (lambda: nd.UpSampling(X, scale=2, sample_type="bilinear"), kiln.ArgumentError,
                        "kiln has no bilinear"),
    "slice_axis_empty": (lambda: nd.slice_axis(X, axis=1, begin=2, end=1), kiln.ArgumentError, "select nothing"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_argument_errors_are_typed_and_say_what_to_do(name):
    fn, exc, *fragments = ERRORS[name]
    _raises(fn, exc, *fragments)


def test_every_op_on_a_simulated_gpu_matches_torch():
    """Every case of CASES on gpu(1) of two simulated GPUs (a fresh interpreter, see test_gpu.py)."""
    import os
    from test_gpu import run_sim
    out = run_sim(f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import numpy as np, kiln
import test_mxnet_ops as t
for name, (fn, ref, arrays, diff) in sorted(t.CASES.items()):
    outs, grads = t._kiln(fn, arrays, diff, device=kiln.gpu(1))
    want_outs, want_grads = t._torch(ref, arrays, diff)
    for got, want in zip(outs + grads, want_outs + want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=name)
print("ok", len(t.CASES))
""")
    assert f"ok {len(CASES)}" in out


def test_dot_shapes_as_mxnet():
    a, m = nd.array(_r(3)), nd.array(_r(3, 4))
    assert nd.dot(a, m).shape == (4,) and nd.dot(m.T, a).shape == (4,) and nd.dot(a, a).shape == (1,)
    np.testing.assert_allclose(nd.dot(a, a).asnumpy(), [a.asnumpy() @ a.asnumpy()], rtol=1e-6)
    np.testing.assert_allclose(nd.dot(a, m).asnumpy(), a.asnumpy() @ m.asnumpy(), rtol=1e-5)


@pytest.mark.filterwarnings("ignore:.*traced again")  # the inference call after training traces once more
def test_batchnorm_in_a_hybridized_block_trains_its_moving_statistics_as_eager():
    class Net(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.gamma = nn.Parameter("gamma", shape=(3,), init=kiln.init.One())
            self.beta = nn.Parameter("beta", shape=(3,), init=kiln.init.Zero())
            self.moving_mean = nn.Parameter("moving_mean", shape=(3,), init=kiln.init.Zero(), grad_req="null")
            self.moving_var = nn.Parameter("moving_var", shape=(3,), init=kiln.init.One(), grad_req="null")

        def hybrid_forward(self, F, x, gamma, beta, moving_mean, moving_var):
            y = F.BatchNorm(x, gamma, beta, moving_mean, moving_var, fix_gamma=False, momentum=0.5)
            return F.Activation(y, act_type="tanh")

    x = nd.array(_r(4, 3, 5, 5) * 3 + 1)
    results = []
    for hybridize in (False, True):
        net = Net()
        net.initialize()
        if hybridize:
            net.hybridize()
        for _ in range(2):
            with autograd.record():
                y = net(x)
            y.backward()
        results.append([net.moving_mean.data().asnumpy(), net.moving_var.data().asnumpy(),
                        net.gamma.grad().asnumpy(), net(x).asnumpy()])  # the last: inference
    mean = x.asnumpy().mean((0, 2, 3))
    np.testing.assert_allclose(results[0][0], 0.75 * mean, rtol=1e-5, atol=1e-6)
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
