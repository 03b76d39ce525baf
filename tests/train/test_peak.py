"""The MFU reference (swax.train.peak): a datasheet on known GPUs, elsewhere the best matmul rate
the machine has shown, cached, so that a busy start-up cannot make the MFU look high."""

import torch

import swax.train.peak as P


def test_cpu_reference_is_the_best_rate_seen(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAX_CACHE_DIR", str(tmp_path))
    rates = iter([50e9, 20e9, 80e9])  # quiet start, busy start, a quiet one again
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5: next(rates))
    cpu = torch.device("cpu")
    assert P.peak_flops(cpu).flops == 50e9
    busy = P.peak_flops(cpu)
    assert busy.flops == 50e9  # the busy measurement does not lower the reference
    assert "best float32 2048² matmul" in busy.what and str(tmp_path) in busy.what
    assert P.peak_flops(cpu).flops == 80e9
    assert (tmp_path / "peak_flops.json").is_file()


def test_a_faster_model_raises_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5: 10e9)
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
    monkeypatch.setattr(P, "measure_matmul", lambda device, n=None, reps=5: 7e9)
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
