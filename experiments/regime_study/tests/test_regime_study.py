"""The regime study read together (experiments/regime_study): REPORT.md and the README's reading
state results only through numbers computed from the archived runs, and each docs block stands
in one place."""

import json
from pathlib import Path

from experiments.laziness_map import report as laziness_map
from experiments.regime_study import readme, report
from experiments.tests.helpers import ROOT, fake_run
from experiments.window_sweep import report as window_sweep
from swax.sweep import load_sweep


def test_the_study_report_reads_the_map_and_the_claims_from_the_archive(tmp_path):
    # REPORT.md states results only through numbers computed from the archived runs: two lazy
    # seeds at 0 % (W = 32) and one of two at 1 %, a positive control lazy in both its seeds,
    # a long window that learned the memory in both at 1 %, and the far share of text
    lcfg = load_sweep(report.L.HERE / "laziness.yaml")
    ccfg = load_sweep(report.C.HERE / "claims.yaml")
    zcfg = load_sweep(report.C.HERE / "claims_rho0.yaml")
    tcfg = load_sweep(report.X.HERE / "textonly.yaml")
    lcfg.archive, ccfg.archive = str(tmp_path / "map"), str(tmp_path / "claims")
    zcfg.archive, tcfg.archive = str(tmp_path / "rho0"), str(tmp_path / "text")
    runs = {
        (lcfg.archive, "grid-w32-far0.0-lawuniform", 0): (100, 5),
        (lcfg.archive, "grid-w32-far0.0-lawuniform", 1): (100, 3),
        (lcfg.archive, "grid-w32-far0.01-lawuniform", 0): (100, 5),
        (lcfg.archive, "grid-w32-far0.01-lawuniform", 1): (100, 90),
        (ccfg.archive, "sx-long-near", 0): (100, 5),
        (ccfg.archive, "sx-long-near", 1): (100, 8),
        (ccfg.archive, "sd-long-near", 0): (100, 5),  # lazy
        (ccfg.archive, "sd-long-near", 1): (100, 30),  # partial, its window cut keeps 100 %
        **{(ccfg.archive, n, s): (100, 95) for n in ("sx-short", "sx-stoch") for s in (0, 1)},
        (ccfg.archive, "sx-long", 0): (100, 80),
        (ccfg.archive, "sx-long", 1): (100, 100),
        **{(zcfg.archive, n, s): (100, 95) for n in ("sx-short", "sx-stoch") for s in (0, 1)},
        (zcfg.archive, "sx-long", 0): (100, 5),
        (zcfg.archive, "sx-long", 1): (100, 3),
    }
    clean = {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}
    for (archive, name, seed), (inside, beyond) in runs.items():
        p = Path(archive) / name / f"seed{seed}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        rec = fake_run(inside, beyond, seed)
        if archive == zcfg.archive:  # these record their ids; the others predate the field
            rec["episode_ids"] = clean
        p.write_text(json.dumps(rec))
    far = {
        "rows": [
            {
                "seq_len": 256,
                "rows": 10,
                "windows": [{"window": 32, "divisor": 8, "share": 0.005, "ci": [0.004, 0.006]}],
            }
        ]
    }
    settings = [(c, report.C.load_runs(c)) for c in (ccfg, zcfg)]
    text = report.write_report(tmp_path, lcfg, settings, tcfg, {("kjv", "byte"): far}).read_text()
    # Jeffreys intervals (scipy.stats.beta.ppf): 2/2 from 33 %, 1/2 6-94 %
    assert "| 32 (T/8) | 2/2 [33–100] | – | 1/2 [6–94] |" in text
    assert "the SX long window ended lazy in 2 of 2 (16–100 %) seeds" in text
    # one table per setting, each naming its episode ids; 2 seeds settle no share
    assert "**ρ = 1 %** (old episode ids 128–175, which the KJV text also holds):" in text
    assert "**ρ = 0** (clean episode ids 257–304, after the tokenizer's vocabulary):" in text
    assert text.count("| 2 (SX) | lazy | cannot be shown at this scale (2 seeds) |") == 2
    assert "| 1 (SD) | beyond W_long | not yet run |" in text
    assert "The Gated DeltaNet hybrid: lazy in 1 of 2 (1–99 %) seeds" in text
    # the far share against rho*: 0.5 % of the targets; rho*(T/8) = 1 % of the answers, which
    # are 0.9 / (0.9 + 0.1 * 256) of the targets; rho* with its interval
    per = 0.9 / (0.9 + 0.1 * 256)
    lo, hi = report.L.rho_star_interval(report.L.load_cells(lcfg), 32, ["0%", "1%"])
    assert (
        f"ρ*(T/8) = 1 % (95 % interval {report.L.interval_text(lo, hi)} on old episode ids) is "
        f"{100 * 0.01 * per:.3f} % of the targets" in text
    )
    assert f"the text's own far share is {0.005 / (0.01 * per):.0f}× ρ* (" in text
    # the README's table and sentences are made from the same numbers
    cells = report.L.load_cells(lcfg)
    table = "\n".join(readme.claims_table(settings, []))
    assert "| SX, episodes, 1 % far answers | cannot be shown: 2/2 short seeds recall" in table
    assert "| cannot be shown: 0/2 long seeds lazy |" in table  # 80 and 100 % beyond W_long
    assert "| SX, episodes, no far answer |" in table and "2/2 long seeds lazy" in table
    assert "SD," not in table  # no SD claims run in this archive: no SD row
    text = " ".join(readme.sentences(settings, cells, []))
    assert (
        "Laziness is there: with no answer beyond the window in training, a long window of T/8 "
        "ended lazy in 2 of 2 SX seeds (2 of 2 with episode ids the text also holds)." in text
    )
    assert "ρ* = 1 % of the training answers beyond W = T/8" in text
    assert "With 2 seeds per window, none of the 10 parts of the three claims held and" in text
    assert "On text alone" not in text  # no text study in this archive


def test_each_block_stands_in_one_place():
    # the README's reading, and docs/studies.md's window sweep and laziness map, are what the
    # studies' reports write (report --check compares them, experiments/tests/test_studies.py);
    # each block stands in one page only, so that no stale copy is left behind
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for begin, home in (
        (readme.BEGIN, readme.README),
        (window_sweep.README_BEGIN, window_sweep.STUDIES_PAGE),
        (laziness_map.README_BEGIN, laziness_map.STUDIES_PAGE),
    ):
        assert [p for p in pages if begin in p.read_text()] == [home], begin
    # the picture the README shows is the laziness map's, which its report writes
    assert f"]({readme.FIGURE})" in readme.README.read_text()
    assert (ROOT / readme.FIGURE).stat().st_size > 1000
