"""Names the export package gave up (issue 61): the old import path works for one release and
warns; swax itself uses the new one."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import swax


def test_export_loading_is_export_inference_with_a_warning(monkeypatch):
    from swax.export.inference import load_model_and_tokenizer

    monkeypatch.delitem(sys.modules, "swax.export.loading", raising=False)
    with pytest.warns(DeprecationWarning, match="swax.export.inference"):
        old = importlib.import_module("swax.export.loading")
    assert old.load_model_and_tokenizer is load_model_and_tokenizer


def test_swax_does_not_import_the_old_name():
    root = Path(swax.__file__).parent
    users = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "swax.export.loading" in p.read_text() and p.name != "loading.py"
    ]
    assert users == []
