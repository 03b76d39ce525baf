"""`swax import xlstm`: a transformers xLSTM folder as a swax model (:mod:`swax.export.xlstm`)."""

from __future__ import annotations

from swax.cli import options as C
from swax.export.xlstm import import_xlstm


def cmd_import_xlstm(cfg: C.ImportXLSTMConfig) -> int:

    out, model, carried = import_xlstm(
        cfg.src,
        cfg.out,
        add_swa=cfg.add_swa,
        window=cfg.window,
        heads=cfg.heads,
        dtype=cfg.dtype,
        ignore=tuple(cfg.ignore_field),
        seed=cfg.seed,
    )
    what = f"pattern {model.layer_types[:4]}{'…' if model.n_layers > 4 else ''}, "
    what += f"{model.n_layers} layers, d_model {model.d_model}"
    tok = f"tokenizer: {', '.join(carried)}" if carried else "no tokenizer files in SRC"
    print(f"wrote {out} ({what}; {tok})")
    if cfg.add_swa:
        print(f"train it on: swax train init_from={out} run_dir=... (see docs/training.md)")
    return 0


IMPORT_COMMANDS: dict = {
    "xlstm": (
        C.ImportXLSTMConfig,
        cmd_import_xlstm,
        "a transformers xLSTM folder as a swax model (--add-swa: a SWAX to train on)",
    ),
}
