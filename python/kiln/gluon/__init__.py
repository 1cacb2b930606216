"""kiln.gluon: mxnet.gluon's layout over kiln's own modules, so Gluon 1.x code runs with its
imports changed (`from kiln.gluon import nn, loss as gloss, data as gdata, utils as gutils`).

    gluon.nn     is kiln.nn      (Block, HybridBlock, Sequential, Dense, Conv2D, SymbolBlock...)
    gluon.loss   is kiln.loss    (L2Loss, SoftmaxCrossEntropyLoss...)
    gluon.data   is kiln.data    (Dataset, ArrayDataset, DataLoader, vision.FashionMNIST,
                                  vision.transforms)
    gluon.utils  split_and_load, split_data, clip_global_norm
    gluon.Trainer, gluon.Parameter, gluon.ParameterDict, gluon.Block, gluon.HybridBlock,
    gluon.SymbolBlock are kiln's classes.

They are the same module and class objects as kiln's flat names (kiln.gluon.nn.Dense is
kiln.nn.Dense), registered in sys.modules under both names so `import kiln.gluon.nn` and
`from kiln.gluon.data.vision import transforms` give them too. Not here: gluon.rnn,
gluon.model_zoo, gluon.contrib, utils.download.
"""
import sys as _sys

from .. import data, loss, nn
from ..nn import (Block, DeferredInitializationError, HybridBlock, Parameter, ParameterDict,
                  SymbolBlock)
from ..trainer import Trainer
from . import utils

__all__ = ["nn", "loss", "data", "utils", "Trainer", "Parameter", "ParameterDict", "Block",
           "HybridBlock", "SymbolBlock", "DeferredInitializationError"]


def _alias(module, as_name):
    """Makes `as_name` (and as_name.<sub> for each loaded submodule) import as `module`."""
    prefix = module.__name__ + "."
    _sys.modules[as_name] = module
    for name, sub in list(_sys.modules.items()):
        if name.startswith(prefix) and sub is not None:
            _sys.modules[as_name + "." + name[len(prefix):]] = sub


for _mod in (nn, loss, data):
    _alias(_mod, __name__ + "." + _mod.__name__.rsplit(".", 1)[1])
del _mod
