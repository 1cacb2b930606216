"""Vision datasets read from local IDX files: FashionMNIST (as gluon.data.vision.FashionMNIST).

Nothing is downloaded: the files come from the Debian package dataset-fashion-mnist (in
/usr/share/datasets/fashion-mnist) or from any folder passed as `root`.
"""
import functools
import os

import numpy as np

from . import transforms  # noqa: F401  (kiln.data.vision.transforms, as Gluon)
from .dataset import ArrayDataset, _affine_of, _as_batch_array, _images_to_batch, read_idx

__all__ = ["FashionMNIST", "transforms"]

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"


@functools.lru_cache(maxsize=8)
def _load_idx(path, mtime, size):
    # Keyed by mtime and size so a replaced file is read again; read-only so the cache stays intact.
    a = read_idx(path)
    a.flags.writeable = False
    return a


def _find(root, name, dataset, package):
    for candidate in (os.path.join(root, name + ".gz"), os.path.join(root, name)):
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"{dataset}: '{os.path.join(root, name + '.gz')}' not found (nor the uncompressed '{name}'). "
        f"`sudo apt-get install {package}` provides it in {FASHION_MNIST_ROOT}, or pass root= a folder "
        f"that holds the IDX files")


def _mxnet_download_root(root, prefix):
    """MXNet code (d2lzh among it) passes root='~/.mxnet/datasets/fashion-mnist', where MXNet would
    download the files; kiln downloads nothing, so when that folder lacks them the Debian copy is
    read instead (the same data), with a warning that says so."""
    mxnet_cache = os.path.join(os.path.expanduser("~"), ".mxnet") + os.sep
    if not root.startswith(mxnet_cache) or os.path.isfile(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz")):
        return root
    if not os.path.isfile(os.path.join(FASHION_MNIST_ROOT, f"{prefix}-labels-idx1-ubyte.gz")):
        return root
    import warnings
    warnings.warn(f"FashionMNIST: '{root}' (MXNet's download folder) does not hold the data set; reading the "
                  f"same files from {FASHION_MNIST_ROOT} (kiln does not download)", stacklevel=3)
    return FASHION_MNIST_ROOT


class FashionMNIST(ArrayDataset):
    """Fashion-MNIST: 28x28 grayscale images of 10 kinds of clothing; 60000 to train, 10000 to test.

    ds[i] is (image, label): image a (28, 28, 1) uint8 NumPy array, label an int in [0, 10).
    `transform` is either a callable (image, label) -> (image, label) as in Gluon, or a transform
    from kiln.data.transforms, applied to the image only (and to whole batches at once by the
    DataLoader). `limit` keeps the first `limit` samples (small runs in CI).
    """

    classes = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
               "ankle boot"]

    def __init__(self, root=FASHION_MNIST_ROOT, train=True, transform=None, limit=None):
        prefix = "train" if train else "t10k"
        root = _mxnet_download_root(os.path.expanduser(str(root)), prefix)
        paths = [_find(root, f"{prefix}-{kind}-ubyte", "FashionMNIST", FASHION_MNIST_PACKAGE)
                 for kind in ("images-idx3", "labels-idx1")]
        images, labels = (_load_idx(p, os.path.getmtime(p), os.path.getsize(p)) for p in paths)
        from .. import FormatError
        if images.ndim != 3 or labels.ndim != 1 or images.dtype != np.uint8 or labels.dtype != np.uint8:
            raise FormatError(f"FashionMNIST: expected uint8 images (N, H, W) and uint8 labels (N,), got "
                              f"{images.dtype} {images.shape} in '{paths[0]}' and {labels.dtype} "
                              f"{labels.shape} in '{paths[1]}'")
        if len(images) != len(labels):
            raise FormatError(f"FashionMNIST: '{paths[0]}' has {len(images)} images but '{paths[1]}' has "
                              f"{len(labels)} labels")
        if limit is not None:
            if limit < 0:
                raise ValueError(f"FashionMNIST: limit must be >= 0, got {limit}")
            images, labels = images[:limit], labels[:limit]
        self.root, self.train = root, train
        self._transform = transform
        super().__init__(images[..., None], labels.astype(np.int32))

    @property
    def images(self):
        """Every image as one read-only uint8 NumPy array (N, H, W), before any transform."""
        return self._arrays[0][..., 0]

    @property
    def labels(self):
        """Every label as one int32 NumPy array (N,)."""
        return self._arrays[1]

    def __getitem__(self, idx):
        image, label = self._arrays[0][idx], int(self._arrays[1][idx])
        if self._transform is None:
            return image, label
        if isinstance(self._transform, transforms.Transform):
            return self._transform(image), label
        return self._transform(image, label)

    def _take(self, indices):
        return None if self._transform is not None else super()._take(indices)

    def _batch(self, indices, device=None):
        if self._transform is None:
            return super()._batch(indices, device)
        affine = _affine_of(self._transform)
        if affine is None:
            return None
        images, labels = super()._take(indices)
        return _images_to_batch(images, affine, device), _as_batch_array(labels, device)

    def __repr__(self):
        return (f"FashionMNIST({'train' if self.train else 'test'}, {len(self)} samples, "
                f"root='{self.root}')")
