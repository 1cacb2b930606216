"""Image transforms as gluon.data.vision.transforms: ToTensor, Normalize, Resize, Compose.

Each works on one sample (NumPy in, NumPy out; NDArray in, NDArray out) and on a batch with a
leading axis. Transforms that reduce to out = (x * scale - mean[c]) / std[c] with HWC -> CHW say
so through _affine(); the DataLoader then converts whole batches in C++ (kiln._C.images_to_batch)
instead of calling them per image. Resize is bilinear, on the host (NumPy).
Not here: cropping, random augmentation.
"""
import numpy as np

from .. import _C

__all__ = ["Transform", "ToTensor", "Normalize", "Resize", "Compose"]


class Transform:
    """Base of kiln's transforms: a callable on one sample or a batch."""

    def __call__(self, x):
        raise NotImplementedError

    def _affine(self):
        """(scale, mean, std) when this transform is uint8 HWC -> (x * scale - mean) / std CHW, else None."""
        return None


class ToTensor(Transform):
    """uint8 images HWC (or NHWC, or HW) in [0, 255] -> float32 CHW (or NCHW) in [0, 1]."""

    def __call__(self, x):
        if isinstance(x, _C.NDArray):
            x = x.astype("float32") / 255.0
            if x.ndim == 2:
                return x.reshape((1,) + x.shape)
            return x.transpose((2, 0, 1) if x.ndim == 3 else (0, 3, 1, 2))
        x = np.asarray(x)
        if x.ndim == 2:
            x = x[:, :, None]
        if x.ndim not in (3, 4):
            raise ValueError(f"ToTensor: expected an image of shape (H, W, C) or a batch (N, H, W, C), "
                             f"got shape {x.shape}")
        axes = (2, 0, 1) if x.ndim == 3 else (0, 3, 1, 2)
        return np.ascontiguousarray(x.transpose(axes), dtype=np.float32) * np.float32(1 / 255)

    def _affine(self):
        return 1.0 / 255.0, np.zeros(1), np.ones(1)

    def __repr__(self):
        return "ToTensor()"


class Normalize(Transform):
    """(x - mean[c]) / std[c] on float CHW (or NCHW) images; mean and std are numbers or per-channel."""

    def __init__(self, mean=0.0, std=1.0):
        self.mean = np.atleast_1d(np.asarray(mean, dtype=np.float32))
        self.std = np.atleast_1d(np.asarray(std, dtype=np.float32))
        if np.any(self.std == 0):
            raise ValueError(f"Normalize: std must be nonzero, got {self.std.tolist()}")

    def __call__(self, x):
        c_axis = 0 if x.ndim == 3 else 1
        shape = [1] * x.ndim
        shape[c_axis] = -1
        m, s = self.mean.reshape(shape), self.std.reshape(shape)
        if isinstance(x, _C.NDArray):
            return (x - _C.array(m, device=x.device)) / _C.array(s, device=x.device)
        return ((np.asarray(x, dtype=np.float32) - m) / s).astype(np.float32)

    def __repr__(self):
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


class Resize(Transform):
    """Resizes HWC (or HW) images to `size` (an int: a square; or (width, height), as MXNet) by
    bilinear interpolation with pixel centres aligned (OpenCV's INTER_LINEAR). keep_ratio with an
    int size scales the shorter side to `size`. The dtype is kept (uint8 is rounded)."""

    def __init__(self, size, keep_ratio=False, interpolation=1):
        sizes = (size, size) if isinstance(size, int) else tuple(size)
        if len(sizes) != 2 or any(not isinstance(v, int) or v <= 0 for v in sizes):
            raise ValueError(f"Resize: size must be a positive int or (width, height), got {size!r}")
        if interpolation not in (1,):
            raise ValueError(f"Resize: only bilinear interpolation (interpolation=1) is supported, got "
                             f"{interpolation!r}")
        self.size, self.keep_ratio = sizes, bool(keep_ratio) and isinstance(size, int)

    def _out_hw(self, h, w):
        if self.keep_ratio:
            s = self.size[0] / min(h, w)
            return max(1, round(h * s)), max(1, round(w * s))
        return self.size[1], self.size[0]

    def __call__(self, x):
        device = x.device if isinstance(x, _C.NDArray) else None
        a = x.asnumpy() if device is not None else np.asarray(x)
        if a.ndim not in (2, 3):
            raise ValueError(f"Resize: expected an image of shape (H, W) or (H, W, C), got shape {a.shape}")
        h, w = a.shape[:2]
        oh, ow = self._out_hw(h, w)

        def axis(n_in, n_out):
            src = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
            lo = np.floor(src).astype(np.int64)
            hi = np.minimum(lo + 1, n_in - 1)
            return lo, hi, (src - lo).astype(np.float32)

        y0, y1, fy = axis(h, oh)
        x0, x1, fx = axis(w, ow)
        f = a.astype(np.float32)
        fy = fy.reshape((-1, 1) + (1,) * (a.ndim - 2))
        fx = fx.reshape((1, -1) + (1,) * (a.ndim - 2))
        top = f[y0][:, x0] * (1 - fx) + f[y0][:, x1] * fx
        bottom = f[y1][:, x0] * (1 - fx) + f[y1][:, x1] * fx
        out = top * (1 - fy) + bottom * fy
        if np.issubdtype(a.dtype, np.integer):
            info = np.iinfo(a.dtype)
            out = np.clip(np.rint(out), info.min, info.max)
        out = out.astype(a.dtype)
        return _C.array(out, device=device) if device is not None else out

    def __repr__(self):
        return f"Resize(size={self.size}, keep_ratio={self.keep_ratio})"


class Compose(Transform):
    """Applies the transforms in order (as gluon's Compose)."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x

    def _affine(self):
        # ToTensor first, then any Normalize: ((x*a - m1)/s1 - m2)/s2 = (x*a - (m1 + m2*s1)) / (s1*s2).
        if not self.transforms or not isinstance(self.transforms[0], ToTensor):
            return None
        scale, mean, std = self.transforms[0]._affine()
        for t in self.transforms[1:]:
            if not isinstance(t, Normalize):
                return None
            mean, std = mean + t.mean * std, std * t.std
        return scale, mean, std

    def __repr__(self):
        return "Compose([" + ", ".join(map(repr, self.transforms)) + "])"
