"""`swax export {hf,onnx}`: a Hugging Face folder or an ONNX graph (:mod:`swax.export`)."""

from __future__ import annotations

from swax.cli import options as C
from swax.export import export_hf, export_onnx


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


EXPORT_COMMANDS: dict = {
    "hf": (C.ExportHFConfig, cmd_export_hf, "a Hugging Face folder (transformers, lm-eval)"),
    "onnx": (C.ExportOnnxConfig, cmd_export_onnx, "an ONNX graph of the forward (fixed shape)"),
}
