"""kiln.data: datasets, transforms and the DataLoader, in the names of gluon.data.

    from kiln.data import DataLoader, FashionMNIST, transforms
    train = FashionMNIST(train=True).transform_first(transforms.ToTensor())
    for X, y in DataLoader(train, batch_size=256, shuffle=True, seed=0):
        ...  # X: float32 (256, 1, 28, 28) NDArray, y: int32 (256,) NDArray
"""
from . import transforms
from . import vision
from .dataloader import DataLoader, default_batchify_fn
from .dataset import ArrayDataset, Dataset, SimpleDataset, Subset, read_idx
from .vision import FashionMNIST

__all__ = ["Dataset", "ArrayDataset", "SimpleDataset", "Subset", "DataLoader", "default_batchify_fn",
           "FashionMNIST", "read_idx", "transforms", "vision"]
