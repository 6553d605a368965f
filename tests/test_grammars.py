"""Shipped grammars load by name (package data or the source checkout's grammars/ folder)."""

from __future__ import annotations

import pytest

from agentspec_sdk.structure import grammars


def test_every_shipped_grammar_loads_by_name():
    for name in grammars.grammar_names():
        text = grammars.load_grammar(name)
        assert text == grammars.load_grammar(f"{name}.lark")
        assert text == (grammars.SOURCE_DIR / f"{name}.lark").read_text(encoding="utf-8")


def test_source_checkout_fallback(tmp_path, monkeypatch):
    (tmp_path / "demo.lark").write_text('start: "x"\n')
    monkeypatch.setattr(grammars, "SOURCE_DIR", tmp_path)
    assert "demo" in grammars.grammar_names()
    assert grammars.load_grammar("demo") == 'start: "x"\n'


def test_unknown_or_bad_names_are_clear_errors():
    with pytest.raises(FileNotFoundError, match="no grammar named 'nope'"):
        grammars.load_grammar("nope")
    with pytest.raises(ValueError, match="must match"):
        grammars.load_grammar("../etc/passwd")
