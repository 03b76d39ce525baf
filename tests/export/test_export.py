"""swax export hf / onnx: the exported model against swax's own forward and generate."""

import json
import os
import subprocess
import sys

import pytest
import torch

# offline, and transformers' remote-code module cache where tests may write; set before
# transformers is imported
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.cli import main  # noqa: E402
from swax.data import ByteTokenizer, load_model_tokenizer, load_tokenizer  # noqa: E402
from swax.data.tokenizer import save_tokenizer  # noqa: E402

WINDOW = 16
PATTERNS = ["SX", "SD", "SA"]
TEXTS = [
    "Hello, world! The quick brown fox.",
    "  leading spaces\tand tabs\nand lines  ",
    "héllo wörld — naïve café, 日本語, emoji 🙂",
    "",
]


def tiny(pattern: str, **kw) -> SwaxLM:
    torch.manual_seed(0)
    cfg = SwaxConfig.preset(
        "tiny", d_model=32, n_layers=2, n_heads=2, window=WINDOW, layer_pattern=pattern, **kw
    )
    return SwaxLM(cfg.replace(init_std=0.2)).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """pattern -> (swax model, its checkpoint folder, the exported folder), exported through
    the command line's entry point."""
    root = tmp_path_factory.mktemp("export")
    out = {}
    for pattern in PATTERNS:
        model = tiny(pattern)
        model.save_pretrained(root / pattern)
        assert main(["export", "hf", str(root / pattern), str(root / f"{pattern}-hf")]) == 0
        out[pattern] = (model, root / pattern, root / f"{pattern}-hf")
    return out


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers", reason="needs transformers (pip install '.[test]')")


def load_hf(transformers, folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)


def test_exported_folder(exported):
    _, _, out = exported["SX"]
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "checksums.sha256",
        "configuration_swax.py",
        "modeling_swax.py",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "swax"
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_swax.SwaxForCausalLM"
    assert cfg["eos_token_id"] == 256


def test_overwrite_replaces_an_earlier_export(exported, tmp_path):
    """--overwrite puts the second model's weights where the first one's were, and leaves no
    temporary folder; without it the earlier export stays."""
    from safetensors.torch import load_file

    (_, first, _), (second_model, second, _) = exported["SX"], exported["SD"]
    out = tmp_path / "hf"
    assert main(["export", "hf", str(first), str(out)]) == 0
    assert main(["export", "hf", str(second), str(out)]) == 2
    assert main(["export", "hf", str(second), str(out), "--overwrite"]) == 0
    weights = load_file(str(out / "model.safetensors"))
    for name, t in second_model.state_dict().items():
        assert torch.equal(weights[name], t), name
    assert json.loads((out / "config.json").read_text())["layer_pattern"] == "SD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_import_back_into_swax(exported, pattern):
    model, _, out = exported[pattern]
    back = SwaxLM.from_pretrained(out)
    assert back.config == model.config
    ref = model.state_dict()
    got = back.state_dict()
    assert got.keys() == ref.keys()
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    assert isinstance(load_model_tokenizer(out), ByteTokenizer)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_hf_logits_equal_swax(exported, transformers, pattern):
    model, _, out = exported[pattern]
    hf = load_hf(transformers, out)
    assert type(hf).__name__ == "SwaxForCausalLM"
    ids = torch.randint(0, 257, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = hf(ids).logits
        ref = model(ids)
    assert got.shape == ref.shape
    assert (got - ref).abs().max() <= 1e-5
    # the labels' loss is the shifted cross entropy
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss
    ref_loss = torch.nn.functional.cross_entropy(
        ref[:, :-1].reshape(-1, 257), ids[:, 1:].reshape(-1)
    )
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-5)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_hf_greedy_generate_equals_swax(exported, transformers, pattern):
    """Prompt longer than the window, 24 new tokens, and the state carried: after the prompt
    every forward gets one new token."""
    model, _, out = exported[pattern]
    hf = load_hf(transformers, out)
    fed = []
    hf.embed.register_forward_hook(lambda m, args, y: fed.append(args[0].shape[1]))
    prompt = torch.randint(0, 256, (1, 37), generator=torch.Generator().manual_seed(2))
    got = hf.generate(prompt, max_new_tokens=24, do_sample=False)
    ref = model.generate(prompt, max_new_tokens=24, eos_token_id=256)
    assert got.tolist() == ref.tolist()
    assert fed[0] == 37 and set(fed[1:]) == {1} and len(fed) == got.shape[1] - 37


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("beams", [2, 4])
def test_hf_beam_search_equals_beam_search_without_a_cache(exported, transformers, pattern, beams):
    """Beam search reorders, drops and copies sequences between steps; the decode state must
    follow them. Reference: the same search with use_cache=False, where every step is a full
    forward pass of each whole sequence (no state at all). Two prompts, two sequences back
    each, scores compared too; and the cached search really fed one token per step."""
    _, _, out = exported[pattern]
    hf = load_hf(transformers, out)
    prompt = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(3))
    kw = dict(
        max_new_tokens=12,
        num_beams=beams,
        num_return_sequences=2,
        do_sample=False,
        early_stopping=True,
        return_dict_in_generate=True,
        output_scores=True,
    )
    fed = []
    hook = hf.embed.register_forward_hook(lambda m, args, y: fed.append(args[0].shape[1]))
    got = hf.generate(prompt, **kw)
    hook.remove()
    ref = hf.generate(prompt, use_cache=False, **kw)
    assert got.sequences.tolist() == ref.sequences.tolist()
    torch.testing.assert_close(got.sequences_scores, ref.sequences_scores, rtol=0, atol=1e-5)
    assert fed[0] == 21 and set(fed[1:]) == {1}


def test_hf_rejects_left_padding(exported, transformers):
    hf = load_hf(transformers, exported["SX"][2])
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="left"):
        hf(ids, attention_mask=mask)
    right = torch.ones_like(ids)
    right[0, -3:] = 0
    hf(ids, attention_mask=right)  # right padding is fine without a decode state
    with pytest.raises(ValueError, match="generate without padding"):
        hf.generate(ids, attention_mask=right, max_new_tokens=2, do_sample=False)


def test_byte_tokenizer_round_trip(exported, transformers):
    _, _, out = exported["SX"]
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ref = ByteTokenizer()
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 256
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == ref.encode(text), text
        assert tok.decode(ids) == ref.decode(ids) == text
    assert tok.decode([104, 105, 256], skip_special_tokens=True) == ref.decode([104, 105, 256])


def test_bpe_tokenizer_copied(tmp_path, transformers):
    bpe = load_tokenizer("gpt2")
    model = tiny("SA", vocab_size=50304)
    model.save_pretrained(tmp_path / "m")
    save_tokenizer(bpe, tmp_path / "m")
    assert main(["export", "hf", str(tmp_path / "m"), str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == bpe.eot_id
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == bpe.encode(text), text
        assert tok.decode(ids) == bpe.decode(ids)
    assert load_model_tokenizer(tmp_path / "hf").encode(TEXTS[2]) == bpe.encode(TEXTS[2])


def test_lm_eval_hf_model_offline(exported, transformers, tmp_path):
    """lm-eval's own "hf" model type on the exported folder: no adapter, a local JSON task, and
    per-request loglikelihoods equal to swax's forward."""
    pytest.importorskip("lm_eval")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from tests.eval.test_lm_eval_adapter import ARC, MC_YAML, ref_loglikelihood

    model, _, out = exported["SX"]
    data = tmp_path / "arc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ARC[:3]))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "arc.yaml").write_text(MC_YAML.format(data=data, cache=tmp_path / "c"))
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={out},trust_remote_code=True,dtype=float32",
        tasks=["swax_test_arc"],
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        device="cpu",
        batch_size=1,
        log_samples=True,
    )
    samples = res["samples"]["swax_test_arc"]
    n = 0
    for s in samples:
        for args, resp in zip(s["arguments"], s["resps"]):
            ctx, cont = args[0], args[1]
            ll, greedy = resp[0]
            ref_ll, ref_greedy = ref_loglikelihood(model, ctx, cont)
            assert ll == pytest.approx(ref_ll, abs=1e-3), (ctx, cont)
            assert bool(greedy) == ref_greedy
            n += 1
    assert n == sum(len(d["choices"]["text"]) for d in ARC[:3])


@pytest.mark.parametrize(
    "pattern,window",
    [("SX", None), pytest.param("SD", 8, marks=pytest.mark.slow)],  # SD: about 20 s
)
def test_onnx_matches_onnxruntime(exported, tmp_path, pattern, window):
    pytest.importorskip("onnxscript", reason="needs onnx + onnxscript (pip install '.[test]')")
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime")
    model, ckpt, _ = exported[pattern]
    path = tmp_path / "m.onnx"
    args = ["export", "onnx", str(ckpt), str(path), "--seq-len", "24"]
    assert main(args + (["--window", str(window)] if window else [])) == 0
    ids = torch.randint(0, 257, (1, 24), generator=torch.Generator().manual_seed(3))
    got = ort.InferenceSession(str(path)).run(None, {"input_ids": ids.numpy()})[0]
    with torch.no_grad():
        ref = model(ids, window=window or WINDOW).numpy()
    assert got.shape == ref.shape
    assert abs(got - ref).max() <= 1e-4
    # the window is baked in: a different window gives different logits
    with torch.no_grad():
        other = model(ids, window=4).numpy()
    assert abs(got - other).max() > 1e-3


def test_bad_input_one_line_exit_2(exported, tmp_path, capsys):
    _, ckpt, _ = exported["SX"]
    proc = subprocess.run(
        [sys.executable, "-m", "swax", "export", "hf", str(tmp_path / "missing"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"swax: error: checkpoint directory {tmp_path / 'missing'} does not exist"
    ]
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert main(["export", "hf", str(ckpt), str(busy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"swax: error: OUT_DIR {busy} exists and is not empty (nothing was overwritten; "
        "--overwrite replaces an earlier export there)"
    ]
    assert main(["export", "hf", str(ckpt), str(busy), "--overwrite"]) == 2  # not an export
    assert "does not write (e.g. keep.txt)" in capsys.readouterr().err
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    assert (busy / "keep.txt").read_text() == "mine"
    onnx_file = tmp_path / "x.onnx"
    onnx_file.write_text("mine")
    assert main(["export", "onnx", str(ckpt), str(onnx_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"swax: error: OUT {onnx_file} already exists (nothing was overwritten; --overwrite "
        "replaces it)"
    ]
    assert onnx_file.read_text() == "mine"
    with pytest.raises(SystemExit) as exit_info:  # argparse checks the minimum
        main(["export", "onnx", str(ckpt), str(tmp_path / "y.onnx"), "--seq-len", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "swax: error: argument --seq-len: expected a positive integer, got 0 "
        "(see swax export onnx --help)"
    ]
    assert not list(tmp_path.glob(".*"))  # no temporary folders or files left behind
    # an output under a file, or where no folder can be made: one line, before any work
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for args, what in (
        (["onnx", str(ckpt), str(a_file / "x.onnx")], f"its folder {a_file} exists and is not a"),
        (["hf", str(ckpt), str(a_file / "hf")], "is not writable: a part of the path is a file"),
    ):
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("swax: error: OUT") and what in err[0], err
    assert a_file.read_text() == "mine"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_portable_ops_equal_default_ops(exported, pattern):
    """What the ONNX export traces (pure-torch backends, forward-substitution solve) computes
    what the default ops compute (the SD ONNX test itself is in the slow tier)."""
    from swax.export import portable_ops
    from swax.ops.registry import _FORCED

    model = exported[pattern][0]
    ids = torch.randint(0, 257, (2, 70), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(ids)
        with portable_ops():
            got = model(ids)
    assert not _FORCED  # restored on exit
    assert (got - ref).abs().max() <= 1e-5
