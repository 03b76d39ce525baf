"""The MFU reference (swax.train.peak): a datasheet on known GPUs, elsewhere the best matmul rate
the machine has shown in the dtype the run computes in, cached, so that a busy start-up cannot
make the MFU look high."""

import os
import subprocess
import sys

import pytest
import torch

import swax.train.peak as P
from swax.train import train
from tests.train.runs import small_cfg


def test_cpu_reference_is_the_best_rate_seen(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAX_CACHE_DIR", str(tmp_path))
    rates = iter([50e9, 20e9, 80e9])  # quiet start, busy start, a quiet one again
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5, dtype=None: next(rates))
    cpu = torch.device("cpu")
    assert P.peak_flops(cpu).flops == 50e9
    busy = P.peak_flops(cpu)
    assert busy.flops == 50e9  # the busy measurement does not lower the reference
    assert "best float32 2048² matmul" in busy.what and str(tmp_path) in busy.what
    assert P.peak_flops(cpu).flops == 80e9
    assert (tmp_path / "peak_flops.json").is_file()


def test_a_faster_model_raises_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5, dtype=None: 10e9)
    peak = P.peak_flops(torch.device("cpu"))
    peak.cover(5e9)
    assert peak.flops == 10e9
    peak.cover(12e9)  # MFU would be 120 %: the reference becomes that rate
    assert peak.flops == 12e9 and 12e9 / peak.flops <= 1
    assert P.peak_flops(torch.device("cpu")).flops == 12e9  # and it is remembered


def test_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SWAX_CACHE_DIR", str(blocker / "sub"))  # a folder under a file
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5, dtype=None: 7e9)
    assert P.peak_flops(torch.device("cpu")).flops == 7e9


def test_known_gpus_use_their_datasheet(monkeypatch):
    # vendor datasheets, dense bfloat16: H100 SXM 989.4 TFLOP/s, H100 PCIe 756.5, A100 312
    measured = []
    monkeypatch.setattr(P, "measure_matmul", lambda *a, **k: measured.append(1) or 1.0)
    cuda = torch.device("cuda")
    for name, tflops in (
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA A100-SXM4-40GB", 312),
    ):
        monkeypatch.setattr(P, "device_name", lambda device, name=name: name)
        peak = P.peak_flops(cuda)
        assert abs(peak.flops / 1e12 - tflops) < 1, (name, peak.flops)
        assert "datasheet" in peak.what
    assert not measured


def test_a_real_measurement_is_positive():
    # float32 2048²: 2·2048³ FLOPs per product; any working CPU does at least 1e8 FLOP/s
    assert P.measure_matmul(torch.device("cpu"), n=256, reps=2) > 1e8


def test_a_bfloat16_cpu_run_is_measured_against_the_bfloat16_rate(tmp_path, monkeypatch):
    """The reference is the matmul rate of the dtype the run computes in, kept apart per dtype:
    a fast bfloat16 rate never becomes a float32 run's reference, nor the other way round."""
    monkeypatch.setenv("SWAX_CACHE_DIR", str(tmp_path))
    seen = []

    def measure(device, n=None, reps=5, dtype=None):
        seen.append(dtype)
        return {torch.bfloat16: 400e9, torch.float32: 100e9}[dtype or torch.float32]

    monkeypatch.setattr(P, "measure_matmul", measure)
    cpu = torch.device("cpu")
    bf16 = P.peak_flops(cpu, torch.bfloat16)
    assert bf16.flops == 400e9 and "best bfloat16" in bf16.what
    fp32 = P.peak_flops(cpu, None)  # a float32 run (no autocast)
    assert fp32.flops == 100e9 and "best float32 2048²" in fp32.what
    assert seen == [torch.bfloat16, torch.float32]
    bf16.cover(500e9)  # a bfloat16 run's own rate raises the bfloat16 reference only
    assert P.peak_flops(cpu).flops == 100e9
    assert P.peak_flops(cpu, torch.bfloat16).flops == 500e9


@pytest.mark.parametrize("units", [True, False])
def test_start_up_names_the_dtype_and_warns_without_units(units, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5, dtype=None: 1e9)
    monkeypatch.setattr(P, "bf16_matrix_units", lambda: units)
    train(small_cfg(tmp_path, "steps=1", "dtype=bfloat16", name="bf16"))
    text = "".join(capsys.readouterr())
    assert "MFU: the model's FLOP/s over 1.0 GFLOP/s, the best bfloat16" in text
    assert ("will be slower than in float32" in text) != units
    train(small_cfg(tmp_path, "steps=1", name="auto"))  # dtype=auto: float32 on a CPU
    text = "".join(capsys.readouterr())
    assert "the best float32 2048² matmul" in text and "slower than" not in text


def test_an_avx2_capability_means_no_bfloat16_units():
    """ATEN_CPU_CAPABILITY=avx2 (or default) stands for a CPU without bfloat16 matrix units,
    whatever this machine has; the bfloat16 measurement is then small (512²)."""
    for isa in ("avx2", "default"):
        code = (
            "import torch, swax.train.peak as P; "
            "print(P.bf16_matrix_units(), P._cpu_size(torch.bfloat16), "
            "P._cpu_size(torch.float32))"
        )
        env = {**os.environ, "ATEN_CPU_CAPABILITY": isa}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.split() == ["False", "512", "2048"], out.stderr
