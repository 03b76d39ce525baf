"""bfloat16 on the CPU, end to end (issue 60): a model of each layer kind trains with
``dtype=bfloat16`` (float32 master weights under autocast), then is evaluated (``swax eval ppl``)
and generates (``swax generate``) in bfloat16, and its bfloat16 logits track float32's."""

import json
import math

import pytest
import torch

from swax import SwaxLM
from swax.train import train
from tests.helpers import NOISE_FACTOR, U16, model_noise_floor, rel_err
from tests.train.runs import cli, losses, small_cfg


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA", "SS"])
def test_a_bfloat16_model_trains_evaluates_and_generates(pattern, tmp_path, capsys):
    summary = train(
        small_cfg(tmp_path, "steps=3", "dtype=bfloat16", f"model.layer_pattern={pattern}")
    )
    assert all(math.isfinite(x) for x in losses(tmp_path / "run").values())
    assert math.isfinite(summary["final_val_loss"])
    model_dir = tmp_path / "run" / "model"
    model = SwaxLM.from_pretrained(model_dir)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # float32 masters saved
    out = tmp_path / "ppl"
    args = ["--model", str(model_dir), "--dtype", "bfloat16"]
    assert cli("eval", "ppl", *args, "--lengths", "32,96", "--samples", "1", "--out", str(out)) == 0
    buckets = json.loads((out / "ppl.json").read_text())["buckets"]
    assert buckets and all(math.isfinite(b["loss"]) for b in buckets)
    assert cli("generate", *args, "--prompt", "In the", "--max-new-tokens", "6", "--no-stream") == 0
    assert "6 new tokens" in capsys.readouterr().err
    # the bfloat16 model's logits follow the float32 model's within the noise that one bfloat16
    # rounding of its weights makes in the float64 model (activations and products round alike)
    ids = torch.randint(0, 256, (1, 80), generator=torch.Generator().manual_seed(1))
    floor, ref = model_noise_floor(model, lambda m: m(ids, window=16), unit=U16)
    with torch.no_grad():
        low = model.to(torch.bfloat16)(ids, window=16)
    assert rel_err(low, ref) <= NOISE_FACTOR * floor + U16, (rel_err(low, ref), floor)
