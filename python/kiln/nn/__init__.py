"""kiln.nn: Gluon-style modelling: Parameter, Block, HybridBlock, Sequential and layers.

    from kiln import nn
    net = nn.Sequential()
    net.add(nn.Dense(256, activation='relu'), nn.Dense(10))
    net.initialize()            # shapes are completed by the first forward pass
    y = net(x)
    net.hybridize(); net(x); net.export("model")         # model-symbol.json, model-0000.params
    net2 = nn.SymbolBlock.imports("model-symbol.json", ["data"], "model-0000.params")
"""
from .parameter import Parameter, ParameterDict, DeferredInitializationError
from .block import Block, HybridBlock, Sequential, HybridSequential
from .basic_layers import Dense, Activation, Dropout, Flatten, BatchNorm, Embedding
from .symbol_block import SymbolBlock
from .conv_layers import Conv2D, MaxPool2D, AvgPool2D, GlobalAvgPool2D, GlobalMaxPool2D, Residual

__all__ = ["Parameter", "ParameterDict", "DeferredInitializationError", "Block", "HybridBlock",
           "Sequential", "HybridSequential", "SymbolBlock", "Dense", "Activation", "Dropout",
           "Flatten", "BatchNorm", "Embedding", "Conv2D", "MaxPool2D", "AvgPool2D",
           "GlobalAvgPool2D", "GlobalMaxPool2D", "Residual"]
