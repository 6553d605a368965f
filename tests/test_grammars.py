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


def test_json_grammar_is_the_compilers_any_value_grammar_and_parses_json():
    import json

    import lark

    from agentspec_sdk import compile_schema

    text = grammars.load_grammar("json")
    assert text.split("\n", 3)[3] == compile_schema({})
    parser = lark.Lark(text, start="start")
    for value in [{"a": [1, 2.5, None, True]}, "x\"y", [], {}, -3e5]:
        parser.parse(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    with pytest.raises(lark.exceptions.LarkError):
        parser.parse('{"a": 1}')  # not compact


def test_wheel_ships_the_grammars(tmp_path):
    import subprocess
    import sys
    import zipfile

    root = grammars.SOURCE_DIR.parent
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(root)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    [wheel] = tmp_path.glob("agentspec_sdk-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in grammars.grammar_names():
        assert f"agentspec_sdk/grammars/{name}.lark" in names
    assert not any(n.startswith("integrations/") for n in names)
    assert any(n.startswith("agentspec_sdk/drafting/_trees.") for n in names)  # the compiled trees
    assert any(n.startswith("agentspec_sdk/drafting/_lookup.") for n in names)  # and the lookup
