"""The network file of a CCPO / CPO policy folder, as numpy arrays: ``weights.npz``, and the
``weights.pt`` of folders written before it.

- ``weights.npz`` (what ccpo writes): :func:`write_weights` stores the name → array
  mapping of :meth:`~ccpo.learning.mlp.NumpyMLP.state_dict` (torch's names and layouts,
  float64, so a saved policy decides exactly as the trained one) as an uncompressed ``.npz``
  archive, one ``.npy`` record per array, no pickle. The archive's timestamps are fixed, so
  the same weights give the same bytes (a folder's fingerprint, order-free training).
- ``weights.pt`` (what ccpo wrote with torch, before ``weights.npz``; still read): what
  ``torch.save(state_dict)`` writes, a zip archive holding ``data.pkl`` (a pickle of the
  name → tensor mapping whose tensors point, by persistent id, at raw storages) and one
  ``data/<key>`` record of raw bytes per storage, with the machine's ``byteorder``.
  :func:`read_weights` reads it without torch: its unpickler resolves only the few names a
  state dict uses (an ordered dict, the tensor-rebuild function, the typed storages); anything
  else is refused, as ``torch.load(weights_only=True)`` refuses it.

:func:`weights_path` finds a folder's file (``weights.npz`` first).
"""

from __future__ import annotations

import pickle
import sys
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LEGACY_WEIGHTS_FILE", "WEIGHTS_FILE", "read_weights", "weights_path", "write_weights"]

#: the network file of a policy folder, and the one folders written with torch hold
WEIGHTS_FILE, LEGACY_WEIGHTS_FILE = "weights.npz", "weights.pt"

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class WeightsFormatError(ValueError):
    """The file is neither a ``.npz`` of arrays nor a state dict as ``torch.save`` writes it."""


def _rebuild_tensor(
    storage: np.ndarray,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *_: Any,
) -> np.ndarray:
    """A tensor's values as a fresh array: ``size`` elements of ``storage`` from ``offset``
    with ``stride`` (in elements), as ``torch._utils._rebuild_tensor_v2`` views them."""
    if any(s == 0 for s in size):
        return np.zeros(size, dtype=storage.dtype)
    n_needed = offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True)) + 1
    if offset < 0 or n_needed > storage.size:
        raise WeightsFormatError("a tensor reaches past the end of its storage")
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[st * storage.itemsize for st in stride]
    )
    return np.array(view)


class _Storage(str):
    """The name of a typed storage class (``torch.FloatStorage`` → ``"FloatStorage"``)."""


class _StateDictUnpickler(pickle.Unpickler):
    def __init__(self, fh: Any, archive: zipfile.ZipFile, root: str, swap: bool) -> None:
        super().__init__(fh)
        self.archive, self.root, self.swap = archive, root, swap

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(name)
        raise WeightsFormatError(f"unexpected object {module}.{name} in a weights file")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise WeightsFormatError(f"unexpected persistent id {pid!r}")
        _, kind, key, _location, numel = pid
        dtype = np.dtype(_STORAGE_DTYPES[kind])
        raw = self.archive.read(f"{self.root}/data/{key}")
        data = np.frombuffer(raw, dtype=dtype, count=int(numel))
        return data.byteswap() if self.swap else data


def weights_path(folder: str | Path) -> Path:
    """The network file of a policy folder: ``weights.npz``, else the ``weights.pt`` of an
    older folder (that path, missing, when there is neither)."""
    d = Path(folder)
    new = d / WEIGHTS_FILE
    return (
        new if new.exists() or not (d / LEGACY_WEIGHTS_FILE).exists() else d / LEGACY_WEIGHTS_FILE
    )


def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """The name → array mapping a weights file holds, read without torch: a ``.npz`` archive
    (:func:`write_weights`) or a ``torch.save(state_dict)`` file (arrays keep the tensors'
    dtypes). Raises :class:`FileNotFoundError`, or :class:`ValueError` for anything else."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise WeightsFormatError("not a zip archive (.npz, or torch.save's format)") from None
    with archive:
        names = archive.namelist()
        if names and all(n.endswith(".npy") for n in names):
            return _read_npz(archive)
        return _read_torch_zip(archive)


def _read_npz(archive: zipfile.ZipFile) -> dict[str, np.ndarray]:
    state: dict[str, np.ndarray] = {}
    for name in archive.namelist():
        with archive.open(name) as fh:
            try:
                state[name.removesuffix(".npy")] = np.lib.format.read_array(fh, allow_pickle=False)
            except ValueError as e:  # object arrays (pickles) included
                raise WeightsFormatError(f"unreadable array {name} ({e})") from None
    return state


def _read_torch_zip(archive: zipfile.ZipFile) -> dict[str, np.ndarray]:
    pkl = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    if len(pkl) != 1:
        raise WeightsFormatError("no single data.pkl in the archive")
    root = pkl[0][: -len("/data.pkl")]
    try:
        order = archive.read(f"{root}/byteorder").decode().strip()
    except KeyError:
        order = "little"  # torch wrote no byteorder record before 1.13: little-endian
    swap = order != sys.byteorder
    with archive.open(pkl[0]) as fh:
        try:
            state = _StateDictUnpickler(fh, archive, root, swap).load()
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError) as e:
            raise WeightsFormatError(f"unreadable data.pkl ({e})") from None
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in state.items()
    ):
        raise WeightsFormatError("the pickle is not a mapping of names to tensors")
    return dict(state)


def write_weights(path: str | Path, state: Mapping[str, np.ndarray]) -> None:
    """Write ``state`` as float64 arrays in a ``.npz`` archive that ``np.load`` reads (with
    ``allow_pickle=False``), entries in ``state``'s order, timestamps fixed: the same arrays
    give the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, value in state.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as fh:
                arr = np.ascontiguousarray(value, dtype=np.float64)
                np.lib.format.write_array(fh, arr, allow_pickle=False)
