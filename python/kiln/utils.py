"""Training helpers in the names of d2l.ai and gluon.utils: Timer, Benchmark, Accumulator, accuracy,
evaluate_accuracy, split_and_load, ProgressBar and plot_curves.

Not here: models, losses, optimizers (kiln.nn, kiln.loss, kiln.Trainer) and data (kiln.data).
"""
import os
import sys
import time

import numpy as np

from . import _C, autograd

__all__ = ["Timer", "Benchmark", "Accumulator", "accuracy", "evaluate_accuracy", "split_and_load",
           "split_data", "ProgressBar", "plot_curves"]


class Timer:
    """Records several running times (as d2l.Timer): start(), stop() -> seconds, avg(), sum(), cumsum()."""

    def __init__(self):
        self.times = []
        self.start()

    def start(self):
        self.tik = time.perf_counter()

    def stop(self):
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self):
        return sum(self.times) / len(self.times) if self.times else 0.0

    def sum(self):
        return sum(self.times)

    def cumsum(self):
        return np.array(self.times).cumsum().tolist()


class Benchmark:
    """`with Benchmark('label'):` prints 'label: 1.2345 sec' once the block's queued work is done."""

    def __init__(self, description="Done", file=None):
        self.description, self.file = description, file
        self.seconds = None

    def __enter__(self):
        self.timer = Timer()
        return self

    def __exit__(self, *exc):
        _C.waitall()
        self.seconds = self.timer.stop()
        print(f"{self.description}: {self.seconds:.4f} sec", file=self.file or sys.stdout)
        return False


class Accumulator:
    """Sums over n variables (as d2l.Accumulator): add(*values), reset(), acc[i]."""

    def __init__(self, n):
        self.data = [0.0] * n

    def add(self, *args):
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self):
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]


def accuracy(y_hat, y):
    """The number of correct predictions (a float): argmax of y_hat's rows (or y_hat itself) vs y."""
    if len(y_hat.shape) > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(axis=1)
    if isinstance(y_hat, _C.NDArray):
        if not isinstance(y, _C.NDArray):
            y = _C.array(np.asarray(y), device=y_hat.device)
        return float((y_hat.astype("int64") == y.astype("int64")).sum().item())
    return float((np.asarray(y_hat).astype(np.int64) == np.asarray(y).astype(np.int64)).sum())


def evaluate_accuracy(net, data_iter, device=None):
    """The accuracy of `net` over `data_iter` (pairs X, y), computed on `device` (default: the
    device of net's first parameter when it has collect_params, else where the data is)."""
    if device is None and hasattr(net, "collect_params"):
        params = list(net.collect_params().values())
        try:
            device = params[0].list_device()[0] if params else None
        except Exception:  # not initialized yet: evaluate where the data is
            device = None
    metric = Accumulator(2)
    with autograd.predict_mode():
        for X, y in data_iter:
            if device is not None:
                X, y = _to_device(X, device), _to_device(y, device)
            metric.add(accuracy(net(X), y), y.shape[0])
    return metric[0] / metric[1] if metric[1] else float("nan")


def _to_device(x, device):
    if isinstance(x, _C.NDArray):
        return x if x.device == device else x.to_device(device)
    return _C.array(np.asarray(x), device=device)


def split_data(data, num_slice, batch_axis=0, even_split=True):
    """Splits `data` (NDArray or NumPy) into `num_slice` slices along `batch_axis` (gluon.utils.split_data).

    With even_split, the size along batch_axis must be a multiple of num_slice. Otherwise, as in
    Gluon 2, the first size % num_slice slices get one sample more; with fewer samples than
    slices there is one slice per sample (no empty slices: split_and_load then feeds only the
    first devices, and the Trainer counts the others' gradients as zero).
    """
    size = data.shape[batch_axis]
    if num_slice < 1:
        raise ValueError(f"split_data: num_slice must be >= 1, got {num_slice}")
    if even_split and size % num_slice != 0:
        raise ValueError(f"split_data: data with shape {tuple(data.shape)} cannot be split evenly into "
                         f"{num_slice} slices along axis {batch_axis}; use a batch size that is a multiple of "
                         f"{num_slice} or pass even_split=False")
    if size == 0:
        raise ValueError(f"split_data: no samples along axis {batch_axis} to split")
    if size < num_slice:
        num_slice = size
    step, extra = divmod(size, num_slice)
    bounds, begin = [], 0
    for i in range(num_slice):
        end = begin + step + (1 if i < extra else 0)
        bounds.append((begin, end))
        begin = end
    if num_slice == 1:
        return [data]
    index = [slice(None)] * batch_axis
    return [data[tuple(index + [slice(b, e)])] for b, e in bounds]


def split_and_load(data, devices, batch_axis=0, even_split=True):
    """Splits `data` along `batch_axis` into one slice per device and copies each to its device
    (gluon.utils.split_and_load). `devices` is one device or a list; `data` an NDArray or NumPy array."""
    if isinstance(devices, _C.Device):
        devices = [devices]
    devices = list(devices)
    if not devices:
        raise ValueError("split_and_load: devices is empty; pass [kiln.cpu()] or kiln.gpus()")
    if not isinstance(data, _C.NDArray):
        data = np.asarray(data)
    if len(devices) == 1:
        return [_to_device(data, devices[0])]
    slices = split_data(data, len(devices), batch_axis, even_split)
    return [_to_device(s, d) for s, d in zip(slices, devices)]


class ProgressBar:
    """A one-line text progress bar on stderr: `for x in ProgressBar(it, total, 'epoch 1')`.

    It redraws in place only on a terminal and when the CI environment variable is unset; either
    way it prints one final line with the count, the time and any `postfix` set on it.
    """

    def __init__(self, iterable=None, total=None, desc="", file=None, width=30, enabled=None):
        self.iterable, self.desc, self.width = iterable, desc, width
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.file = file or sys.stderr
        if enabled is None:
            isatty = getattr(self.file, "isatty", lambda: False)()
            enabled = isatty and not os.environ.get("CI")
        self.enabled, self.n, self.postfix = enabled, 0, ""
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._closed = False

    def __iter__(self):
        try:
            for x in self.iterable:
                yield x
                self.update()
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def set_postfix(self, text):
        self.postfix = str(text)

    def update(self, n=1):
        self.n += n
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw > 0.1 or self.n == self.total):
            self._last_draw = now
            self.file.write("\r" + self._line(now))
            self.file.flush()

    def _line(self, now):
        elapsed = now - self._start
        if self.total:
            frac = min(1.0, self.n / self.total)
            filled = int(round(self.width * frac))
            bar = "#" * filled + "-" * (self.width - filled)
            head = f"{self.desc} [{bar}] {self.n}/{self.total}"
        else:
            head = f"{self.desc} {self.n}"
        return f"{head} {elapsed:.1f}s" + (f" {self.postfix}" if self.postfix else "")

    def close(self):
        if self._closed:
            return
        self._closed = True
        line = self._line(time.perf_counter())
        self.file.write(("\r" + line + "\033[K\n") if self.enabled else line + "\n")
        self.file.flush()


def plot_curves(history, path_prefix, xlabel="epoch", title=None):
    """Plots each named series of `history` ({'train loss': [...], 'test acc': [...]}) against
    1..n and saves `path_prefix`.png and `path_prefix`.svg. Returns the two paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("plot_curves needs matplotlib, which is not installed; "
                           "`sudo apt-get install python3-matplotlib` provides it") from None
    if not history:
        raise ValueError("plot_curves: history is empty; pass {'name': [values per epoch], ...}")
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for name, values in history.items():
        values = list(values)
        ax.plot(range(1, len(values) + 1), values, label=name, marker="o" if len(values) < 20 else None)
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(path_prefix))
    os.makedirs(directory, exist_ok=True)
    paths = [f"{path_prefix}.png", f"{path_prefix}.svg"]
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    return paths
