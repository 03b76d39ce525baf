"""Sharded checkpoints (torch.distributed.checkpoint) in one process: bit-exact resume, in the
foreground and in the background, refused metadata that could run code, corrupt and mismatched
checkpoints. The 2-rank cases (one shard per rank, 2 -> 1, 1 -> 2, 2 -> 2) are in
test_distributed_sharding.py (slow tier)."""

import io
import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from swax.core.errors import CheckpointError
from swax.train import load_train_config, train
from swax.train.checkpoint import latest_checkpoint, list_checkpoints
from swax.train.sharded import SHARDS, _MetadataUnpickler
from tests.train.test_train import Stop, stop_at

SMALL = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "seq_len=32",
    "batch_size=2",
    "window.short=8",
    "window.long=16",
    "log.every=1",
    "log.val_every=0",
    "log.val_batches=1",
    "optim.warmup_steps=2",
    "threads=1",
    "steps=8",
    "checkpoint.every=3",
]


def cfg(tmp_path, name, *extra):
    return load_train_config(None, [*SMALL, f"run_dir={tmp_path / name}", *extra])


def weights(tmp_path, name):
    return load_file(str(tmp_path / name / "model" / "model.safetensors"))


@pytest.mark.parametrize("background", ["false", "true"])
def test_sharded_checkpoint_resumes_bit_exactly(tmp_path, background):
    train(cfg(tmp_path, "full"))
    args = ["checkpoint.format=sharded", f"checkpoint.async_save={background}"]
    with pytest.raises(Stop):
        train(cfg(tmp_path, "cut", *args), on_step_end=stop_at(5))
    ck = latest_checkpoint(tmp_path / "cut")
    assert ck.name == "step_000003" and (ck / SHARDS / ".metadata").is_file()
    assert not (ck / "model.safetensors").exists()  # the sharded format, not the full one
    state = json.loads((ck / "trainer.json").read_text())
    assert state["format"] == "sharded" and f"{SHARDS}/__0_0.distcp" in state["checksums"]
    train(cfg(tmp_path, "cut", *args, "resume=true"))
    a, b = weights(tmp_path, "full"), weights(tmp_path, "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_full_checkpoint_resumes_into_a_sharded_run_and_back(tmp_path):
    """The format may change on resume (old full checkpoints still resume)."""
    train(cfg(tmp_path, "ref"))
    with pytest.raises(Stop):
        train(cfg(tmp_path, "mix"), on_step_end=stop_at(4))  # full step 3
    with pytest.raises(Stop):
        train(cfg(tmp_path, "mix", "resume=true", "checkpoint.format=sharded"),
              on_step_end=stop_at(7))  # fmt: skip  # sharded step 6
    assert (latest_checkpoint(tmp_path / "mix") / SHARDS).is_dir()
    train(cfg(tmp_path, "mix", "resume=true", "checkpoint.format=full"))
    a, b = weights(tmp_path, "ref"), weights(tmp_path, "mix")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_metadata_that_would_run_code_is_refused():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(pickle.UnpicklingError, match="builtins.print is not allowed"):
        _MetadataUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    # what DCP itself writes goes through
    torch_size = pickle.dumps((torch.Size([2, 3]), torch.float32, torch.strided))
    assert _MetadataUnpickler(io.BytesIO(torch_size)).load() == (
        torch.Size([2, 3]),
        torch.float32,
        torch.strided,
    )


def test_a_tampered_or_corrupt_sharded_checkpoint_is_skipped(tmp_path, capsys):
    args = ["checkpoint.format=sharded", "checkpoint.keep=3"]
    with pytest.raises(Stop):
        train(cfg(tmp_path, "c", *args), on_step_end=stop_at(7))
    last = latest_checkpoint(tmp_path / "c")
    shard = last / SHARDS / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    train(cfg(tmp_path, "c", *args, "resume=true"))
    err = capsys.readouterr().err
    assert "skipping step_000006" in err and "resumed from step_000003" in err
    assert (tmp_path / "c" / "checkpoints" / "step_000006.corrupt").is_dir()


def test_a_sharded_checkpoint_of_another_model_is_one_clear_error(tmp_path):
    with pytest.raises(Stop):
        train(cfg(tmp_path, "m", "checkpoint.format=sharded"), on_step_end=stop_at(4))
    from swax import SwaxConfig, SwaxLM
    from swax.train.checkpoint import load_checkpoint

    other = SwaxLM(SwaxConfig.preset("tiny", d_model=48, n_layers=2, n_heads=2, window=16))
    opt = torch.optim.AdamW(other.parameters())
    with pytest.raises(CheckpointError, match=r"does not match this model: .*has shape") as e:
        load_checkpoint(latest_checkpoint(tmp_path / "m"), other, opt)
    assert "\n" not in str(e.value)


def test_a_background_save_killed_before_it_completes_leaves_no_checkpoint(tmp_path):
    """The process dies after every shard is written but before rank 0 completes the save:
    the folder stays step_N.tmp, is never loaded, and the resumed run starts over cleanly."""
    run = tmp_path / "k"
    args = [*SMALL, f"run_dir={run}", "checkpoint.format=sharded", "checkpoint.async_save=true"]
    code = textwrap.dedent(f"""
        import os
        import swax.train.sharded as S
        from swax.train import load_train_config, train
        def die(*a, **k):
            os._exit(3)
        S.write_side_files = die
        train(load_train_config(None, {args!r}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stderr[-2000:]
    assert list_checkpoints(run) == []
    assert (run / "checkpoints" / "step_000003.tmp" / SHARDS / "__0_0.distcp").is_file()
    summary = train(cfg(tmp_path, "k", "resume=auto"))
    assert summary["steps_run"] == 8
