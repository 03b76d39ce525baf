"""The size rule of all code (docs/development.md), one rule for every folder of it:

- a file of code (swax/, experiments/, benchmarks/, tools/) at most MAX_FILE_LINES lines, a test
  file (``test_*.py``, ``conftest.py`` or anything under a ``tests/`` folder) at most
  MAX_TEST_FILE_LINES;
- every function, in code and tests alike, at most MAX_FUNCTION_LINES lines;
- ``# fmt: skip`` only on a table: the statement the comment ends (or the decorator) must hold a
  literal table, a list / tuple / set / dict display of at least two rows, each row itself a
  display of literals (constants, names, nested displays); a long call or string kept on one
  line to stay under the limits is a problem. ``# fmt: off`` is never used.

Prints each problem and exits 1 when there is one.

    python tools/check_sizes.py              # swax/, experiments/, benchmarks/, tools/, tests/
    python tools/check_sizes.py DIR [DIR…]   # these folders (a file's kind still picks its limit)
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

MAX_FILE_LINES = 500
MAX_TEST_FILE_LINES = 850
MAX_FUNCTION_LINES = 85
ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("swax", "experiments", "benchmarks", "tools", "tests")

FMT_SKIP_ALLOWED: dict[str, int] = {
    # files that may keep `# fmt: skip` on statements that are not tables (path: how many such
    # lines); empty: every non-table statement is formatted.
}

FMT_SKIP = re.compile(r"#\s*fmt:\s*skip\s*$")
FMT_OFF = re.compile(r"#\s*fmt:\s*off\s*$")
DISPLAYS = (ast.List, ast.Tuple, ast.Set, ast.Dict)


def is_test(path: Path) -> bool:
    """A test file: test_*.py, conftest.py, or any file under a tests/ folder."""
    return path.name.startswith("test_") or path.name == "conftest.py" or "tests" in path.parts


def _literal(node: ast.AST) -> bool:
    """A value a table may hold: a constant (signed, or arithmetic of constants), a name or a
    dotted name, or a display of such values."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.Attribute):
        return _literal(node.value)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and all(
            _literal(v) for v in node.values
        )
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) for e in node.elts)
    return False


def is_table(node: ast.AST | None) -> bool:
    """A literal table: a display of at least two rows, each a display of literals (a dict's
    keys literals too)."""
    if not isinstance(node, DISPLAYS):
        return False
    rows = node.values if isinstance(node, ast.Dict) else node.elts
    keys = node.keys if isinstance(node, ast.Dict) else []
    return (
        len(rows) >= 2
        and all(k is not None and _literal(k) for k in keys)
        and all(isinstance(r, DISPLAYS) and _literal(r) for r in rows)
    )


def _holds_a_table(node: ast.AST) -> bool:
    """What a skipped statement or decorator may be: an assignment, expression or return of a
    table, or a call (a decorator such as pytest's parametrize) whose arguments are literals
    with at least one table among them."""
    value = getattr(node, "value", None) if isinstance(node, ast.stmt) else node
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return)):
        if is_table(value):
            return True
    if isinstance(value, ast.Call):
        args = [*value.args, *(k.value for k in value.keywords)]
        return any(is_table(a) for a in args) and all(_literal(a) for a in args)
    return False


def _skip_lines(text: str) -> tuple[list[int], list[int]]:
    """The line numbers of the ``# fmt: skip`` and of the ``# fmt: off`` comments."""
    skips, offs = [], []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            if FMT_SKIP.search(tok.string):
                skips.append(tok.start[0])
            elif FMT_OFF.search(tok.string):
                offs.append(tok.start[0])
    return skips, offs


def fmt_skip_problems(text: str, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each ``# fmt: skip`` that is not on a table, and each ``# fmt: off``."""
    skips, offs = _skip_lines(text)
    ending: dict[int, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            ending.setdefault(node.end_lineno, []).append(node)
        for dec in getattr(node, "decorator_list", ()):
            ending.setdefault(dec.end_lineno, []).append(dec)
    out = []
    for line in skips:
        nodes = ending.get(line, [])
        if not any(_holds_a_table(n) for n in nodes):
            out.append((line, "`# fmt: skip` on a statement that is not a table"))
    out += [(line, "`# fmt: off` (format it, or keep a table with `# fmt: skip`)") for line in offs]
    return out


def _relative(path: Path, base: Path) -> str:
    full = path.resolve()
    return full.relative_to(base).as_posix() if full.is_relative_to(base) else str(path)


def problems(root: Path, base: Path = ROOT) -> list[str]:
    """One line per file or function of ``root`` (recursively) over its limit, and per
    ``# fmt: skip`` line that holds no table (beyond a file's allowance in FMT_SKIP_ALLOWED)."""
    out = []
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
        text = path.read_text(encoding="utf-8")
        rel = _relative(path, base)
        limit = MAX_TEST_FILE_LINES if is_test(path) else MAX_FILE_LINES
        n = len(text.splitlines())
        if n > limit:
            kind = "a test file" if is_test(path) else "a file"
            out.append(f"{path}: {n} lines ({kind} has at most {limit})")
        tree = ast.parse(text, str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(
                        f"{path}:{node.lineno}: function {node.name} has {lines} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
        skipped = fmt_skip_problems(text, tree)
        allowed = FMT_SKIP_ALLOWED.get(rel, 0)
        if len(skipped) > allowed:
            out += [f"{path}:{line}: {what}" for line, what in skipped]
            if allowed:
                out.append(
                    f"{path}: {len(skipped)} such lines, {allowed} allowed (FMT_SKIP_ALLOWED)"
                )
    return out


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [ROOT / f for f in FOLDERS]
    found = [line for root in roots for line in problems(root)]
    for line in found:
        print(line)
    files = sum(1 for r in roots for _ in (r.rglob("*.py") if r.is_dir() else [r]))
    print(f"check_sizes: {files} files, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
