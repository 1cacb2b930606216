"""Basic layers, as mxnet.gluon.nn: Dense, Activation, Dropout, Flatten, BatchNorm, Embedding.

Each layer with an input size of 0 (in_units=0, in_channels=0) learns it from the first input
and initializes its weight then (deferred initialization). Not here: LayerNorm, GroupNorm,
InstanceNorm, Lambda layers, sparse gradients.
"""
from .. import autograd, nd
from .._C import ArgumentError
from .block import HybridBlock
from .parameter import Parameter

__all__ = ["Dense", "Activation", "Dropout", "Flatten", "BatchNorm", "Embedding"]


def _softrelu(x):
    # log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)).
    return nd.relu(x) + nd.log1p(nd.exp(-nd.abs(x)))


def _softsign(x):
    return x / (nd.abs(x) + 1)


_ACTIVATIONS = {"relu": nd.relu, "sigmoid": nd.sigmoid, "tanh": nd.tanh, "softrelu": _softrelu,
                "gelu": nd.gelu, "softsign": _softsign}


def _activation_fn(name):
    if name not in _ACTIVATIONS:
        raise ArgumentError(f"unknown activation {name!r}; expected one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


class Activation(HybridBlock):
    """Applies a named activation: 'relu', 'sigmoid', 'tanh', 'softrelu', 'gelu' or 'softsign'."""

    def __init__(self, activation):
        super().__init__()
        self._act_type = activation
        self._fn = _activation_fn(activation)

    def forward(self, x):
        return self._fn(x)

    def __repr__(self):
        return f"Activation({self._act_type})"


class Dense(HybridBlock):
    """y = activation(x @ W^T + b), W of shape (units, in_units).

    flatten=True reshapes the input to (batch, -1) first; flatten=False applies the layer to the
    last axis and keeps the others.
    """

    def __init__(self, units, activation=None, use_bias=True, flatten=True, dtype="float32",
                 weight_initializer=None, bias_initializer="zeros", in_units=0):
        super().__init__()
        self._units, self._in_units, self._flatten = units, in_units, flatten
        self.weight = Parameter("weight", shape=(units, in_units), dtype=dtype,
                                init=weight_initializer, allow_deferred_init=True)
        self.bias = (Parameter("bias", shape=(units,), dtype=dtype, init=bias_initializer,
                               allow_deferred_init=True) if use_bias else None)
        self.act = Activation(activation) if activation is not None else None

    def forward(self, x):
        if self._flatten and x.ndim != 2:
            x = nd.flatten(x)
        if self.weight.shape[1] == 0:
            self.weight._infer_shape((self._units, x.shape[-1]))
        device = x.device
        y = nd.linear(x, self.weight.data(device), self.bias.data(device) if self.bias is not None else None)
        return self.act(y) if self.act is not None else y

    def __repr__(self):
        in_units = self.weight.shape[1] or None
        act = f", {self.act!r}" if self.act is not None else ""
        return f"Dense({in_units} -> {self._units}{act})"


class Dropout(HybridBlock):
    """Zeros each element with probability `rate` in training and scales the rest by 1/(1-rate);
    the identity outside training (autograd.record() or train_mode() turn training on)."""

    def __init__(self, rate, axes=()):
        super().__init__()
        if not 0.0 <= rate < 1.0:
            raise ArgumentError(f"Dropout: rate must be in [0, 1), got {rate}")
        if axes:
            raise NotImplementedError("Dropout(axes=...): shared masks along axes are not supported yet")
        self._rate = rate

    def forward(self, x):
        if self._rate == 0.0 or not autograd.is_training():
            return x
        return nd.dropout(x, self._rate, True)

    def __repr__(self):
        return f"Dropout(p = {self._rate})"


class Flatten(HybridBlock):
    """Reshapes (batch, d1, d2, ...) to (batch, d1 * d2 * ...)."""

    def forward(self, x):
        return nd.flatten(x)


class BatchNorm(HybridBlock):
    """Batch normalization over every axis but `axis`.

    In training (autograd.is_training()) it normalizes with the batch statistics and updates
    running = momentum * running + (1 - momentum) * batch; otherwise it uses the running
    statistics. running_mean and running_var have grad_req 'null'.
    """

    def __init__(self, axis=1, momentum=0.9, epsilon=1e-5, center=True, scale=True,
                 use_global_stats=False, beta_initializer="zeros", gamma_initializer="ones",
                 running_mean_initializer="zeros", running_variance_initializer="ones",
                 in_channels=0, dtype="float32"):
        super().__init__()
        self._axis, self._momentum, self._epsilon = axis, momentum, epsilon
        self._use_global_stats = use_global_stats

        def param(name, init, grad_req):
            return Parameter(name, grad_req=grad_req, shape=(in_channels,), dtype=dtype, init=init,
                             allow_deferred_init=True, differentiable=grad_req != "null")
        self.gamma = param("gamma", gamma_initializer, "write" if scale else "null")
        self.beta = param("beta", beta_initializer, "write" if center else "null")
        self.running_mean = param("running_mean", running_mean_initializer, "null")
        self.running_var = param("running_var", running_variance_initializer, "null")

    def forward(self, x):
        if self.gamma.shape[0] == 0:
            channels = x.shape[self._axis]
            for p in (self.gamma, self.beta, self.running_mean, self.running_var):
                p._infer_shape((channels,))
        d = x.device
        training = autograd.is_training() and not self._use_global_stats
        return nd.batch_norm(x, self.gamma.data(d), self.beta.data(d), self.running_mean.data(d),
                             self.running_var.data(d), axis=self._axis, eps=self._epsilon,
                             momentum=self._momentum, training=training)

    def __repr__(self):
        return (f"BatchNorm(axis={self._axis}, eps={self._epsilon}, momentum={self._momentum}, "
                f"in_channels={self.gamma.shape[0] or None})")


class Embedding(HybridBlock):
    """Looks up rows of a (input_dim, output_dim) weight; indices may be integers or floats."""

    def __init__(self, input_dim, output_dim, dtype="float32", weight_initializer=None):
        super().__init__()
        self._input_dim, self._output_dim = input_dim, output_dim
        self.weight = Parameter("weight", shape=(input_dim, output_dim), dtype=dtype,
                                init=weight_initializer)

    def forward(self, x):
        if x._dtype_name not in ("int32", "int64"):
            x = x.astype("int64")
        return nd.take(self.weight.data(x.device), x, 0)

    def __repr__(self):
        return f"Embedding({self._input_dim} -> {self._output_dim}, {self.weight.dtype})"
