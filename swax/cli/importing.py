"""`swax import xlstm`: a transformers xLSTM folder as a swax model (:mod:`swax.export.xlstm`)."""

from __future__ import annotations

from swax.cli import options as C
from swax.data.tokenizer import ByteTokenizer
from swax.export.xlstm import Imported, import_xlstm


def cmd_import_xlstm(cfg: C.ImportXLSTMConfig) -> int:

    done = import_xlstm(
        cfg.src,
        cfg.out,
        add_swa=cfg.add_swa,
        window=cfg.window,
        heads=cfg.heads,
        dtype=cfg.dtype,
        ignore=tuple(cfg.ignore_field),
        seed=cfg.seed,
        overwrite=cfg.overwrite,
    )
    out, model = done.out, done.config
    what = f"pattern {model.layer_types[:4]}{'…' if model.n_layers > 4 else ''}, "
    what += f"{model.n_layers} layers, d_model {model.d_model}"
    print(f"wrote {out} ({what})")
    for line in _notes(done):
        print(line)
    if cfg.add_swa:
        print(
            f"train it on: swax train init_from={out} run_dir=... (at its window "
            f"{model.window} unless you set window.long; see docs/training.md)"
        )
    return 0


def _notes(done: Imported) -> list[str]:
    """What a user should know about the folder written: its tokenizer, its dtype."""
    notes, vocab = [], done.config.vocab_size
    if done.tokenizer_files:
        notes.append(f"tokenizer: {', '.join(done.tokenizer_files)}")
    else:
        byte = ByteTokenizer.vocab_size
        note = f"no tokenizer files in SRC: swax falls back to bytes ({byte} ids)"
        if vocab < byte:
            note += (
                f", more than the model's {vocab}: put the model's tokenizer.json (and "
                "tokenizer_config.json) in OUT before generating or training with it"
            )
        notes.append(note)
    low = [d for d in done.dtypes if d != "float32"]
    if low:
        notes.append(
            f"weights {', '.join(done.dtypes)}: swax loads them as float32 unless asked "
            f"(SwaxLM.from_pretrained(OUT, dtype=torch.{low[0]}), swax generate --dtype …)"
        )
    return notes


IMPORT_COMMANDS: dict = {
    "xlstm": (
        C.ImportXLSTMConfig,
        cmd_import_xlstm,
        "a transformers xLSTM folder as a swax model (--add-swa: a SWAX to train on)",
    ),
}
