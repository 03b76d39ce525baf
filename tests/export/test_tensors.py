"""swax.export.tensors: safetensors read and written one tensor at a time, held to the
safetensors package's own reader and writer."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from safetensors.torch import load_file, save_file

from swax.core.errors import CheckpointError
from swax.export.tensors import Entry, TensorFolder, write_streamed

TENSORS = {
    "a": torch.randn(3, 5, generator=torch.Generator().manual_seed(0)),
    "b": torch.arange(7, dtype=torch.int64),
    "c": torch.randn(4, 2, 2, generator=torch.Generator().manual_seed(1)).bfloat16(),
    "empty": torch.zeros(0, 3),
    "half": torch.linspace(-1, 1, 9).half(),
}


def test_written_file_is_what_safetensors_reads(tmp_path):
    live: list = []

    def maker(name):
        def make():
            assert sum(r() is not None for r in live) <= 1  # the one being written, at most
            t = TENSORS[name].clone()
            live.append(weakref.ref(t))
            return t

        return make

    entries = [Entry(n, tuple(t.shape), t.dtype, maker(n)) for n, t in TENSORS.items()]
    write_streamed(tmp_path / "x.safetensors", entries, {"format": "pt"})
    back = load_file(str(tmp_path / "x.safetensors"))
    assert back.keys() == TENSORS.keys()
    for n, t in TENSORS.items():
        assert back[n].dtype == t.dtype and torch.equal(back[n], t), n


def test_cast_and_shape_check(tmp_path):
    e = Entry("a", (3, 5), torch.bfloat16, lambda: TENSORS["a"])
    write_streamed(tmp_path / "x.safetensors", [e])
    assert torch.equal(load_file(str(tmp_path / "x.safetensors"))["a"], TENSORS["a"].bfloat16())
    with pytest.raises(ValueError, match="made shape"):
        write_streamed(tmp_path / "y.safetensors", [Entry("a", (5, 3), torch.float32, e.make)])


def test_folder_reads_single_and_sharded(tmp_path):
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    with TensorFolder(tmp_path) as f:
        assert f.shapes() == {n: tuple(t.shape) for n, t in TENSORS.items()}
        for n, t in TENSORS.items():
            assert f.dtype(n) == t.dtype and torch.equal(f.get(n), t)
    shards = tmp_path / "shards"
    shards.mkdir()
    names = list(TENSORS)
    save_file({n: TENSORS[n] for n in names[:2]}, str(shards / "m-1.safetensors"))
    save_file({n: TENSORS[n] for n in names[2:]}, str(shards / "m-2.safetensors"))
    weight_map = {n: "m-1.safetensors" if i < 2 else "m-2.safetensors" for i, n in enumerate(names)}
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with TensorFolder(shards) as f:
        assert sorted(f.names()) == sorted(names)
        assert torch.equal(f.get("c"), TENSORS["c"])


def test_folder_refuses_broken_input(tmp_path):
    with pytest.raises(CheckpointError, match="pickled .bin"):
        TensorFolder(tmp_path)
    save_file({"a": TENSORS["a"]}, str(tmp_path / "x-1.safetensors"))
    save_file({"a": TENSORS["a"]}, str(tmp_path / "x-2.safetensors"))
    with pytest.raises(CheckpointError, match="tensor a is in two files"):
        TensorFolder(tmp_path)
    one = tmp_path / "one"
    one.mkdir()
    data = (tmp_path / "x-1.safetensors").read_bytes()
    (one / "model.safetensors").write_bytes(data[:-8])  # a truncated file
    with pytest.raises(CheckpointError, match="corrupt or not a safetensors file"):
        TensorFolder(one)
    (one / "model.safetensors").write_bytes(b"\x05" + b"\x00" * 7 + b"{oops")
    with pytest.raises(CheckpointError, match="corrupt or not a safetensors file"):
        TensorFolder(one)
    (one / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "z"}}))
    with pytest.raises(CheckpointError, match="names z"):
        TensorFolder(one)
