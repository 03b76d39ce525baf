"""The import checker (tools/check_imports.py) finds circles and layering breaks, and swax has
none. The checker is run on small made-up packages whose problems are known by construction."""

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_imports", ROOT / "tools" / "check_imports.py")
check_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_imports)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "swax"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return root


def test_swax_has_no_import_circle_and_keeps_its_layers():
    assert check_imports.check(ROOT / "swax") == []


def test_a_top_level_circle_is_found(tmp_path):
    root = _package(tmp_path, {"a.py": "from .b import x\n", "b.py": "from . import a\nx = 1\n"})
    assert check_imports.check(root) == ["import circle: swax.a <-> swax.b"]


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": "import swax.b\n",
            "b.py": "def f():\n    from swax.c import g\n",
            "c.py": "def g():\n    if True:\n        from .a import h\n",
        },
    )
    assert check_imports.check(root) == ["import circle: swax.a <-> swax.b <-> swax.c"]


def test_an_import_for_annotations_only_is_a_circle_too(tmp_path):
    # it never runs, but a reader following the imports still meets the circle (issue: "no
    # import circle, type-only imports included")
    root = _package(
        tmp_path,
        {
            "a.py": "from .b import x\n",
            "b.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from .a import A
                else:
                    import json
                x = 1
                """,
        },
    )
    assert check_imports.check(root) == ["import circle: swax.a <-> swax.b"]


def test_an_import_in_the_else_of_type_checking_counts(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": "from .b import x\n",
            "b.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\n"
            "else:\n    from .a import y\n",
        },
    )
    assert check_imports.check(root) == ["import circle: swax.a <-> swax.b"]


@pytest.mark.parametrize(
    "importer, line, rule",
    [
        ("ops/att.py", "from ..model import M\n", "ops import nothing else"),
        ("ops/att.py", "from ..errors import E\n", "ops import nothing else"),
        ("layers/mix.py", "from ..data.loader import L\n", "layers import only the ops"),
        ("data/loader.py", "def f():\n    from ..train import t\n", "data never imports"),
        ("data/loader.py", "import swax.eval.niah\n", "data never imports"),
        ("model.py", "def f():\n    from .train import t\n", "nothing below train or eval"),
        ("generate.py", "from .eval.niah import x\n", "nothing below train or eval"),
        ("core/paths.py", "from ..model import M\n", "core imports nothing else"),
        ("config.py", "from .ops.att import x\n", "config imports only core"),
        ("train/loop.py", "from ..eval.niah import x\n", "train and eval side by side"),
        ("eval/recall.py", "def f():\n    from ..train import t\n", "train and eval side by side"),
        ("probes/buckets.py", "from ..train import t\n", "nothing below train or eval"),
        ("export/hf.py", "import swax.cli\n", "nothing below train or eval"),
        ("sweep/run.py", "from ..cli import main\n", "the command line is on top"),
        ("data/loader.py", "from ..probes.buckets import b\n", "data never imports"),
    ],
)
def test_a_layering_break_names_the_importer_and_the_rule(tmp_path, importer, line, rule):
    files = {
        importer: line,
        "model.py": "class M: ...\n",
        "errors.py": "class E(Exception): ...\n",
        "data/loader.py": "",
        "train/__init__.py": "t = 1\n",
        "eval/niah.py": "x = 1\n",
        "ops/att.py": "x = 1\n",
        "probes/buckets.py": "b = 1\n",
        "cli/__init__.py": "main = 1\n",
    }
    files[importer] = line
    problems = check_imports.check(_package(tmp_path, files))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"swax.{importer[:-3].replace('/', '.')} imports ")
    assert rule in problems[0]


def test_allowed_imports_pass(tmp_path):
    files = {
        "ops/att.py": "from .docs import d\nfrom . import docs\n",
        "ops/docs.py": "d = 1\n",
        "layers/mix.py": "from ..ops.att import x\nfrom .norm import n\n",
        "layers/norm.py": "n = 1\n",
        "data/loader.py": "from ..errors import E\nfrom .shards import s\n",
        "data/shards.py": "s = 1\n",
        "errors.py": "E = 1\n",
    }
    assert check_imports.check(_package(tmp_path, files)) == []


def test_the_command_exits_non_zero_on_a_problem(tmp_path, capsys):
    root = _package(tmp_path, {"a.py": "from .b import x\n", "b.py": "from .a import y\n"})
    assert check_imports.main(["check_imports", str(root)]) == 1
    assert "import circle: swax.a <-> swax.b" in capsys.readouterr().err
    assert check_imports.main(["check_imports", str(tmp_path / "nowhere")]) == 2


def test_a_circle_through_a_package_init_is_found(tmp_path):
    # importing swax.a runs swax/sub/__init__.py first, which imports swax.sub.y -> swax.a
    root = _package(
        tmp_path,
        {
            "a.py": "from .sub.x import f\n",
            "sub/__init__.py": "from . import y\n",
            "sub/x.py": "f = 1\n",
            "sub/y.py": "from ..a import g\n",
        },
    )
    problems = check_imports.check(root)
    assert problems == ["import circle: swax.a <-> swax.sub <-> swax.sub.y"], problems


def test_an_import_under_either_branch_of_not_type_checking_counts(tmp_path):
    body = "from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n    {}\nelse:\n    {}\n"
    runs = body.format("from .a import y", "pass")
    annotation_only = body.format("pass", "from .a import y")
    for i, text in enumerate((runs, annotation_only)):
        root = _package(tmp_path / str(i), {"a.py": "from .b import x\n", "b.py": text})
        assert check_imports.check(root) == ["import circle: swax.a <-> swax.b"]


def test_a_layering_break_through_another_module_names_the_way(tmp_path):
    files = {
        "data/loader.py": "from ..loading import load\n",
        "loading.py": "from .model import M\nload = 1\n",
        "model.py": "class M: ...\n",
    }
    problems = check_imports.check(_package(tmp_path, files))
    assert problems == [
        "swax.data.loader imports model (via loading): data never imports model, "
        "generation, probes, train or eval"
    ], problems


def test_the_studies_keep_their_contract(tmp_path):
    """experiments/: lab imports no study; a study imports lab, itself and the studies it reads
    (STUDY_READS); tests may import any study; and the real studies keep it."""
    assert check_imports.check(ROOT / "experiments") == []
    root = tmp_path / "experiments"
    files = {
        "__init__.py": "",
        "lab/__init__.py": "",
        "lab/stats.py": "from experiments.claims import judge\n",  # lab imports a study
        "claims/__init__.py": "",
        "claims/judge.py": "from experiments.lab import stats\n",
        "claims/report.py": "from experiments.laziness_map import cells\n",  # not declared
        "laziness_map/__init__.py": "",
        "laziness_map/cells.py": "x = 1\n",
        "text_study/__init__.py": "",
        "text_study/readings.py": "from experiments.laziness_map import cells\n",  # declared
        "claims/tests/__init__.py": "",
        "claims/tests/test_x.py": "from experiments.text_study import readings\n",  # a test
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    problems = check_imports.check(root)
    assert len(problems) == 3, problems  # the circle lab <-> claims, and the two rules
    assert any(p.startswith("import circle:") for p in problems)
    assert any(
        "experiments.lab.stats imports claims" in p and "lab imports no" in p for p in problems
    )
    assert any("experiments.claims.report imports laziness_map" in p for p in problems)
