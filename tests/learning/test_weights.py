"""Policy weights as arrays (learning/weights.py): ``weights.npz`` written and read back
exactly, without pickle; the ``weights.pt`` that torch.save wrote for older folders read
without torch, as torch.load read it."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ccpo.learning.nets import policy_net
from ccpo.learning.weights import read_weights, weights_path, write_weights

DATA = Path(__file__).resolve().parents[1] / "data" / "weights"


def test_read_weights_equals_what_torch_load_read():
    """A file torch 2.13's ``torch.save`` wrote (every dtype a state dict may hold, views at
    an offset into a shared storage, non-contiguous (transposed, strided) and empty tensors
    and a 0-d one): the same names in order, values, shapes and dtypes as ``torch.load``
    gave when the file was made (state-dict.json)."""
    want = json.loads((DATA / "state-dict.json").read_text())["tensors"]
    got = read_weights(DATA / "state-dict.pt")
    assert list(got) == list(want)
    for k, w in want.items():
        assert got[k].dtype == np.dtype(w["dtype"]), k
        assert got[k].shape == tuple(w["shape"]), k
        np.testing.assert_array_equal(
            got[k], np.asarray(w["values"], w["dtype"]).reshape(w["shape"]), k
        )
    assert got["row"].tolist() == got["transposed"][:, 2].tolist()  # one storage, two views


def test_written_weights_read_back_exactly_and_load_with_numpy_alone(tmp_path):
    """float64 arrays in, the same float64 arrays out (a saved policy decides as the trained
    one); the file is a plain .npz that ``np.load(allow_pickle=False)`` reads, and the same
    arrays give the same bytes (a folder's fingerprint does not depend on when it was
    written)."""
    net = policy_net(5, np.random.default_rng(1), hidden=8, layers=2)
    net.theta[:] = np.random.default_rng(2).normal(size=net.size) / 3  # not float32-exact
    state = net.state_dict()
    write_weights(tmp_path / "w.npz", state)
    back = read_weights(tmp_path / "w.npz")
    assert (
        list(back)
        == list(state)
        == [f"body.{i}.{k}" for i in (0, 2, 4) for k in ("weight", "bias")]
    )
    for k, v in state.items():
        assert back[k].dtype == np.float64
        np.testing.assert_array_equal(back[k], v, k)
    with np.load(tmp_path / "w.npz", allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["body.0.weight"], state["body.0.weight"])
    write_weights(tmp_path / "again.npz", state)
    assert (tmp_path / "again.npz").read_bytes() == (tmp_path / "w.npz").read_bytes()


def test_a_folder_reads_weights_npz_else_its_older_weights_pt(tmp_path):
    assert weights_path(tmp_path) == tmp_path / "weights.npz"  # neither: the new name
    (tmp_path / "weights.pt").write_bytes(b"")
    assert weights_path(tmp_path) == tmp_path / "weights.pt"
    (tmp_path / "weights.npz").write_bytes(b"")
    assert weights_path(tmp_path) == tmp_path / "weights.npz"


def test_an_npz_holding_a_pickle_is_refused(tmp_path):
    """An object array in a .npz is a pickle (it could run code): refused, not loaded."""
    bad = tmp_path / "bad.npz"
    np.savez(bad, w=np.array([print, 1], dtype=object))
    with pytest.raises(ValueError, match=r"unreadable array w\.npy"):
        read_weights(bad)


def test_read_weights_refuses_what_is_not_a_state_dict(tmp_path):
    """Not a zip, a zip without data.pkl, and a pickle naming anything but a state dict's
    pieces (it could run code) are ValueErrors, like torch.load(weights_only=True) refuses."""
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="zip"):
        read_weights(junk)
    empty = tmp_path / "empty.pt"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("x/other.txt", "hi")
    with pytest.raises(ValueError, match=r"data\.pkl"):
        read_weights(empty)
    evil = tmp_path / "evil.pt"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("evil/data.pkl", pickle.dumps({"w": print}, protocol=2))
    with pytest.raises(ValueError, match=r"unexpected object .*print"):
        read_weights(evil)
    not_tensors = tmp_path / "nt.pt"
    with zipfile.ZipFile(not_tensors, "w") as z:
        z.writestr("nt/data.pkl", pickle.dumps([1, 2], protocol=2))
    with pytest.raises(ValueError, match="mapping of names to tensors"):
        read_weights(not_tensors)
    with pytest.raises(FileNotFoundError):
        read_weights(tmp_path / "missing.pt")
