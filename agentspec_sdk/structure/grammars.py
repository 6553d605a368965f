"""Shipped `.lark` grammars, loaded by name.

In a wheel they live in the package `agentspec_sdk.grammars` (the repo's top-level `grammars/`
mapped in pyproject.toml); in a source checkout that package may not be importable, so the
top-level folder is read directly.
"""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[2] / "grammars"


def load_grammar(name: str) -> str:
    """Text of the shipped grammar `name` (with or without the `.lark` suffix)."""
    stem = name[:-5] if name.endswith(".lark") else name
    if not re.fullmatch(r"[A-Za-z0-9_-]+", stem):
        raise ValueError(f"grammar name {name!r} must match [A-Za-z0-9_-]+")
    filename = f"{stem}.lark"
    try:
        packaged = importlib.resources.files("agentspec_sdk.grammars") / filename
        if packaged.is_file():
            return packaged.read_text(encoding="utf-8")
    except ModuleNotFoundError:
        pass
    source = SOURCE_DIR / filename
    if source.is_file():
        return source.read_text(encoding="utf-8")
    raise FileNotFoundError(f"no grammar named {stem!r} in agentspec_sdk.grammars or {SOURCE_DIR}")


def grammar_names() -> list[str]:
    """Names of the shipped grammars."""
    names: set[str] = set()
    try:
        names |= {p.name[:-5] for p in importlib.resources.files("agentspec_sdk.grammars").iterdir()
                  if p.name.endswith(".lark")}
    except ModuleNotFoundError:
        pass
    if SOURCE_DIR.is_dir():
        names |= {p.stem for p in SOURCE_DIR.glob("*.lark")}
    return sorted(names)
