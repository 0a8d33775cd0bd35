"""weights.pt read without torch (learning/weights.py) equals torch.load, and is written so
that torch.load (older ccpo) reads it."""

from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

from ccpo.learning.nets import PolicyNet
from ccpo.learning.weights import read_weights, write_weights


def test_read_weights_equals_torch_load(tmp_path):
    """Every dtype a state dict may hold, views at an offset into a shared storage,
    non-contiguous (transposed) and empty tensors and a 0-d one: the same values, shapes and
    dtypes as torch.load."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    state = OrderedDict(
        f64=torch.randn(3, 4, generator=g, dtype=torch.float64),
        f32=torch.randn(7, generator=g),
        f16=torch.randn(2, 3, generator=g).half(),
        i64=torch.arange(-3, 9).reshape(3, 4),
        i32=torch.arange(5, dtype=torch.int32),
        u8=torch.arange(200, 210, dtype=torch.uint8),
        flags=torch.tensor([True, False, True]),
        row=base[2],  # offset 10 into base's storage
        transposed=base.t(),  # strides (1, 5)
        strided=base[1::2, ::2],
        empty=torch.zeros(0, 3),
        scalar=torch.tensor(2.5),
    )
    path = tmp_path / "w.pt"
    torch.save(state, path)
    got = read_weights(path)
    want = torch.load(path, weights_only=True)
    assert list(got) == list(want)
    for k, t in want.items():
        assert got[k].shape == tuple(t.shape), k
        assert got[k].dtype == t.numpy().dtype, k
        np.testing.assert_array_equal(got[k], t.numpy(), err_msg=k)


def test_write_weights_is_what_torch_and_policynet_load(tmp_path):
    """A state dict written from arrays loads with torch.load into a PolicyNet (how ccpo
    before numpy inference read weights.pt), bit for bit in float32."""
    torch.manual_seed(1)
    net = PolicyNet(5, hidden=8, layers=2)
    arrays = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    write_weights(tmp_path / "w.pt", arrays)
    back = PolicyNet(5, hidden=8, layers=2)
    back.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    for (k, a), b in zip(net.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    for k, v in read_weights(tmp_path / "w.pt").items():
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v, net.state_dict()[k].numpy())


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
