"""kiln.data: the IDX reader (real files and corrupt ones), FashionMNIST, transforms and DataLoader."""
import gzip
import os
import struct

import numpy as np
import pytest

import kiln
from kiln import data, nd
from kiln.data import ArrayDataset, DataLoader, FashionMNIST, Subset, transforms

ROOT = "/usr/share/datasets/fashion-mnist"
# The data set is a dependency (scripts/install-deps installs dataset-fashion-mnist): a missing
# copy fails these tests rather than skipping them.
def have_fashion(test):
    return test


def idx_bytes(array, type_code=0x08):
    a = np.asarray(array)
    header = struct.pack(">BBBB", 0, 0, type_code, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
    return header + a.astype(a.dtype.newbyteorder(">")).tobytes()


def write(tmp_path, name, payload):
    path = tmp_path / name
    path.write_bytes(payload)
    return str(path)


# ---- IDX parsing ----

@have_fashion
def test_read_idx_real_files():
    images = data.read_idx(f"{ROOT}/train-images-idx3-ubyte.gz")
    labels = data.read_idx(f"{ROOT}/t10k-labels-idx1-ubyte.gz")
    assert images.shape == (60000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and labels.dtype == np.uint8
    assert labels.min() == 0 and labels.max() == 9
    assert np.bincount(labels).tolist() == [1000] * 10  # Fashion-MNIST's test set is balanced


def test_parse_idx_roundtrip_and_types(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(kiln._C.parse_idx(idx_bytes(a)), a)
    i32 = np.array([[1, -2], [70000, 4]], dtype=np.int32)
    np.testing.assert_array_equal(kiln._C.parse_idx(idx_bytes(i32, 0x0C)), i32)
    f32 = np.array([0.5, -1.25], dtype=np.float32)
    np.testing.assert_array_equal(kiln._C.parse_idx(idx_bytes(f32, 0x0D)), f32)
    raw = write(tmp_path, "a-idx3-ubyte", idx_bytes(a))
    gz = write(tmp_path, "a-idx3-ubyte.gz", gzip.compress(idx_bytes(a)))
    np.testing.assert_array_equal(data.read_idx(raw), a)
    np.testing.assert_array_equal(data.read_idx(gz), a)
    np.testing.assert_array_equal(kiln._C.read_idx(raw), a)


@pytest.mark.parametrize("payload, message", [
    (b"\x00\x00", "shorter than the 4-byte IDX magic"),
    (b"\x12\x34\x08\x01\x00\x00\x00\x01\x07", "magic number 0x12340801"),
    (b"\x00\x00\x07\x01\x00\x00\x00\x01\x07", "magic number 0x00000701"),
    (b"\x00\x00\x08\x00", "magic number 0x00000800"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00", "truncated inside its header"),
    (idx_bytes(np.zeros((3, 2, 2), np.uint8))[:-1], "the file is truncated"),
    (idx_bytes(np.zeros(5, np.uint8)) + b"\x00", "trailing bytes"),
])
def test_corrupt_idx_raises_format_error(tmp_path, payload, message):
    path = write(tmp_path, "bad-idx-ubyte", payload)
    with pytest.raises(kiln.FormatError, match=message) as e:
        data.read_idx(path)
    assert "bad-idx-ubyte" in str(e.value)
    with pytest.raises(kiln.FormatError, match=message):
        data.read_idx(write(tmp_path, "bad-idx-ubyte.gz", gzip.compress(payload)))
    assert issubclass(kiln.FormatError, ValueError)


def test_truncated_and_garbled_gzip(tmp_path):
    good = gzip.compress(idx_bytes(np.zeros((10, 4, 4), np.uint8)))
    with pytest.raises(kiln.FormatError, match="gzip stream is corrupt or truncated"):
        data.read_idx(write(tmp_path, "cut-idx3-ubyte.gz", good[: len(good) // 2]))
    with pytest.raises(kiln.FormatError, match="gzip stream is corrupt or truncated"):
        data.read_idx(write(tmp_path, "junk-idx3-ubyte.gz", good[:10] + b"\xff" * 40))
    with pytest.raises(kiln.FormatError, match="gzip-compressed"):
        kiln._C.read_idx(write(tmp_path, "x.gz", good))


# ---- FashionMNIST ----

def test_missing_files_say_which_and_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        FashionMNIST(root=str(tmp_path))
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz" in msg and str(tmp_path) in msg
    assert "sudo apt-get install dataset-fashion-mnist" in msg
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((2, 3, 3), np.uint8))))
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte.gz"):
        FashionMNIST(root=str(tmp_path), train=False)


def test_fashion_mnist_from_local_files(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(idx_bytes(images))  # uncompressed works too
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels)))
    ds = FashionMNIST(root=str(tmp_path))
    assert len(ds) == 5
    x, y = ds[2]
    assert x.shape == (4, 3, 1) and x.dtype == np.uint8 and y == 4 and isinstance(y, int)
    np.testing.assert_array_equal(x[..., 0], images[2])
    assert len(FashionMNIST(root=str(tmp_path), limit=3)) == 3
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels[:4])))
    with pytest.raises(kiln.FormatError, match="has 5 images but .* has 4 labels"):
        FashionMNIST(root=str(tmp_path))


@have_fashion
def test_fashion_mnist_real():
    train, test = FashionMNIST(train=True), FashionMNIST(train=False, limit=100)
    assert len(train) == 60000 and len(test) == 100
    x, y = train[0]
    assert x.shape == (28, 28, 1) and x.dtype == np.uint8 and 0 <= y < 10
    assert FashionMNIST.classes[9] == "ankle boot"


# ---- transforms ----

def test_to_tensor_scales_and_moves_channels():
    img = np.array([[[0], [255]], [[51], [102]]], np.uint8)  # HWC (2, 2, 1)
    out = transforms.ToTensor()(img)
    assert out.shape == (1, 2, 2) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], [[0, 1], [0.2, 0.4]], rtol=1e-6)
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_allclose(transforms.ToTensor()(rgb), rgb.transpose(2, 0, 1) / 255, rtol=1e-6)
    nd_out = transforms.ToTensor()(kiln.nd.array(img, dtype="uint8"))
    assert nd_out.shape == (1, 2, 2)
    np.testing.assert_allclose(nd_out.asnumpy(), out, rtol=1e-6)


def test_normalize_and_compose_fold_into_one_affine_map():
    img = np.random.default_rng(1).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    t = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.1, 0.2, 0.3], [0.5, 0.25, 2.0]),
                            transforms.Normalize(1.0, 4.0)])
    expected = ((img.transpose(2, 0, 1) / 255 - np.array([0.1, 0.2, 0.3])[:, None, None])
                / np.array([0.5, 0.25, 2.0])[:, None, None] - 1.0) / 4.0
    np.testing.assert_allclose(t(img), expected, rtol=1e-5, atol=1e-6)
    scale, mean, std = t._affine()
    batch = kiln._C.images_to_batch(img[None], np.array([0]), scale, list(mean), list(std))
    np.testing.assert_allclose(batch.asnumpy()[0], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="std must be nonzero"):
        transforms.Normalize(0, 0)


# ---- DataLoader ----

def small_dataset(n=10):
    images = np.arange(n * 2 * 2, dtype=np.uint8).reshape(n, 2, 2, 1)
    return ArrayDataset(images, np.arange(n))


def labels_of(loader):
    return [y.asnumpy().tolist() for _, y in loader]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_last_batch_modes(prefetch):
    ds = small_dataset(10)
    keep = DataLoader(ds, 4, last_batch="keep", prefetch=prefetch)
    assert len(keep) == 3 and labels_of(keep) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    discard = DataLoader(ds, 4, last_batch="discard", prefetch=prefetch)
    assert len(discard) == 2 and labels_of(discard) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    roll = DataLoader(ds, 4, last_batch="rollover", prefetch=prefetch)
    assert len(roll) == 2 and labels_of(roll) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(roll) == 3  # 8, 9 carried over: 12 samples this epoch
    assert labels_of(roll) == [[8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
    with pytest.raises(ValueError, match="last_batch must be one of"):
        DataLoader(ds, 4, last_batch="drop")


def test_batches_are_ndarrays_with_narrowed_dtypes():
    X, y = next(iter(DataLoader(small_dataset(), 4)))
    assert isinstance(X, kiln.NDArray) and X.shape == (4, 2, 2, 1) and X.dtype == np.uint8
    assert y.dtype == np.int32
    X, y = next(iter(DataLoader(small_dataset().transform_first(transforms.ToTensor()), 4)))
    assert X.shape == (4, 1, 2, 2) and X.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_allclose(X.asnumpy().ravel(), np.arange(16) / 255, rtol=1e-6)


def test_shuffle_is_deterministic_under_a_seed():
    ds = small_dataset(50)
    a = DataLoader(ds, 8, shuffle=True, seed=7)
    b = DataLoader(ds, 8, shuffle=True, seed=7, prefetch=0)
    epoch_a1, epoch_a2 = labels_of(a), labels_of(a)
    assert epoch_a1 == labels_of(b) and epoch_a2 == labels_of(b)
    assert epoch_a1 != epoch_a2  # a new order each epoch
    assert sorted(sum(epoch_a1, [])) == list(range(50))
    assert labels_of(DataLoader(ds, 8, shuffle=True, seed=8)) != epoch_a1


def test_fast_path_prefetch_and_per_sample_path_give_identical_batches():
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (37, 5, 4, 1), dtype=np.uint8)
    ds = ArrayDataset(images, rng.integers(0, 10, 37))
    t = transforms.Compose([transforms.ToTensor(), transforms.Normalize(0.3, 0.7)])
    fast = ds.transform_first(t)
    slow = ds.transform_first(lambda x: t(x))  # a plain function: sample by sample, then stacked
    assert fast._batch(np.arange(3)) is not None and slow._batch(np.arange(3)) is None
    runs = [labels_and_images(DataLoader(d, 8, shuffle=True, seed=1, prefetch=p, num_workers=w))
            for d, p, w in [(fast, 0, 0), (fast, 2, 0), (fast, 3, 3), (slow, 0, 0), (slow, 2, 2)]]
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for (x0, y0), (x1, y1) in zip(runs[0], other):
            np.testing.assert_array_equal(y0, y1)
            np.testing.assert_allclose(x0, x1, rtol=1e-6, atol=1e-6)


def labels_and_images(loader):
    return [(X.asnumpy(), y.asnumpy()) for X, y in loader]


def test_subset_and_early_break():
    ds = Subset(small_dataset(20), range(10, 20))
    assert len(ds) == 10 and ds[0][1] == 10
    assert labels_of(DataLoader(ds, 5)) == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
    loader = DataLoader(ds, 2, prefetch=4)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert len(labels_of(loader)) == 5  # a broken-off epoch leaves the next one whole


def test_worker_errors_reach_the_caller():
    class Broken(data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise KeyError(f"sample {i}")

    with pytest.raises(KeyError, match="sample 0"):
        next(iter(DataLoader(Broken(), 2, prefetch=2)))


@have_fashion
def test_fashion_mnist_loader_batch():
    ds = FashionMNIST(train=False, limit=600).transform_first(transforms.ToTensor())
    loader = DataLoader(ds, 256, shuffle=True, seed=0)
    shapes = [(X.shape, y.shape) for X, y in loader]
    assert shapes == [((256, 1, 28, 28), (256,))] * 2 + [((88, 1, 28, 28), (88,))]
    X, y = next(iter(DataLoader(FashionMNIST(train=False, transform=transforms.ToTensor()), 256)))
    raw = FashionMNIST(train=False)
    np.testing.assert_allclose(X.asnumpy()[5, 0], raw[5][0][..., 0] / 255, rtol=1e-6)
    assert y.asnumpy()[5] == raw[5][1]


def test_resize_is_bilinear_with_aligned_pixel_centres_as_torch():
    import torch
    from kiln.data import transforms
    rng = np.random.default_rng(0)
    img = rng.random((5, 7, 3)).astype(np.float32)
    for size, (oh, ow) in ((9, (9, 9)), ((4, 3), (3, 4)), ((14, 10), (10, 14))):
        got = transforms.Resize(size)(img)
        ref = torch.nn.functional.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None], size=(oh, ow),
                                              mode="bilinear", align_corners=False)[0].permute(1, 2, 0).numpy()
        assert got.shape == (oh, ow, 3) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    u8 = (img * 255).astype(np.uint8)
    out = transforms.Resize(10)(nd.array(u8, dtype="uint8"))      # NDArray in, NDArray out, dtype kept
    assert isinstance(out, nd.NDArray) and out.shape == (10, 10, 3) and out.dtype == np.uint8
    assert transforms.Resize(14, keep_ratio=True)(img).shape == (14, 20, 3)
    with pytest.raises(ValueError, match="positive int"):
        transforms.Resize((0, 4))
    with pytest.raises(ValueError, match="bilinear"):
        transforms.Resize(4, interpolation=0)


def test_fashion_mnist_reads_the_debian_copy_for_mxnets_download_folder(tmp_path, monkeypatch):
    from kiln.data import FashionMNIST, transforms
    monkeypatch.setenv("HOME", str(tmp_path))
    root = os.path.join("~", ".mxnet", "datasets", "fashion-mnist")       # d2lzh's root=
    with pytest.warns(UserWarning, match="does not download"):
        ds = FashionMNIST(root=root, train=False, limit=4)
    ref = FashionMNIST(train=False, limit=4)
    np.testing.assert_array_equal(ds[3][0], ref[3][0])
    with pytest.raises(FileNotFoundError):                                # any other folder: no guessing
        FashionMNIST(root=str(tmp_path / "elsewhere"), train=False)
    resized = ds.transform_first(transforms.Compose([transforms.Resize(32), transforms.ToTensor()]))
    X = resized[0][0]
    assert X.shape == (1, 32, 32) and 0 <= X.min() and X.max() <= 1
