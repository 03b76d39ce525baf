"""`swax export {hf,onnx,xlstm}`: a Hugging Face folder, an ONNX graph or a transformers xLSTM
folder (:mod:`swax.export`, :mod:`swax.export.xlstm`)."""

from __future__ import annotations

from swax.cli import options as C
from swax.export import export_hf, export_onnx
from swax.export.xlstm import export_xlstm


# ---------------------------------------------------------------- swax export (hf, onnx)
def cmd_export_hf(cfg: C.ExportHFConfig) -> int:

    out = export_hf(cfg.model_dir, cfg.out_dir, cfg.overwrite)
    print(
        f"wrote {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
    )
    return 0


def cmd_export_onnx(cfg: C.ExportOnnxConfig) -> int:

    out = export_onnx(
        cfg.model_dir, cfg.out, cfg.seq_len, cfg.window, cfg.batch_size, cfg.overwrite
    )
    print(f"wrote {out}: input_ids int64 ({cfg.batch_size}, {cfg.seq_len}) -> logits")
    return 0


def cmd_export_xlstm(cfg: C.ExportXLSTMConfig) -> int:

    out, tokenizer = export_xlstm(cfg.model_dir, cfg.out, cfg.overwrite)
    print(
        f"wrote {out}: transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}); {tokenizer}"
    )
    return 0


EXPORT_COMMANDS: dict = {
    "hf": (C.ExportHFConfig, cmd_export_hf, "a Hugging Face folder (transformers, lm-eval)"),
    "onnx": (C.ExportOnnxConfig, cmd_export_onnx, "an ONNX graph of the forward (fixed shape)"),
    "xlstm": (
        C.ExportXLSTMConfig,
        cmd_export_xlstm,
        "a transformers xLSTM folder of a pure-mLSTM model (no remote code)",
    ),
}
