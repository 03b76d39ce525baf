"""The size limits of the package (docs/development.md): every file of ``swax/`` at most
MAX_FILE_LINES lines and every function at most MAX_FUNCTION_LINES. Prints each file or
function over its limit and exits 1 when there is one.

    python tools/check_sizes.py [ROOT]      # ROOT: the package folder (default swax/)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 85


def problems(root: Path) -> list[str]:
    """One line per file or function of ``root`` (recursively) over its limit."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        if n > MAX_FILE_LINES:
            out.append(f"{path}: {n} lines (at most {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(
                        f"{path}:{node.lineno}: function {node.name} has {lines} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "swax"
    found = problems(root)
    for line in found:
        print(line)
    print(f"check_sizes: {sum(1 for _ in root.rglob('*.py'))} files, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
