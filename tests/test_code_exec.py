"""Sandboxed execution of model-written code (swax.eval.code_exec)."""

import os
from pathlib import Path

import pytest

from swax.eval.code_exec import landlock_abi, run_program, run_programs

README = Path(__file__).resolve().parents[1] / "README.md"
LANDLOCK = landlock_abi()

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"


def test_correct_solution_passes_wrong_one_fails():
    ok = run_program(SOLUTION + TESTS)
    assert ok.passed and ok.status == "passed" and ok.returncode == 0
    bad = run_program("def add(a, b):\n    return a - b\n" + TESTS)
    assert not bad.passed and bad.status == "failed"
    assert bad.detail.startswith("AssertionError")
    syntax = run_program("def add(a, b) return a\n" + TESTS)
    assert not syntax.passed and "SyntaxError" in syntax.detail


def test_infinite_loop_is_killed_by_the_timeout():
    res = run_program(SOLUTION + "while True:\n    pass\n" + TESTS, timeout=1.5)
    assert res.status == "timeout" and not res.passed
    assert res.seconds < 10
    res = run_program("import time\ntime.sleep(60)\n", timeout=1.0)
    assert res.status == "timeout"


def test_memory_bomb_is_stopped():
    res = run_program("x = bytearray(16 * 2**30)\n", memory_mb=512)
    assert not res.passed and "MemoryError" in res.detail
    res = run_program("x = [0] * 10**9\n", memory_mb=512)
    assert not res.passed and "MemoryError" in res.detail


def test_exiting_early_is_not_a_pass():
    for early in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "exit()\n"):
        res = run_program(SOLUTION + early + TESTS)
        assert not res.passed, early


@pytest.mark.parametrize("landlock", [True, False], ids=["landlock", "python-guard-only"])
def test_cannot_touch_files_outside_its_folder(tmp_path, landlock):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    sentinel = repo / "sentinel.txt"
    sentinel.write_text("keep me")
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    readme = README.read_bytes()
    attacks = [
        f"open({str(README)!r}, 'a').write('pwned')",
        f"open({str(sentinel)!r}, 'w').write('pwned')",
        f"import pathlib; pathlib.Path({str(sentinel)!r}).write_text('pwned')",
        f"import os; os.remove({str(sentinel)!r})",
        f"import os; os.unlink({str(sentinel)!r})",
        f"import os; os.rename({str(sentinel)!r}, 'stolen.txt')",
        f"import shutil; shutil.move({str(sentinel)!r}, 'stolen.txt')",
        f"import shutil; shutil.rmtree({str(repo / 'pkg')!r})",
        f"import os; os.truncate({str(sentinel)!r}, 0)",
        f"import os; os.chmod({str(sentinel)!r}, 0)",
        f"import os; os.mkdir({str(repo / 'new')!r})",
        f"import os; fd = os.open({str(sentinel)!r}, os.O_WRONLY | os.O_TRUNC)",
        f"import io; io.FileIO({str(sentinel)!r}, 'w')",
        f"import posix; posix.unlink({str(sentinel)!r})",
        f"import os; os.symlink({str(sentinel)!r}, 'link'); open('link', 'w').write('pwned')",
        f"import os; os.link({str(sentinel)!r}, 'hard'); open('hard', 'w').write('pwned')",
        f"import os; os.chdir({str(repo)!r}); open('sentinel.txt', 'w')",
        f"import os; d = os.open({str(repo)!r}, os.O_RDONLY); os.unlink('sentinel.txt', dir_fd=d)",
        f"import subprocess; subprocess.run(['rm', '-f', {str(sentinel)!r}])",
        f"import os; os.system('rm -f {sentinel}')",
        "import os; os.fork()",
        "import ctypes",
    ]
    results = run_programs([a + "\n" for a in attacks], workers=2, landlock=landlock)
    for attack, res in zip(attacks, results):
        assert not res.passed, attack
    assert sentinel.read_text() == "keep me"
    assert (repo / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert not (repo / "new").exists()
    assert oct(sentinel.stat().st_mode & 0o777) != "0o0"
    assert README.read_bytes() == readme
    assert sorted(p.name for p in repo.iterdir()) == ["pkg", "sentinel.txt"]


@pytest.mark.skipif(LANDLOCK == 0, reason="Landlock is not available on this kernel")
def test_landlock_blocks_writes_from_c_code(tmp_path):
    """sqlite3 creates its file in C, below the Python guard: only the kernel rule stops it."""
    target = tmp_path / "evil.db"
    res = run_program(
        f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')\n"
    )
    assert not res.passed and res.landlock_abi == LANDLOCK
    assert not target.exists()


def test_writes_inside_its_folder_work():
    program = """
import os, shutil, tempfile, pathlib
open('a.txt', 'w').write('hello')
assert open('a.txt').read() == 'hello'
pathlib.Path('d/e').mkdir(parents=True)
pathlib.Path('d/e/f.txt').write_text('x')
os.rename('a.txt', 'd/b.txt')
shutil.copy('d/b.txt', 'c.txt')
shutil.rmtree('d')
os.remove('c.txt')
fd, name = tempfile.mkstemp()
os.close(fd)
os.unlink(name)
with tempfile.TemporaryDirectory() as t:
    open(os.path.join(t, 'x'), 'w').write('y')
print('some output')
"""
    res = run_program(program)
    assert res.passed, res.detail


def test_runs_in_a_fresh_folder_with_a_minimal_environment(monkeypatch):
    monkeypatch.setenv("SWAX_TEST_SECRET", "s3cret")
    program = f"""
import os, sys, tempfile
assert 'SWAX_TEST_SECRET' not in os.environ, 'environment leaked'
cwd = os.getcwd()
assert cwd != {os.getcwd()!r}
assert os.listdir('.') == ['program.py'], os.listdir('.')
assert os.environ['HOME'] == cwd and tempfile.gettempdir() == cwd
"""
    res = run_program(program)
    assert res.passed, res.detail
    first = run_program("open('left.txt', 'w').write('x')\n")
    second = run_program("import os\nassert not os.path.exists('left.txt')\n")
    assert first.passed and second.passed


def test_run_programs_keeps_order():
    programs = [f"assert {i} % 2 == 0\n" for i in range(6)]
    seen = []
    results = run_programs(programs, workers=3, on_done=lambda i, r: seen.append(i))
    assert [r.passed for r in results] == [True, False, True, False, True, False]
    assert sorted(seen) == list(range(6))
    assert os.path.exists(README)
