"""End to end: d2l's LeNet trained eagerly on a few thousand Fashion-MNIST images must learn."""
import numpy as np

import kiln
from kiln import autograd, nn
from kiln.data import DataLoader, FashionMNIST, Subset, transforms


def _lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(channels=20, kernel_size=3, activation="relu"),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=50, kernel_size=5, activation="relu"),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Flatten(),
            nn.Dense(128, activation="relu"),
            nn.Dense(10))
    return net


def _accuracy(net, loader):
    right = total = 0
    for X, y in loader:
        right += int((net(X).argmax(axis=1).astype("int32") == y).sum().item())
        total += y.shape[0]
    return right / total


def test_lenet_learns_fashion_mnist():
    kiln.nd.random.seed(1)
    to_tensor = transforms.ToTensor()
    train = FashionMNIST(train=True).transform_first(to_tensor)
    test = FashionMNIST(train=False).transform_first(to_tensor)
    train_iter = DataLoader(Subset(train, range(4000)), batch_size=128, shuffle=True, seed=0)
    test_iter = DataLoader(Subset(test, range(1000)), batch_size=500)
    net = _lenet()
    net.initialize(kiln.init.Xavier())
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    before = _accuracy(net, test_iter)
    losses = []
    for epoch in range(3):
        total = 0.0
        for X, y in train_iter:
            with autograd.record():
                l = loss(net(X), y)
            l.backward()
            trainer.step(X.shape[0])
            total += l.sum().item()
        losses.append(total / 4000)
    after = _accuracy(net, test_iter)
    assert losses[-1] < losses[0] < np.log(10) + 0.1, losses
    assert before < 0.3
    assert after > 0.6, f"test accuracy {after:.3f} after 3 epochs on 4000 images (loss {losses})"
