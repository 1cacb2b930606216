"""kiln.loss: losses as mxnet.gluon.loss, each returning one value per sample, shape (batch,).

Every loss computes an element-wise loss, multiplies by sample_weight (broadcast; a (batch,)
weight is aligned with the batch axis) and by the scalar `weight`, then takes the mean over
every axis but batch_axis. Not here: CTC, KL-divergence, Huber, hinge and triplet losses.
"""
from . import _C, nd
from ._C import ArgumentError, NDArray, ShapeError
from .nn.basic_layers import _softrelu
from .nn.block import HybridBlock

__all__ = ["Loss", "L2Loss", "L1Loss", "SigmoidBinaryCrossEntropyLoss", "SigmoidBCELoss",
           "SoftmaxCrossEntropyLoss", "SoftmaxCELoss"]


def _reshape_like(label, pred):
    if label.shape == pred.shape:
        return label
    if label.size != pred.size:
        raise ShapeError(f"loss: expected a label of shape {pred.shape} (like the prediction), "
                         f"found {label.shape}")
    return label.reshape(pred.shape)


class Loss(HybridBlock):
    """Base class: `weight` scales the loss, `batch_axis` is the axis kept in the result.

    A loss compiles itself, without hybridize(), when autograd is recording and its prediction is
    the output of a hybridized block's call (the d2l loop: `l = loss(net(X), y)` with `net`
    hybridized): its ops then run as one compiled plan, not as a dozen eager tasks, and the
    compiled backward inlines its gradient with the network's. hybridize(False) turns that off.
    Only kiln's own loss classes do it: a user's subclass (whose code may branch on values, as a
    trace cannot) runs eagerly unless hybridized."""

    def __init__(self, weight=None, batch_axis=0):
        super().__init__()
        if weight is not None and not isinstance(weight, (int, float)):
            raise ArgumentError(f"loss weight must be a number or None, got {type(weight).__name__}")
        self._weight, self._batch_axis = weight, batch_axis
        self._auto_compile = type(self).__module__ == __name__  # kiln's classes, not a subclass of one

    def hybridize(self, active=True, **kwargs):
        self._auto_compile = bool(active)
        super().hybridize(active, **kwargs)

    def __call__(self, *args, **kwargs):
        if (not self._active and not kwargs and args and self.__dict__.get("_auto_compile", False)
                and type(args[0]) is NDArray and _C._from_compiled_call(args[0]) and not _C.tracing()
                and all(type(a) is NDArray or a is None for a in args)):
            while args and args[-1] is None:  # loss(pred, label, None): the same graph as without it
                args = args[:-1]
            if all(type(a) is NDArray for a in args):
                return self._call_cached(args)
        return super().__call__(*args, **kwargs)

    def _weighted_mean(self, loss, sample_weight=None, weight=None):
        if sample_weight is not None:
            if isinstance(sample_weight, NDArray) and sample_weight.ndim < loss.ndim:
                sample_weight = sample_weight.reshape(
                    sample_weight.shape + (1,) * (loss.ndim - sample_weight.ndim))
            elif isinstance(sample_weight, NDArray) and sample_weight.ndim > loss.ndim and all(
                    d == 1 for d in sample_weight.shape[loss.ndim:]):
                # A (batch, 1) weight against a loss already reduced over the class axis.
                sample_weight = sample_weight.reshape(sample_weight.shape[:loss.ndim])
            loss = loss * sample_weight
        if weight is not None:
            loss = loss * weight
        axes = tuple(a for a in range(loss.ndim) if a != self._batch_axis % max(loss.ndim, 1))
        return loss.mean(axis=axes) if axes else loss

    def __repr__(self):
        return f"{type(self).__name__}(batch_axis={self._batch_axis}, w={self._weight})"


class L2Loss(Loss):
    """0.5 * (pred - label)^2, the mean over non-batch axes."""

    def __init__(self, weight=1.0, batch_axis=0):
        super().__init__(weight, batch_axis)

    def forward(self, pred, label, sample_weight=None):
        loss = nd.square(_reshape_like(label, pred) - pred)
        return self._weighted_mean(loss, sample_weight, self._weight / 2)


class L1Loss(Loss):
    """|pred - label|, the mean over non-batch axes."""

    def __init__(self, weight=None, batch_axis=0):
        super().__init__(weight, batch_axis)

    def forward(self, pred, label, sample_weight=None):
        loss = nd.abs(_reshape_like(label, pred) - pred)
        return self._weighted_mean(loss, sample_weight, self._weight)


class SigmoidBinaryCrossEntropyLoss(Loss):
    """Binary cross-entropy with labels in [0, 1].

    from_sigmoid=False (the default) takes logits and uses the stable form
    max(x, 0) - x * z + log(1 + exp(-|x|)); from_sigmoid=True takes probabilities.
    pos_weight scales the positive term, as Gluon.
    """

    def __init__(self, from_sigmoid=False, weight=None, batch_axis=0):
        super().__init__(weight, batch_axis)
        self._from_sigmoid = from_sigmoid

    def forward(self, pred, label, sample_weight=None, pos_weight=None):
        label = _reshape_like(label, pred)
        if not self._from_sigmoid:
            if pos_weight is None:
                loss = nd.relu(pred) - pred * label + _softrelu(-nd.abs(pred))
            else:
                log_weight = (pos_weight - 1) * label + 1
                loss = pred - pred * label + log_weight * (_softrelu(-nd.abs(pred)) + nd.relu(-pred))
        else:
            eps = 1e-12
            pos = nd.log(pred + eps) * label
            if pos_weight is not None:
                pos = pos * pos_weight
            loss = -(pos + nd.log(1 - pred + eps) * (1 - label))
        return self._weighted_mean(loss, sample_weight, self._weight)


SigmoidBCELoss = SigmoidBinaryCrossEntropyLoss


class SoftmaxCrossEntropyLoss(Loss):
    """Cross-entropy of softmax(pred) along `axis` against class indices (sparse_label=True) or
    distributions (sparse_label=False); from_logits=True means pred is already log-softmax."""

    def __init__(self, axis=-1, sparse_label=True, from_logits=False, weight=None, batch_axis=0):
        super().__init__(weight, batch_axis)
        self._axis, self._sparse_label, self._from_logits = axis, sparse_label, from_logits

    def forward(self, pred, label, sample_weight=None):
        axis = self._axis % pred.ndim
        if self._sparse_label:
            expected = pred.shape[:axis] + pred.shape[axis + 1:]
            if label.shape != expected:
                if label.size != pred.size // pred.shape[axis]:
                    raise ShapeError(f"SoftmaxCrossEntropyLoss: expected class indices of shape "
                                     f"{expected} for predictions {pred.shape}, found {label.shape}")
                label = label.reshape(expected)
        elif label.shape != pred.shape:
            raise ShapeError(f"SoftmaxCrossEntropyLoss(sparse_label=False): expected a label of "
                             f"shape {pred.shape}, found {label.shape}")
        if axis != pred.ndim - 1:
            # kiln's fused op wants the class axis last; move it there (the loss keeps the rest).
            perm = [a for a in range(pred.ndim) if a != axis] + [axis]
            pred = pred.transpose(perm)
            if not self._sparse_label:
                label = label.transpose(perm)
        if not self._from_logits:
            loss = nd.softmax_cross_entropy(pred, label, axis=-1, sparse_label=self._sparse_label)
        else:
            if self._sparse_label:
                if label._dtype_name not in ("int32", "int64"):
                    label = label.astype("int64")
                label = _C.one_hot(label, pred.shape[-1], labels=True)  # out of range: an error
            loss = -(pred * label.astype(pred._dtype_name)).sum(axis=-1)
        return self._weighted_mean(loss, sample_weight, self._weight)


SoftmaxCELoss = SoftmaxCrossEntropyLoss
