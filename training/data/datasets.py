"""Data sets (embedded digits, MNIST IDX files, synthetic).

Every rank loads the same data deterministically (no communication): a fixed seeded train/test
split, features standardized with the training set's mean and standard deviation. Each rank's share
of an epoch comes from :mod:`training.data.sampling`.
"""
import gzip
import hashlib
import importlib.metadata
import os
import zipfile
from dataclasses import dataclass

import numpy

__all__ = ["Dataset", "load_digits", "load_mnist", "make_synthetic",
           "read_idx", "write_idx", "split_and_standardize", "load_dataset", "cache_dir"]

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass
class Dataset:
    """A train/test pair of feature matrices (float64, standardized) and int64 labels."""

    x_train: numpy.ndarray  # (N_train, F) float64
    y_train: numpy.ndarray  # (N_train,) int64
    x_test: numpy.ndarray   # (N_test, F) float64
    y_test: numpy.ndarray   # (N_test,) int64
    n_classes: int
    name: str

    @property
    def n_features(self):
        """Number of features per sample."""
        return int(self.x_train.shape[1])


def read_idx(path):
    """Read an IDX file (raw or gzip-compressed, by magic bytes) into an array.

    IDX (LeCun et al., MNIST database): two zero bytes, a type code, the number of dimensions,
    then each dimension as a big-endian int32, then the data in big-endian C order.

    Parameters
    ----------
    path : str

    Returns
    -------
    ndarray with the file's shape, native byte order.

    Raises
    ------
    ValueError
        Naming the file when it is not IDX or its size disagrees with its header.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: corrupt gzip data ({e})") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic bytes {raw[:4]!r})")
    ndim = raw[3]
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in numpy.frombuffer(raw, ">i4", ndim, 4))
    dtype = numpy.dtype(_IDX_TYPES[raw[2]])
    expect = head + int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
    if len(raw) != expect:
        raise ValueError(f"{path}: IDX data is {len(raw)} bytes, header {shape} implies {expect}")
    return numpy.frombuffer(raw, dtype, offset=head).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path, array):
    """Write ``array`` as an IDX file, gzip-compressed when ``path`` ends in ``.gz``."""
    array = numpy.asarray(array)
    codes = {numpy.dtype(v).newbyteorder("="): k for k, v in _IDX_TYPES.items()}
    if array.dtype not in codes:
        raise TypeError(f"dtype {array.dtype} has no IDX type code")
    data = bytes([0, 0, codes[array.dtype], array.ndim])
    data += numpy.asarray(array.shape, ">i4").tobytes()
    data += array.astype(array.dtype.newbyteorder(">")).tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(data) if path.endswith(".gz") else data)


def _find_idx(directory, stem):
    for name in (stem, stem.replace("-idx", ".idx")):
        for suffix in ("", ".gz"):
            path = os.path.join(directory, name + suffix)
            if os.path.exists(path):
                return path
    raise FileNotFoundError(f"{directory}: no {stem} or {stem}.gz (MNIST IDX file)")


def load_mnist(directory):
    """Load MNIST (or Fashion-MNIST) from its four IDX files in ``directory``.

    The files' own train/test split is kept; pixels are scaled to [0, 1] and then standardized
    with the training set's statistics (:func:`_standardize`).

    Returns
    -------
    Dataset

    Raises
    ------
    FileNotFoundError, ValueError
        Naming the missing or malformed file.
    ImportError
        Without scikit-learn (the standardization is its ``StandardScaler``).
    """
    arrays = {}
    for key, stem in (("x_train", "train-images-idx3-ubyte"), ("y_train", "train-labels-idx1-ubyte"),
                      ("x_test", "t10k-images-idx3-ubyte"), ("y_test", "t10k-labels-idx1-ubyte")):
        arrays[key] = read_idx(_find_idx(directory, stem))
    for part in ("train", "test"):
        x, y = arrays["x_" + part], arrays["y_" + part]
        if x.ndim < 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(f"{directory}: {part} images {x.shape} and labels {y.shape} do not match")
    xtr = arrays["x_train"].reshape(len(arrays["x_train"]), -1) / 255.0
    xte = arrays["x_test"].reshape(len(arrays["x_test"]), -1) / 255.0
    ytr, yte = arrays["y_train"].astype(numpy.int64), arrays["y_test"].astype(numpy.int64)
    classes = int(max(ytr.max(initial=0), yte.max(initial=0))) + 1
    xtr, xte = _standardize(xtr, xte, "mnist")
    return Dataset(xtr, ytr, xte, yte, max(classes, 2), "mnist")


def _sklearn(what):
    """Return the scikit-learn names ``what`` needs, or raise ``ImportError`` saying how to install them.

    Imported here, not at the top: scikit-learn is the optional ``data`` extra, and importing it
    costs each rank about a second, which code that loads no data set does not pay.
    """
    try:
        from sklearn.datasets import load_digits as sk_load_digits
        from sklearn.model_selection import train_test_split
        from sklearn.preprocessing import StandardScaler
    except ImportError:
        raise ImportError(f"{what} needs scikit-learn: pip install -e '.[data]'") from None
    return sk_load_digits, train_test_split, StandardScaler


def _standardize(x_train, x_test, what):
    """Return both matrices standardized with the training set's mean and standard deviation.

    ``sklearn.preprocessing.StandardScaler`` (population standard deviation; a feature that is
    constant in the training set is only centred).
    """
    scaler = _sklearn(what)[2]().fit(x_train)
    return scaler.transform(x_train), scaler.transform(x_test)


def split_and_standardize(x, y, test_fraction, seed, n_classes, name, stratify=False):
    """Split (x, y) at random, seeded, and standardize with the train statistics.

    ``sklearn.model_selection.train_test_split`` with ``random_state=seed`` holds out
    ``max(1, round(n * test_fraction))`` samples, stratified by label when asked (each class then
    appears in both parts in its overall proportion); :func:`_standardize` scales both parts.

    Parameters
    ----------
    x : ndarray, shape (n, F)
        Features, any real dtype (computed in float64).
    y : ndarray, shape (n,)
        Integer labels in ``[0, n_classes)``.
    test_fraction : float
        Fraction of the samples held out, in (0, 1).
    seed : int
    n_classes : int
    name : str
        The data set's name, for messages and :attr:`Dataset.name`.
    stratify : bool
        Keep the class proportions in both parts (needs at least two samples of every class, and
        at least ``n_classes`` samples in each part).

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        When no training sample would be left, or a stratified split is impossible.
    ImportError
        Without scikit-learn.
    """
    n = len(y)
    n_test = max(1, int(round(n * test_fraction)))
    if n - n_test < 1:
        raise ValueError(f"{name}: {n} samples with test_fraction {test_fraction} leave no training sample")
    split, y = _sklearn(name)[1], numpy.asarray(y)
    x_tr, x_te, y_tr, y_te = split(numpy.asarray(x, numpy.float64), y, test_size=n_test, random_state=seed,
                                   shuffle=True, stratify=y if stratify else None)
    x_tr, x_te = _standardize(x_tr, x_te, name)
    return Dataset(x_tr, y_tr.astype(numpy.int64), x_te, y_te.astype(numpy.int64), n_classes, name)


def load_digits(test_fraction=0.2, seed=0):
    """Load scikit-learn's embedded handwritten digits (1,797 8x8 images, 10 classes).

    The images come from ``sklearn.datasets.load_digits`` (pixel values 0..16, no download) and are
    split, stratified by digit, and standardized by :func:`split_and_standardize`; the result is kept
    in :func:`cache_dir`, so later runs skip scikit-learn's import.

    Parameters
    ----------
    test_fraction : float
        Fraction held out for test, in (0, 1).
    seed : int
        Seed of the split.

    Returns
    -------
    Dataset
        64 features, 10 classes.

    Raises
    ------
    ImportError
        Without scikit-learn.
    """
    def build():
        x, y = _sklearn("the digits data set")[0](return_X_y=True)
        return split_and_standardize(x, y, test_fraction, seed, 10, "digits", stratify=True)

    return _cached("digits", (float(test_fraction), int(seed)), build)


#: Largest synthetic data set (float64 features, bytes) that :func:`make_synthetic` caches.
CACHE_MAX_BYTES = 64 << 20


def cache_dir():
    """Return the folder of the data cache: ``$COMMLAB_CACHE``, else ``~/.cache/commlab``."""
    return os.environ.get("COMMLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "commlab")


def _cached(name, args, build):
    """Return ``build()``'s :class:`Dataset`, kept as an ``.npz`` in :func:`cache_dir` for the next load.

    Importing scikit-learn costs every rank of every run seconds on a loaded machine, several times
    the rest of a short job; the split it makes depends only on ``args``, scikit-learn's version and
    this module's code, which together name the file. The file is written to a temporary name and
    renamed (ranks loading at once each write a whole file); it holds arrays only, read without
    pickle. An unreadable entry is rebuilt and an unwritable folder only leaves the cache unused.
    """
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        return build()  # raises ImportError, naming the extra to install
    with open(__file__, "rb") as f:
        code = f.read()
    key = hashlib.sha256(repr((name, args, version)).encode() + code).hexdigest()[:20]
    path = os.path.join(cache_dir(), f"{name}-{key}.npz")
    try:
        with numpy.load(path) as z:
            return Dataset(z["x_train"], z["y_train"], z["x_test"], z["y_test"], int(z["n_classes"]), name)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        pass  # not cached yet, or a damaged entry: build it again
    ds = build()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            numpy.savez(f, x_train=ds.x_train, y_train=ds.y_train, x_test=ds.x_test, y_test=ds.y_test,
                        n_classes=ds.n_classes)
        os.replace(tmp, path)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
    return ds


def make_synthetic(samples=20000, features=256, classes=10, test_fraction=0.2, seed=0):
    """Generate a Gaussian-mixture classification problem of any size.

    Each class has a mean drawn from N(0, I) in ``features`` dimensions; a sample is its class
    mean plus isotropic Gaussian noise of standard deviation sqrt(features) / 4, so two class
    means are about 5.7 noise standard deviations apart whatever the feature count (a few percent
    Bayes error for 10 classes). Labels are balanced and the generator is fully seeded. Data sets
    of at most :data:`CACHE_MAX_BYTES` of features are kept in :func:`cache_dir` like the digits.

    Returns
    -------
    Dataset
    """
    def build():
        rng = numpy.random.default_rng([seed, 2024])
        centers = rng.standard_normal((classes, features))
        y = numpy.arange(samples) % classes
        x = centers[y] + rng.standard_normal((samples, features)) * (numpy.sqrt(features) / 4.0)
        return split_and_standardize(x, y, test_fraction, seed, classes, "synthetic")

    if samples * features * 8 > CACHE_MAX_BYTES:  # large ones: rebuilt each time, not copied to disk
        return build()
    return _cached("synthetic", (int(samples), int(features), int(classes), float(test_fraction), int(seed)), build)


def load_dataset(cfg):
    """Load the data set named by ``cfg.data`` (see :class:`training.settings.config.Config`).

    Returns
    -------
    Dataset
    """
    if cfg.data == "digits":
        return load_digits(cfg.test_fraction, cfg.seed)
    if cfg.data == "mnist":
        return load_mnist(cfg.data_dir)
    if cfg.data == "synthetic":
        return make_synthetic(cfg.samples, cfg.features, cfg.classes, cfg.test_fraction, cfg.seed)
    raise ValueError(f"data must be digits, mnist or synthetic, got {cfg.data!r}")
