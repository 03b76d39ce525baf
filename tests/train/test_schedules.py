"""Training schedules: the stochastic window (frequency, anneal, per layer, across ranks), the
learning rate, and how a window schedule describes itself."""

import math

import pytest
import torch

from swax import SwaxConfig
from swax.train import (
    FixedWindow,
    StochasticWindow,
    load_train_config,
    lr_at,
)

# ------------------------------------------------------------------------------ schedules


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_stochastic_window_frequency(p):
    n = 20000
    sched = StochasticWindow(128, 2048, p, anneal_frac=0.0, total_steps=n, seed=3)
    frac = sum(sched(s) == 128 for s in range(n)) / n
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(frac - p) < 5 * sd, (frac, p)
    assert {sched(s) for s in range(n)} == {128, 2048}


def test_stochastic_window_anneal_and_determinism():
    sched = StochasticWindow(128, 2048, 0.9, anneal_frac=0.1, total_steps=1000, seed=0)
    assert sched.anneal_start == 900
    assert all(sched(s) == 2048 for s in range(900, 1000))
    assert sum(sched(s) == 128 for s in range(900)) > 700
    again = StochasticWindow(128, 2048, 0.9, anneal_frac=0.1, total_steps=1000, seed=0)
    assert [sched(s) for s in range(900)] == [again(s) for s in range(900)]
    assert [sched(s) for s in range(50)] == [sched(s) for s in range(50)]  # asked twice
    other = StochasticWindow(128, 2048, 0.9, anneal_frac=0.1, total_steps=1000, seed=1)
    assert [sched(s) for s in range(900)] != [other(s) for s in range(900)]
    assert FixedWindow(64)(5) == 64


def test_per_layer_windows_are_independent_draws():
    sched = StochasticWindow(8, 64, 0.5, anneal_frac=0.0, total_steps=4000, seed=0, per_layer=3)
    draws = [sched(s) for s in range(4000)]
    assert all(len(d) == 3 for d in draws)
    for j in range(3):
        assert abs(sum(d[j] == 8 for d in draws) / 4000 - 0.5) < 0.05
    assert sum(len(set(d)) > 1 for d in draws) > 1000  # layers disagree often


def test_per_layer_draws_go_to_the_layers_that_take_a_window():
    """window.per_layer on "SXSA": the schedule draws one window per sliding-window layer and
    the model config lays them out (SwaxConfig.layer_windows); X and A layers get None."""
    from swax.train.schedules import PerLayerWindows, window_schedule

    cfg = load_train_config(
        None,
        [
            "window.per_layer=true",
            "model.layer_pattern=SXSA",
            "window.short=8",
            "window.long=32",
            "steps=100",
        ],
    )
    sched = window_schedule(cfg, cfg.model)
    assert isinstance(sched, PerLayerWindows) and sched.long == 32
    draws = [sched(s) for s in range(90)]
    for d in draws:
        assert len(d) == 4 and d[1] is None and d[3] is None and {d[0], d[2]} <= {8, 32}
    assert any(d[0] != d[2] for d in draws)  # the two S layers draw apart
    assert sched(95) == (32, None, 32, None)  # the anneal: the long window
    step = 7
    a, b = sched.sched(step)
    assert sched(step) == (a, None, b, None)
    # one S layer: one draw for the whole model
    one = load_train_config(
        None, ["window.per_layer=true", "model.layer_pattern=SXA", "model.n_layers=3"]
    )
    assert isinstance(window_schedule(one, one.model), StochasticWindow)


def _rank_windows(rank, world, port, out):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    sched = StochasticWindow(128, 2048, 0.5, 0.1, 500, seed=11)
    mine = torch.tensor([sched(s) for s in range(500)])
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        torch.save(torch.stack(gathered), out)
    dist.destroy_process_group()


def test_stochastic_window_identical_across_ranks(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "w.pt"
    mp.spawn(_rank_windows, args=(2, port, str(out)), nprocs=2, join=True)
    w = torch.load(out)
    assert torch.equal(w[0], w[1])
    assert (w[0] == 128).any() and (w[0] == 2048).any()


def test_lr_schedules_hand_computed():
    # warmup: linear to lr over 10 steps
    assert lr_at(0, 100, 1.0, 10, "cosine") == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10, "cosine") == pytest.approx(1.0)
    # cosine: halfway between warmup end (10) and the last step (99) is the mean of lr, min_lr
    assert lr_at(10, 100, 1.0, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_at(99, 100, 1.0, 10, "cosine", 0.1) == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert lr_at(int(mid), 100, 1.0, 10, "cosine", 0.1) == pytest.approx(
        0.1 + 0.45 * (1 + math.cos(math.pi * (int(mid) - 10) / 89))
    )
    # wsd: flat until the last 20 steps, then linear to min
    assert lr_at(79, 100, 1.0, 10, "wsd", 0.1, 0.2) == pytest.approx(1.0)
    assert lr_at(80, 100, 1.0, 10, "wsd", 0.1, 0.2) == pytest.approx(1.0 - 0.9 / 20)
    assert lr_at(99, 100, 1.0, 10, "wsd", 0.1, 0.2) == pytest.approx(0.1)
    assert lr_at(50, 100, 1.0, 10, "constant") == 1.0


def test_window_schedules_describe_themselves():
    from swax.train.schedules import FixedWindow, StochasticWindow

    assert FixedWindow(64).describe() == "fixed 64"
    # 1000 steps, last 10 %: steps 901-1000 (1-based) are long
    s = StochasticWindow(16, 128, 0.75, 0.1, 1000)
    assert s.describe() == "stochastic: 16 with p 0.75, else 128; 128 from step 901 (last 10%)"
    assert s(899) in (16, 128) and s(900) == 128
    assert "drawn per layer" in StochasticWindow(16, 128, 0.5, 0.0, 10, per_layer=2).describe()
    assert "from step" not in StochasticWindow(16, 128, 0.5, 0.0, 10).describe()


def test_window_config_names_the_window_a_run_trains_with():
    from swax.config import WindowConfig

    # hand-written: fixed uses `fixed`, or `long` when None; stochastic trains with `short` too
    assert WindowConfig(kind="fixed", short=8, long=32).fixed_window == 32
    assert WindowConfig(kind="fixed", short=8, long=32, fixed=24).fixed_window == 24
    assert WindowConfig(kind="fixed", short=8, long=32).train_window == 32
    assert WindowConfig(kind="fixed", short=8, long=32, fixed=4).train_window == 4
    assert WindowConfig(kind="stochastic", short=8, long=32, fixed=4).train_window == 8
    # the schedule a fixed run builds draws that same window at every step
    from swax.train.config import TrainConfig
    from swax.train.schedules import window_schedule

    cfg = TrainConfig(
        model=SwaxConfig.preset("tiny", window=32),
        window=WindowConfig(kind="fixed", short=8, long=32, fixed=24),
    )
    sched = window_schedule(cfg, cfg.model)
    assert {sched(s) for s in range(0, cfg.steps, max(1, cfg.steps // 10))} == {24}
