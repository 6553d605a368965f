"""The house's size rule on the source (scripts/sizes.py): no class over 300 lines, no function over 80."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sizes.py"


def _sizes():
    spec = importlib.util.spec_from_file_location("sizes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_class_over_300_lines_no_function_over_80():
    sizes = _sizes()
    assert sizes.oversized(list(sizes.DEFAULT_PATHS), 300, 80) == []


def test_the_rule_finds_an_oversized_function(tmp_path):
    sizes = _sizes()
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (tmp_path / "big.py").write_text(f"def big():\n{body}\n")
    [found] = sizes.oversized([tmp_path], 300, 80)
    assert found.endswith("function big 82")
