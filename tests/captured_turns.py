"""The captured agent turns of tests/data (`*.capture.jsonl`, capture format v1, docs/capture.md) as the
offline replay reads them: `benchmarks/offline_drafting.load_turns`, `{"turns", "grammars", "tools"}`
(each turn `{prompt, out, grammar (an index into grammars; absent: none), fmt}`)."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SETS = ("tool_calls", "react", "code")


@cache
def offline_drafting():
    """benchmarks/offline_drafting.py, loaded by path (the benchmarks are scripts, not a package)."""
    script = ROOT / "benchmarks" / "offline_drafting.py"
    spec = importlib.util.spec_from_file_location("offline_drafting", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def captured(name: str) -> dict:
    """One bundled set (`SETS`), fresh (callers may label or edit its turns)."""
    return offline_drafting().load_turns(DATA / f"{name}.capture.jsonl")
