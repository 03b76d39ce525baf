"""The regime study's scripts (experiments/regime_study/NAME.py) as modules for the tests."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "experiments" / "regime_study"


def script(name: str):
    """experiments/regime_study/NAME.py as a module (its folder importable, as when run)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location(f"regime_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
