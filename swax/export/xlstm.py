"""transformers' xLSTM folders in and out: ``swax import xlstm`` and ``swax export xlstm``.

- :func:`import_xlstm` reads a folder of ``xLSTMForCausalLM`` (config.json + safetensors, the
  ``single`` or ``fused`` weight layout, one file or shards with an index) and writes a swax
  model folder computing the same function (pattern ``X``, :mod:`swax.export.xlstm_config`),
  one tensor at a time (:mod:`swax.export.tensors`); the tokenizer files come along. With
  ``add_swa`` every mLSTM block is followed by a new sliding-window attention block whose
  attention output projection and MLP down projection are zero: the new model computes exactly
  the source's function until training moves them (pattern ``XS``).
- :func:`export_xlstm` writes a pure-mLSTM swax model as a folder that
  ``transformers.AutoModelForCausalLM.from_pretrained`` loads without remote code.

:func:`map_tensors` is the whole correspondence: which source tensor (and which rows of a fused
one) each swax tensor is, checked on shapes alone, so a 7B layout is checked without reading
its weights.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from swax.config import SwaxConfig
from swax.core.errors import CheckpointError, ConfigError
from swax.core.integrity import (
    CHECKSUMS_NAME,
    state_dict_mismatch,
    verify_checksum_file,
    write_checksum_file,
)
from swax.export import _check_out_dir, _swap_in
from swax.export.tensors import Entry, TensorFolder, write_streamed
from swax.export.xlstm_config import swax_config_from_xlstm, xlstm_config_from_swax
from swax.export.xlstm_tokens import (
    TOKEN_IDS_NAME,
    TOKENIZER_FILES,
    export_tokenizer,
    source_token_ids,
    token_ids,
)
from swax.model import CONFIG_NAME, WEIGHTS_NAME, Block, SwaxLM, resolve_model_dir

IMPORT_OUTPUTS = (CONFIG_NAME, WEIGHTS_NAME, CHECKSUMS_NAME, TOKEN_IDS_NAME, *TOKENIZER_FILES)
"""The files ``swax import xlstm`` writes (what ``--overwrite`` may replace)."""
EXPORT_OUTPUTS = (CONFIG_NAME, WEIGHTS_NAME, *TOKENIZER_FILES)
"""The files ``swax export xlstm`` writes (what ``--overwrite`` may replace)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Slot = tuple[str, tuple[int, int] | None]
"""Where a swax tensor comes from: (source tensor name, its rows [start, stop) or None)."""


def _block_slots(i: int, j: int, fused: bool, dims: dict) -> dict[str, Slot]:
    """swax block ``j``'s tensors from xLSTM block ``i`` (``dims``: qk, v, heads, up)."""
    s, L, d = f"backbone.blocks.{i}.", f"backbone.blocks.{i}.mlstm_layer.", f"blocks.{j}."
    qk, v, h, up = dims["qk"], dims["v"], dims["heads"], dims["up"]
    out: dict[str, Slot] = {d + "mixer_norm.weight": (s + "norm_mlstm.weight", None)}
    if fused:
        qkvo, ifw, ifb = (
            L + "qkv_opreact.weight",
            L + "ifgate_preact.weight",
            L + "ifgate_preact.bias",
        )
        out |= {
            d + "mixer.q.weight": (qkvo, (0, qk)),
            d + "mixer.k.weight": (qkvo, (qk, 2 * qk)),
            d + "mixer.v.weight": (qkvo, (2 * qk, 2 * qk + v)),
            d + "mixer.ogate.weight": (qkvo, (2 * qk + v, 2 * qk + 2 * v)),
            d + "mixer.igate.weight": (ifw, (0, h)),
            d + "mixer.igate.bias": (ifb, (0, h)),
            d + "mixer.fgate.weight": (ifw, (h, 2 * h)),
            d + "mixer.fgate.bias": (ifb, (h, 2 * h)),
        }
    else:
        names = {"q": "q", "k": "k", "v": "v", "ogate": "ogate_preact"}
        names |= {"igate": "igate_preact", "fgate": "fgate_preact"}
        for ours, theirs in names.items():
            out[f"{d}mixer.{ours}.weight"] = (f"{L}{theirs}.weight", None)
            if ours in ("igate", "fgate"):
                out[f"{d}mixer.{ours}.bias"] = (f"{L}{theirs}.bias", None)
    out |= {
        d + "mixer.norm.weight": (L + "multihead_norm.weight", None),
        d + "mixer.out_proj.weight": (L + "out_proj.weight", None),
        d + "mlp_norm.weight": (s + "norm_ffn.weight", None),
        d + "mlp.down.weight": (s + "ffn.proj_down.weight", None),
    }
    if fused:
        gz = s + "ffn.proj_up_gate_z.weight"
        out |= {d + "mlp.gate.weight": (gz, (0, up)), d + "mlp.up.weight": (gz, (up, 2 * up))}
    else:
        out |= {
            d + "mlp.gate.weight": (s + "ffn.proj_up_gate.weight", None),
            d + "mlp.up.weight": (s + "ffn.proj_up.weight", None),
        }
    return out


def _slot_shape(src: tuple[int, ...], rows: tuple[int, int] | None, want: tuple[int, ...]):
    """The shape a slot gives (a head norm of shape (H, Dv) is read flat, as transformers'
    own (H·Dv,))."""
    shape = src if rows is None else (rows[1] - rows[0], *src[1:])
    if len(want) == 1 and len(shape) == 2 and shape[0] * shape[1] == want[0] and rows is None:
        return want
    return shape


def map_tensors(
    hf: dict, cfg: SwaxConfig, shapes: dict[str, tuple], swax_shapes: dict[str, tuple]
) -> dict[str, Slot]:
    """swax tensor name -> the source tensor (and rows) it is, for the xLSTM config ``hf`` whose
    tensors have ``shapes`` (name -> shape) and the swax model of ``cfg`` whose state dict has
    ``swax_shapes``; with pattern ``XS`` (add-SWA) source block i is swax block 2i and the
    odd blocks are new (absent from the map). CheckpointError naming the first tensor that is
    missing, left over, or of another shape."""
    fused = hf.get("weight_mode", "single") == "fused"
    step = 2 if cfg.layer_pattern == "XS" else 1
    d, heads = cfg.d_model, cfg.recurrent_heads or cfg.n_heads
    dims = {"qk": int(d * cfg.qk_dim_factor), "v": int(d * cfg.v_dim_factor), "heads": heads}
    dims["up"] = swax_shapes["blocks.0.mlp.gate.weight"][0]
    slots: dict[str, Slot] = {
        "embed.weight": ("backbone.embeddings.weight", None),
        "norm.weight": ("backbone.out_norm.weight", None),
        "head.weight": ("lm_head.weight", None),
    }
    for i in range(cfg.n_layers // step):
        slots |= _block_slots(i, i * step, fused, dims)
    layout = f"the weight_mode={'fused' if fused else 'single'} layout"
    for name, (src, rows) in slots.items():
        if src not in shapes:
            raise CheckpointError(
                f"the source has no tensor {src} ({layout}, {cfg.n_layers // step} blocks)"
            )
        want = tuple(swax_shapes.get(name, ()))
        got = _slot_shape(tuple(shapes[src]), rows, want)
        if name not in swax_shapes or got != want:
            raise CheckpointError(
                f"tensor {src}{'' if rows is None else f' rows {rows[0]}:{rows[1]}'} has shape "
                f"{got} where the config gives {want} ({name})"
            )
    left = [n for n in swax_shapes if n not in slots]  # only the new blocks' (odd with add-SWA)
    if any(step == 1 or not n.startswith("blocks.") or int(n.split(".")[1]) % 2 == 0 for n in left):
        raise CheckpointError(f"the swax model has tensors the source does not give ({left[0]})")
    used = {src for src, _ in slots.values()}
    extra = [n for n in shapes if n not in used]
    if extra:
        raise CheckpointError(
            f"the source has {len(extra)} tensor(s) swax does not map ({extra[0]}, …): not an "
            f"xLSTMForCausalLM of {cfg.n_layers // step} blocks in {layout}"
        )
    return slots


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {path.name} ({what})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _swa_overrides(cfg0: SwaxConfig, heads: int | None) -> dict:
    """The fields of the add-SWA model: pattern XS, twice the layers, attention heads."""
    d = cfg0.d_model
    if heads is None:
        if d % 128:
            raise ConfigError(
                f"--add-swa: d_model {d} is not a multiple of 128; choose the attention heads "
                "with --heads N (d_model / N even)"
            )
        heads = d // 128
    if d % heads or (d // heads) % 2:
        raise ConfigError(f"--heads {heads} must divide d_model {d} into heads of even width")
    return {"layer_pattern": "XS", "n_layers": 2 * cfg0.n_layers, "n_heads": heads}


class _NewBlocks:
    """The sliding-window blocks that --add-swa inserts, made one at a time: swax's
    initialisation drawn from seed + block index, attention output projection and MLP down
    projection zero (the block adds nothing to the residual stream until trained)."""

    def __init__(self, cfg: SwaxConfig, seed: int):
        self.cfg, self.seed, self.j, self.tensors = cfg, seed, -1, {}

    def get(self, name: str) -> torch.Tensor:
        j, rest = int(name.split(".")[1]), name.split(".", 2)[2]
        if j != self.j:
            std = self.cfg.init_std
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + j)
                with torch.device("meta"):
                    block = Block(self.cfg, "S")
                block = block.to_empty(device="cpu")
                block.reset_parameters(std, std / (2 * self.cfg.n_layers) ** 0.5)
            with torch.no_grad():
                block.mixer.o_proj.weight.zero_()
                block.mlp.down.weight.zero_()
            self.j, self.tensors = j, block.state_dict()
        return self.tensors[rest]


def _slot_reader(f: TensorFolder, slot: Slot, shape: tuple) -> Callable[[], torch.Tensor]:
    src, rows = slot

    def make() -> torch.Tensor:
        t = f.get(src)
        return (t if rows is None else t[rows[0] : rows[1]]).reshape(shape)

    return make


def _copy_tokenizer(src: Path, dst: Path) -> list[str]:
    found = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    for n in found:
        shutil.copyfile(src / n, dst / n)
    return found


class Imported(NamedTuple):
    """What :func:`import_xlstm` wrote."""

    out: Path
    config: SwaxConfig
    tokenizer_files: list[str]
    """The tokenizer files carried from the source (none: swax reads the ids as bytes)."""
    dtypes: list[str]
    """The dtypes of the written weights ("float32", "bfloat16", …)."""


def import_xlstm(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    add_swa: bool = False,
    window: int | None = None,
    heads: int | None = None,
    dtype: str = "keep",
    ignore: tuple[str, ...] = (),
    seed: int = 0,
    overwrite: bool = False,
) -> Imported:
    """Write the swax folder ``out`` (new or empty; with ``overwrite`` it may hold an earlier
    import, replaced once the new one is complete) of the transformers xLSTM folder ``src``.
    ``dtype``: keep (each tensor's own), float32, bfloat16 or float16. ``window``: the model's
    default attention window (the sliding-window blocks of ``add_swa``; ``heads`` their
    attention heads, default d_model / 128). The source's token ids (bos, eos, pad) are kept
    in ``token_ids.json`` for :func:`export_xlstm`. Built under a temporary name and renamed: a
    failure leaves nothing behind."""
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise CheckpointError(
            f"SRC {src} {'is not a folder' if src.exists() else 'does not exist'}"
        )
    if dtype != "keep" and dtype not in DTYPES:
        raise ConfigError(f"--dtype must be keep, {', '.join(DTYPES)}, got {dtype!r}")
    _check_out_dir(out, "OUT", overwrite, IMPORT_OUTPUTS, "swax import xlstm", source=("SRC", src))
    hf = _read_json(src / CONFIG_NAME, "the xLSTM config")
    extra = {} if window is None else {"window": window}
    cfg = swax_config_from_xlstm(hf, ignore, **extra)
    ids = source_token_ids(hf)
    if add_swa:
        cfg = swax_config_from_xlstm(hf, ignore, **extra, **_swa_overrides(cfg, heads))
    swax_shapes = _state_shapes(cfg)
    with TensorFolder(src) as f:
        slots = map_tensors(hf, cfg, f.shapes(), swax_shapes)
        new = _NewBlocks(cfg, seed)
        base = f.dtype("backbone.embeddings.weight")
        entries = []
        for name, shape in swax_shapes.items():
            if name in slots:
                kind = f.dtype(slots[name][0]) if dtype == "keep" else DTYPES[dtype]
                entries.append(Entry(name, shape, kind, _slot_reader(f, slots[name], shape)))
            else:
                kind = base if dtype == "keep" else DTYPES[dtype]
                entries.append(Entry(name, shape, kind, lambda n=name: new.get(n)))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            meta = {"format": "pt", "library": "swax", "source": "transformers xLSTM"}
            write_streamed(tmp / WEIGHTS_NAME, entries, meta)
            cfg.save(tmp / CONFIG_NAME)
            write_checksum_file(tmp, [WEIGHTS_NAME])
            (tmp / TOKEN_IDS_NAME).write_text(json.dumps(ids, indent=2) + "\n")
            carried = _copy_tokenizer(src, tmp)
            _swap_in(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    dtypes = sorted({str(e.dtype).removeprefix("torch.") for e in entries})
    return Imported(out, cfg, carried, dtypes)


def export_xlstm(
    model_dir: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False
) -> tuple[Path, str]:
    """Write the pure-mLSTM swax model ``model_dir`` as a transformers xLSTM folder ``out``
    (new or empty; with ``overwrite`` it may hold an earlier export, replaced once the new one
    is complete): config.json (model_type xlstm, weight_mode single), model.safetensors
    (streamed; a tied embedding written as lm_head too), the tokenizer
    (:func:`swax.export.xlstm_tokens.export_tokenizer`). A model that xLSTM cannot express is a
    ConfigError saying why, before anything is written. Returns (out, what became of the
    tokenizer)."""
    model_dir, out = resolve_model_dir(model_dir), Path(out)
    _check_out_dir(
        out, "OUT", overwrite, EXPORT_OUTPUTS, "swax export xlstm", source=("MODEL", model_dir)
    )
    try:
        cfg = SwaxConfig.load(model_dir / CONFIG_NAME)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir / CONFIG_NAME}: {e}") from None
    verify_checksum_file(model_dir, [WEIGHTS_NAME])
    write_tokenizer = export_tokenizer(model_dir, cfg.vocab_size)  # checked, not yet written
    with TensorFolder(model_dir) as f:
        shapes = f.shapes()
        if "blocks.0.mlp.gate.weight" not in shapes:
            raise CheckpointError(f"{model_dir} is not a swax model folder (no blocks.0.mlp)")
        hf = xlstm_config_from_swax(cfg, shapes["blocks.0.mlp.gate.weight"][0])
        with torch.device("meta"):
            ref = SwaxLM(cfg).state_dict()
        found = {n: torch.empty(shape, device="meta") for n, shape in shapes.items()}
        problem = state_dict_mismatch(ref, found)
        if problem:
            raise CheckpointError(
                f"{model_dir / WEIGHTS_NAME} does not match its config: {problem}"
            )
        theirs = _export_names(cfg, {k: tuple(v.shape) for k, v in ref.items()})
        entries = [
            Entry(hf_name, tuple(shapes[ours]), f.dtype(ours), lambda n=ours: f.get(n))
            for hf_name, ours in theirs.items()
        ]
        hf |= token_ids(model_dir, write_tokenizer.tokenizer)
        hf["dtype"] = str(f.dtype("embed.weight")).removeprefix("torch.")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            write_streamed(tmp / WEIGHTS_NAME, entries, {"format": "pt"})
            (tmp / CONFIG_NAME).write_text(json.dumps(hf, indent=2) + "\n")
            write_tokenizer(tmp)
            _swap_in(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out, write_tokenizer.what


def _state_shapes(cfg: SwaxConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of the state dict of a SwaxLM of ``cfg`` (built on the meta device)."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in SwaxLM(cfg).state_dict().items()}


def _export_names(cfg: SwaxConfig, swax_shapes: dict) -> dict[str, str]:
    """transformers name -> swax name of every tensor of the exported folder (a tied
    embedding is lm_head too)."""
    d, heads = cfg.d_model, cfg.recurrent_heads or cfg.n_heads
    dims = {"qk": int(d * cfg.qk_dim_factor), "v": int(d * cfg.v_dim_factor), "heads": heads}
    dims["up"] = swax_shapes["blocks.0.mlp.gate.weight"][0]
    pairs = {
        "backbone.embeddings.weight": "embed.weight",
        "backbone.out_norm.weight": "norm.weight",
    }
    pairs["lm_head.weight"] = "embed.weight" if cfg.tie_embeddings else "head.weight"
    for i in range(cfg.n_layers):
        pairs |= {src: ours for ours, (src, _) in _block_slots(i, i, False, dims).items()}
    return pairs
