"""Where a checkpoint keeps its RNG state: ``rng.safetensors``, in the full and the sharded
format alike. Full checkpoints written before that kept it inside ``model.safetensors`` under
``__rng__.*`` keys: built here by hand in that layout, they still load and resume exactly; a
checkpoint with no RNG state at all is refused with one line."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from swax import SwaxConfig, SwaxLM
from swax.core.errors import CorruptCheckpointError
from swax.core.integrity import sha256_file
from swax.train import train
from swax.train.checkpoint import Checkpoints, list_checkpoints, load_checkpoint
from tests.train.test_train import Stop, small_cfg, stop_at

OLD_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json")
"""The files whose SHA-256 a full checkpoint's trainer.json listed before rng.safetensors."""


def tiny():
    model = SwaxLM(SwaxConfig.preset("tiny", d_model=32, n_layers=2, n_heads=2, window=16))
    return model, torch.optim.AdamW(model.parameters())


def tiny_for_run():
    """A model and optimizer of the shape the runs of tests.train.test_train.SMALL train."""
    model = SwaxLM(SwaxConfig.preset("tiny", d_model=32, n_layers=2, n_heads=2, window=32))
    return model, torch.optim.AdamW(model.parameters())


def to_old_layout(ck):
    """Rewrite checkpoint ``ck`` as full checkpoints were written before rng.safetensors: the
    RNG state inside model.safetensors as ``__rng__.<name>``, checksums of the three files.
    Returns the RNG state it holds."""
    rng = load_file(str(ck / "rng.safetensors"))
    weights = load_file(str(ck / "model.safetensors"))
    save_file(
        {**weights, **{f"__rng__.{k}": v for k, v in rng.items()}}, str(ck / "model.safetensors")
    )
    (ck / "rng.safetensors").unlink()
    state = json.loads((ck / "trainer.json").read_text())
    state["checksums"] = {name: sha256_file(ck / name) for name in OLD_FILES}
    (ck / "trainer.json").write_text(json.dumps(state, indent=1))
    return rng


@pytest.mark.parametrize("sharded", [False, True])
def test_both_formats_keep_the_rng_in_rng_safetensors(tmp_path, sharded):
    model, opt = tiny()
    torch.manual_seed(123)
    expected = torch.get_rng_state()  # what the save must record: the state at its call
    out = Checkpoints(tmp_path, sharded=sharded).write(1, model, opt, {"loader": {}})
    assert torch.equal(load_file(str(out / "rng.safetensors"))["torch"], expected)
    assert "rng.safetensors" in json.loads((out / "trainer.json").read_text())["checksums"]
    if not sharded:
        assert not [k for k in load_file(str(out / "model.safetensors")) if "rng" in k]
    torch.manual_seed(999)
    load_checkpoint(out, *tiny())
    assert torch.equal(torch.get_rng_state(), expected)


def test_a_checkpoint_in_the_old_layout_loads_and_resumes_exactly(tmp_path):
    """A run stopped after step 4, its checkpoints rewritten in the old layout, resumes to the
    weights of an uninterrupted run; loading one sets the RNG state it holds."""
    args = ["steps=6", "checkpoint.every=2", "window.kind=stochastic"]
    train(small_cfg(tmp_path, *args, name="ref"))
    with pytest.raises(Stop):
        train(small_cfg(tmp_path, *args, name="old"), on_step_end=stop_at(4))
    ckpts = list_checkpoints(tmp_path / "old")
    assert [c.name for c in ckpts] == ["step_000002", "step_000004"]
    rng = [to_old_layout(c) for c in ckpts][-1]
    torch.manual_seed(999)
    assert load_checkpoint(ckpts[-1], *tiny_for_run())["step"] == 4
    assert torch.equal(torch.get_rng_state(), rng["torch"])
    summary = train(small_cfg(tmp_path, *args, "resume=true", name="old"))
    assert summary["steps_run"] == 2
    ref = load_file(str(tmp_path / "ref" / "model" / "model.safetensors"))
    got = load_file(str(tmp_path / "old" / "model" / "model.safetensors"))
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)


def test_a_checkpoint_without_rng_state_is_refused_with_one_line(tmp_path):
    model, opt = tiny()
    out = Checkpoints(tmp_path).write(1, model, opt, {"loader": {}})
    (out / "rng.safetensors").unlink()
    state = json.loads((out / "trainer.json").read_text())
    del state["checksums"]["rng.safetensors"]
    (out / "trainer.json").write_text(json.dumps(state))
    with pytest.raises(CorruptCheckpointError) as e:
        load_checkpoint(out, *tiny())
    assert "\n" not in str(e.value) and f"checkpoint {out} has no readable RNG state" in str(
        e.value
    )
