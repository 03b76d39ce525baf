"""REPORT.md of the regime study: the laziness map and the three claims, read together.

    python experiments/regime_study/report.py      # REPORT.md from the committed results alone

Built from the same committed per-run files as LAZINESS.md (laziness.py) and CLAIMS.md
(claims.py), with their functions, so its numbers are theirs; every sentence that states a
result is made from those numbers here. The first study of this regime, whose reading did not
hold, is FIRST_STUDY.md (run.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import claims as C  # noqa: E402
import laziness as L  # noqa: E402
from studycli import run, update_readme  # noqa: E402

from swax.sweep import load_sweep  # noqa: E402

REPORT = "REPORT.md"


def _count(recs: list[dict], kind: str) -> str:
    return f"{sum(r['kind'] == kind for r in recs)} of {len(recs)}"


def _numeric_columns(cells, w: int) -> list[str]:
    """The far-share columns ("0%", "0.5%", ...) that row ``w`` has, in increasing share."""
    cols = [c for ww, c in cells if ww == w and c.endswith("%")]
    return sorted(cols, key=lambda c: float(c[:-1]))


def map_section(lcfg, cells) -> list[str]:
    seq_len = lcfg.base["seq_len"]
    done = sum(len(v) for v in cells.values())
    planned = len(lcfg.grid_points) * len(L.grid_seeds(lcfg))
    tokens = lcfg.base["steps"] * lcfg.base["batch_size"] * seq_len / 1e6
    lines = [
        "## 1. The laziness map: how much far supervision a long window needs",
        "",
        f"SWAX (SX, 2 layers, d_model {lcfg.base['model']['d_model']}) trained with a fixed "
        f"window W at T = {seq_len} on 10 % text and 90 % one-pair recall episodes, "
        f"{tokens:.1f}M tokens per run; the column is the share of training answers that lie "
        "beyond W (every other answer lies inside it under the attention mask). Seeds that end "
        f"lazy / seeds run ({done} of {planned} planned runs"
        + ("; a cell marked – is not run yet" if done < planned else "")
        + "):",
        "",
        *L.share_table(lcfg, cells),
        "",
    ]
    for w in sorted(lcfg.grid.axes[L.WINDOW_AXIS]):
        zero = cells.get((w, "0%"), [])
        if not zero:
            continue
        lines.append(
            f"- W = {w} (T/{seq_len // w}): with no answer beyond W, lazy in "
            f"{_count(zero, 'lazy')} seeds and carried by the memory in "
            f"{_count(zero, 'memory')}."
        )
    lines += [
        "",
        "Per seed, with the probes and when the memory emerged: [LAZINESS.md](LAZINESS.md).",
        "",
    ]
    return lines


def claims_section(ccfg, runs) -> list[str]:
    families = {"SX": ccfg.roles, **ccfg.families}
    b = ccfg.base
    tokens = b["steps"] * b["batch_size"] * b["seq_len"] / 1e6
    lines = [
        "## 2. The three claims in the paper's regime",
        "",
        f"T = {b['seq_len']}, W_short = {b['window']['short']} "
        f"(T/{b['seq_len'] // b['window']['short']}), W_long = {b['window']['long']} "
        f"(T/{b['seq_len'] // b['window']['long']}), "
        f"{b['data']['synthetic']['far_share']:.0%} of the training answers beyond W_long, "
        f"{tokens:.1f}M tokens per run, seeds {ccfg.seeds}.",
        "",
        "| claim | verdict | seeds per role |",
        "|---|---|---|",
    ]
    for family, roles in families.items():
        have = min(len(runs.get(n, [])) for n in roles.values())
        for claim, verdict, _ in C.judge(family, roles, runs):
            lines.append(f"| {claim.split('. ', 1)[0]}. {claim.split('. ', 1)[1]} | {verdict} | "
                         f"{have} |")  # fmt: skip
    lines += ["", "The evidence behind each verdict: [CLAIMS.md](CLAIMS.md).", ""]
    lines += ["Per seed (recall % inside W_long / beyond it / beyond T, and the verdict):", ""]
    for roles in families.values():
        for role in ("long", "short", "stochastic"):
            name = roles[role]
            recs = runs.get(name, [])
            if recs:
                per = "; ".join(
                    f"s{r['seed']} {L.fmt(r['inside'])}/{L.fmt(r['beyond'])}/"
                    f"{L.fmt(r['beyond_T'])} {r['kind']}"
                    for r in recs
                )
                lines.append(f"- {name}: {per}")
    lines += ["", "Controls (a long window: the positive one should be lazy, the negative not):"]
    lines.append("")
    for family in families:
        for suffix, what in C.CONTROLS:
            name = f"{family.lower()}-{suffix}"
            recs = runs.get(name, [])
            kinds = ", ".join(r["kind"] for r in recs) or "not yet run"
            lines.append(
                f"- {name} ({what}): lazy in {_count(recs, 'lazy')} seeds ({kinds})."
                if recs
                else f"- {name} ({what}): not yet run."
            )
    lines.append("")
    return lines


def _cut_of_others(recs: list[dict]) -> float | None:
    """Mean recall in (W_short, W_long] with the window cut to W_short, over the seeds that are
    not lazy: why they are not. None when every seed is lazy."""
    other = [r for r in recs if r["kind"] != "lazy"]
    return sum(r["cut_inner"] for r in other) / len(other) if other else None


def _cut_note(recs: list[dict]) -> str:
    cut = _cut_of_others(recs)
    if cut is None:
        return ""
    return (
        f"; with the window cut to W_short they still recall {L.fmt(cut)} % in (W_short, "
        "W_long], so their recurrent memory carries the near answers too"
    )


def rho_by_row(cells) -> dict[int, str]:
    """rho* per long window W of the map: the far share at which half the seeds stay lazy."""
    return {
        w: L.rho_star(
            [(float(c[:-1]) / 100, L.lazy_share(cells[(w, c)]))
             for c in _numeric_columns(cells, w)]
        )
        for w in sorted({w for w, _ in cells})
    }  # fmt: skip


def reading(ccfg, runs, cells) -> list[str]:
    """What the numbers say, sentence by sentence from the numbers."""
    out = ["## 3. Reading", ""]
    sx_near, sd_near = runs.get("sx-long-near", []), runs.get("sd-long-near", [])
    if sx_near:
        lazy = sum(r["kind"] == "lazy" for r in sx_near)
        out.append(
            f"- **Laziness exists at this scale.** With every training answer inside W_long, "
            f"the SX long window ended lazy in {lazy} of {len(sx_near)} seeds after "
            f"{ccfg.base['steps'] * ccfg.base['batch_size'] * ccfg.base['seq_len'] / 1e6:.1f}M "
            "tokens: recall 100 % inside the window, chance beyond it, and the window cut "
            "removes it while the recurrent reset does not."
            + (
                f" The Gated DeltaNet hybrid is less clear-cut: lazy in "
                f"{_count(sd_near, 'lazy')} seeds (the others "
                f"{', '.join(r['kind'] for r in sd_near if r['kind'] != 'lazy') or 'none'})"
                + _cut_note(sd_near)
                + (
                    ". So SD's positive control is not lazy in most seeds, and its claim 2 is "
                    "judged where even no far supervision leaves the memory in use"
                    if sum(r["kind"] == "lazy" for r in sd_near) <= len(sd_near) / 2
                    else ""
                )
                + "."
                if sd_near
                else ""
            )
        )
    row = rho_by_row(cells)
    if row:
        out.append(
            "- **A little far supervision ends it, and how little depends on W/T.** ρ* (the far "
            "share at which half the seeds stay lazy): "
            + "; ".join(f"W = {w}: {v}" for w, v in row.items())
            + ". A lazy cell is lazy within its 10.2M-token budget: the memory emerged as late "
            "as the last checkpoint in some memory cells."
        )
    for w in sorted({w for w, _ in cells}):
        zero = cells.get((w, "0%"), [])
        if zero and L.lazy_share(zero) <= 0.5:
            out.append(
                f"- **At W = {w} the memory formed with no far supervision at all** in "
                f"{_count(zero, 'memory')} seeds, where attention could have answered every "
                "training question: whichever mechanism forms first carries retrieval, and here "
                "it was the memory."
            )
    for family, roles in {"SX": ccfg.roles, **ccfg.families}.items():
        s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
        if not (s and lg and st):
            continue
        lazy = sum(r["kind"] == "lazy" for r in lg)
        verdict2 = C.judge(family, roles, runs)[1][1]
        out.append(
            f"- **{family}, at {ccfg.base['data']['synthetic']['far_share']:.0%} far answers "
            f"and 3× the map's tokens:** the long window ended lazy in {lazy} of {len(lg)} "
            f"seeds, so claim 2 {verdict2} here. Beyond W_long the short window recalls "
            f"{L.fmt(C._mean(s, 'beyond'))} % and the long one {L.fmt(C._mean(lg, 'beyond'))} % "
            f"on average, beyond T {L.fmt(C._mean(s, 'beyond_T'))} % and "
            f"{L.fmt(C._mean(lg, 'beyond_T'))} %; the stochastic schedule "
            f"{L.fmt(C._mean(st, 'beyond'))} % and {L.fmt(C._mean(st, 'beyond_T'))} %. Held-out "
            f"text loss (nats/byte): short {L.fmt(C._mean(s, 'text'), 3)}, long "
            f"{L.fmt(C._mean(lg, 'text'), 3)}, stochastic {L.fmt(C._mean(st, 'text'), 3)}, "
            f"with a standard error over seeds of about "
            f"{L.fmt(max(C._se(x, 'text') for x in (s, lg, st)), 3)}."
        )
    out += [
        "- **The task is the simplest that learns on this machine.** One key-value pair, where "
        "the answer is the only value-range token in the context: it measures which memory "
        "carries a token across a distance, not lookup by key. The binding variants tried are "
        "in NOTES.md (sections 3, 4 and 7): with distractor values in the filler no model bound "
        "values to keys at T = 64, and four pairs without distractors, learned at T = 64, did "
        "not learn at the study's T = 256 within the CPU budget, so neither is in the study.",
        "",
    ]
    return out


README_BEGIN = "<!-- regime-reading:begin (written by experiments/regime_study/report.py) -->"
README_END = "<!-- regime-reading:end -->"


def readme_block(ccfg, runs, cells) -> str:
    """The README's paragraph on the study: its findings, each number computed here."""
    b = ccfg.base
    tokens = b["steps"] * b["batch_size"] * b["seq_len"] / 1e6
    far = b["data"]["synthetic"]["far_share"]
    seq_len = b["seq_len"]
    families = {"SX": ccfg.roles, **ccfg.families}
    out = ["Reading, from the committed runs (REPORT.md has the tables):"]
    near = [(f, runs.get(f"{f.lower()}-long-near", [])) for f in families]
    near = [(f, recs) for f, recs in near if recs]
    if near:
        out.append(
            "with no answer beyond the window in training, the long window "
            f"(T/{seq_len // b['window']['long']}, {tokens:.1f}M "
            "tokens) ended lazy (≥ 90 % inside it, chance beyond) in "
            + " and ".join(f"{_count(recs, 'lazy')} {f} seeds" for f, recs in near)
            + "".join(
                f" ({f}: the others' window-cut probe still recalls {L.fmt(cut)} % in "
                "(W_short, W_long], so their recurrent memory carries the near answers too)"
                for f, recs in near
                if (cut := _cut_of_others(recs)) is not None
            )
            + "."
        )
    row = rho_by_row(cells)
    if row:
        out.append(
            "The far share at which half the seeds stay lazy, ρ*, is "
            + ", ".join(f"{v.split(' (')[0]} at W = T/{seq_len // w}" for w, v in row.items())
            + f" (the laziness map, {min(len(v) for v in cells.values())} seeds or more per "
            "cell)."
        )
    for family, roles in families.items():
        s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
        if not (s and lg and st):
            continue
        out.append(
            f"At {far:.0%} far answers ({family}, {len(lg)} seeds) the long window ended lazy in "
            f"{_count(lg, 'lazy')}, so claim 2 {C.judge(family, roles, runs)[1][1]} there: "
            f"beyond W_long it recalls {L.fmt(C._mean(lg, 'beyond'))} % against "
            f"{L.fmt(C._mean(s, 'beyond'))} % for the short window."
        )
    return " ".join(out)


def write_report(out: Path, lcfg=None, ccfg=None) -> Path:
    """REPORT.md in ``out`` from the archived results of the two sweeps (default: the
    committed ones of laziness.yaml and claims.yaml); returns its path."""
    lcfg = lcfg or load_sweep(HERE / "laziness.yaml")
    ccfg = ccfg or load_sweep(HERE / "claims.yaml")
    cells = L.load_cells(lcfg)
    runs = C.load_runs(ccfg)
    lines = [
        "# The window effect in the paper's regime, measured by distance",
        "",
        "Generated by `python experiments/regime_study/report.py` from the committed per-run "
        "results in `results/`; nothing below is typed by hand. The tables per seed are "
        "[LAZINESS.md](LAZINESS.md) and [CLAIMS.md](CLAIMS.md); every attempt, and why the "
        "first study's reading was wrong, is in [NOTES.md](NOTES.md); the first study itself "
        "is [FIRST_STUDY.md](FIRST_STUDY.md).",
        "",
        "An answer lies **inside** window W when the position that predicts it attends to the "
        "value under the attention op's own mask. Recall is read by distance bucket; a run is "
        "**lazy** when it recalls ≥ 90 % inside the long window and at most 10 points above "
        "chance (6.25 %) beyond it, **memory** when it recalls ≥ 50 % beyond it.",
        "",
        *map_section(lcfg, cells),
        *claims_section(ccfg, runs),
        *reading(ccfg, runs, cells),
    ]
    path = out / REPORT
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    print(f"report: {write_report(HERE)}")
    ccfg = load_sweep(HERE / "claims.yaml")
    block = readme_block(ccfg, C.load_runs(ccfg), L.load_cells(load_sweep(HERE / "laziness.yaml")))
    if update_readme(ROOT / "README.md", README_BEGIN, README_END, block):
        print("README.md: the study's reading updated")
    return 0


if __name__ == "__main__":
    run(main)
