"""Convolution and pooling layers (NCHW), as mxnet.gluon.nn, and d2l.ai's ResNet Residual block.

Not here: 1-D and 3-D variants, transposed convolution, NHWC layouts, ceil_mode pooling.
"""
from .. import nd
from .basic_layers import Activation, BatchNorm
from .block import HybridBlock
from .parameter import Parameter

__all__ = ["Conv2D", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D", "GlobalMaxPool2D", "Residual"]


def _pair(v):
    return (int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v)


def _check_layout(layout):
    if layout != "NCHW":
        raise NotImplementedError(f"layout {layout!r} is not supported; kiln's 2-D layers use 'NCHW'")


class Conv2D(HybridBlock):
    """2-D convolution: weight (channels, in_channels // groups, kh, kw), optional bias and
    activation. in_channels=0 learns the input channels from the first input."""

    def __init__(self, channels, kernel_size, strides=1, padding=0, dilation=1, groups=1,
                 layout="NCHW", activation=None, use_bias=True, weight_initializer=None,
                 bias_initializer="zeros", in_channels=0, dtype="float32"):
        super().__init__()
        _check_layout(layout)
        self._channels, self._in_channels, self._groups = channels, in_channels, groups
        self._kernel, self._strides = _pair(kernel_size), _pair(strides)
        self._padding, self._dilation = _pair(padding), _pair(dilation)
        self.weight = Parameter("weight", shape=(channels, in_channels // groups) + self._kernel,
                                dtype=dtype, init=weight_initializer, allow_deferred_init=True)
        self.bias = (Parameter("bias", shape=(channels,), dtype=dtype, init=bias_initializer,
                               allow_deferred_init=True) if use_bias else None)
        self.act = Activation(activation) if activation is not None else None

    def forward(self, x):
        if self.weight.shape[1] == 0:
            self.weight._infer_shape((self._channels, x.shape[1] // self._groups) + self._kernel)
        d = x.device
        y = nd.conv2d(x, self.weight.data(d), self.bias.data(d) if self.bias is not None else None,
                      stride=self._strides, padding=self._padding, dilation=self._dilation,
                      groups=self._groups)
        return self.act(y) if self.act is not None else y

    def __repr__(self):
        in_channels = self.weight.shape[1] * self._groups or None
        return (f"Conv2D({in_channels} -> {self._channels}, kernel_size={self._kernel}, "
                f"stride={self._strides}, padding={self._padding})")


class _Pool2D(HybridBlock):
    def __init__(self, pool_size, strides, padding, ceil_mode, layout):
        super().__init__()
        _check_layout(layout)
        if ceil_mode:
            raise NotImplementedError("pooling with ceil_mode=True is not supported yet")
        self._pool = _pair(pool_size)
        self._strides = self._pool if strides is None else _pair(strides)
        self._padding = _pair(padding)

    def __repr__(self):
        return f"{type(self).__name__}(size={self._pool}, stride={self._strides}, padding={self._padding})"


class MaxPool2D(_Pool2D):
    """Max over pool_size windows; strides default to pool_size."""

    def __init__(self, pool_size=2, strides=None, padding=0, ceil_mode=False, layout="NCHW"):
        super().__init__(pool_size, strides, padding, ceil_mode, layout)

    def forward(self, x):
        return nd.max_pool2d(x, self._pool, self._strides, self._padding)


class AvgPool2D(_Pool2D):
    """Mean over pool_size windows; count_include_pad counts padding zeros in the mean."""

    def __init__(self, pool_size=2, strides=None, padding=0, ceil_mode=False, layout="NCHW",
                 count_include_pad=True):
        super().__init__(pool_size, strides, padding, ceil_mode, layout)
        self._count_include_pad = count_include_pad

    def forward(self, x):
        return nd.avg_pool2d(x, self._pool, self._strides, self._padding, self._count_include_pad)


class GlobalAvgPool2D(HybridBlock):
    """(N, C, H, W) -> (N, C, 1, 1), the mean over each channel's plane."""

    def __init__(self, layout="NCHW"):
        super().__init__()
        _check_layout(layout)

    def forward(self, x):
        return nd.global_avg_pool2d(x)


class GlobalMaxPool2D(HybridBlock):
    """(N, C, H, W) -> (N, C, 1, 1), the max over each channel's plane."""

    def __init__(self, layout="NCHW"):
        super().__init__()
        _check_layout(layout)

    def forward(self, x):
        return x.max(axis=(2, 3), keepdims=True)


class Residual(HybridBlock):
    """The residual block of d2l.ai's ResNet: conv3x3-BN-relu-conv3x3-BN, plus the input (through
    a 1x1 convolution when use_1x1conv, to match channels and stride), then relu."""

    def __init__(self, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = Conv2D(num_channels, kernel_size=3, padding=1, strides=strides)
        self.conv2 = Conv2D(num_channels, kernel_size=3, padding=1)
        self.conv3 = Conv2D(num_channels, kernel_size=1, strides=strides) if use_1x1conv else None
        self.bn1 = BatchNorm()
        self.bn2 = BatchNorm()

    def forward(self, X):
        Y = nd.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return nd.relu(Y + X)
