"""tools/check_sizes.py: the package keeps its size limits, and the check finds a file or a
function over them."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("check_sizes", ROOT / "tools" / "check_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_keeps_its_size_limits():
    assert _tool().problems(ROOT / "swax") == []


def test_a_long_file_and_a_long_function_are_found(tmp_path):
    tool = _tool()
    lines = [f"    x{i} = {i}" for i in range(tool.MAX_FUNCTION_LINES)]
    # f: its def, 85 lines and a return (87); g: its def and 84 lines (85, the limit)
    (tmp_path / "long_function.py").write_text("def f():\n" + "\n".join(lines) + "\n    return 0\n")
    (tmp_path / "fits.py").write_text("def g():\n" + "\n".join(lines[:-1]) + "\n")
    (tmp_path / "long_file.py").write_text("x = 1\n" * (tool.MAX_FILE_LINES + 1))
    found = tool.problems(tmp_path)
    assert len(found) == 2, found
    assert "function f has 87 lines" in found[1] or "function f has 87 lines" in found[0]
    assert any("long_file.py: 501 lines" in line for line in found)
    assert tool.main([str(tmp_path)]) == 1
