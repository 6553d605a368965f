"""BFCL in one module (agentspec_sdk.bfcl): data access, schema normalisation, environments, one error."""

import pkgutil

import pytest

from agentspec_sdk import bfcl
from agentspec_sdk.errors import AgentSpecError, BfclDataError, InvalidSchema


def test_missing_bfcl_eval_raises_one_error_for_every_lookup(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(bfcl.resources, "files", missing)
    for lookup in (lambda: bfcl.load_category("simple_python"), lambda: bfcl.multi_turn_entries("base"),
                   lambda: bfcl.class_docs("MathAPI"), lambda: bfcl.tool_call_prompts(2),
                   lambda: bfcl.read_jsonl("BFCL_v4_multiple.json")):
        with pytest.raises(BfclDataError,
                           match=r"needs the bfcl-eval package \(pip install --no-deps bfcl-eval\)"):
            lookup()


def test_unknown_file_category_or_class_names_it():
    with pytest.raises(BfclDataError, match="'BFCL_v4_multi_turn_nope.json' not found"):
        bfcl.multi_turn_entries("nope")
    with pytest.raises(BfclDataError, match="'BFCL_v4_nope.json' not found"):
        bfcl.load_category("nope")
    with pytest.raises(BfclDataError, match=r"unknown BFCL class 'Teleporter'; known: \['GorillaFileSystem'"):
        bfcl.class_docs("Teleporter")
    with pytest.raises(BfclDataError, match="unknown BFCL class 'Teleporter'"):
        bfcl.BfclEnvironment({}, ["Teleporter"])
    assert issubclass(BfclDataError, AgentSpecError)


def test_bfcl_names_have_one_home():
    # the old re-export modules are gone: every BFCL name is imported from agentspec_sdk.bfcl
    import agentspec_sdk

    modules = {m.name for m in pkgutil.walk_packages(agentspec_sdk.__path__, "agentspec_sdk.")}
    assert "agentspec_sdk.bfcl" in modules and "agentspec_sdk.replay.loop" in modules
    assert not modules & {"agentspec_sdk.bfcl_data", "agentspec_sdk.structure.bfcl_schema",
                          "agentspec_sdk.replay.bfcl"}
    for name in ("BfclPrompt", "load_category", "tool_call_prompts", "normalise_bfcl_schema",
                 "BfclEnvironment", "ToolRun", "entry_tools", "multi_turn_entries", "openai_tool",
                 "read_jsonl", "system_prompt", "is_long_context", "class_docs"):
        assert getattr(bfcl, name).__module__ == "agentspec_sdk.bfcl", name
    assert BfclDataError.__module__ == "agentspec_sdk.errors"
    import agentspec_sdk.structure.tools as tools

    assert not hasattr(tools, "normalise_bfcl_schema")  # tools know nothing of BFCL


def test_both_schema_forms_share_one_type_map():
    doc = {"type": "dict", "properties": {"n": {"type": "long", "description": "count"},
                                          "xs": {"type": "tuple", "items": {"type": "float"}},
                                          "v": {"type": "any"},
                                          "flag": {"type": "Boolean", "optional": True}},
           "required": ["n"]}
    full, compact = bfcl.normalise_bfcl_schema(doc), bfcl.to_json_schema(doc)
    for out in (full, compact):
        assert out["type"] == "object"
        assert out["properties"]["n"]["type"] == "integer"
        assert out["properties"]["xs"] == {"type": "array", "items": {"type": "number"}}
        assert out["properties"]["v"] == {}
        assert out["properties"]["flag"]["type"] == "boolean"
    assert "optional" not in full["properties"]["flag"] and "optional" not in compact["properties"]["flag"]
    assert bfcl.to_json_schema({"type": "dict", "properties": {}}) == {"type": "object", "properties": {},
                                                                       "required": []}
    with pytest.raises(InvalidSchema, match=r"unknown BFCL type 'quaternion' \(at /properties/q/type\)"):
        bfcl.to_json_schema({"type": "dict", "properties": {"q": {"type": "quaternion"}}})
    with pytest.raises(BfclDataError, match=r"BFCL function 'rotate': unknown BFCL type 'quaternion'"):
        bfcl.openai_tool({"name": "rotate", "parameters": {"type": "dict",
                                                           "properties": {"q": {"type": "quaternion"}}}})


def test_system_prompt_is_the_same_for_every_entry():
    assert bfcl.system_prompt() == bfcl.SYSTEM_PROMPT
    with pytest.raises(TypeError):
        bfcl.system_prompt([{"type": "function"}])  # the tool list is the engine's part of the prompt


def test_real_single_turn_prompts_carry_json_schema_tools_and_ground_truth():
    prompts = bfcl.load_category("simple_python")
    assert len(prompts) > 100
    p = prompts[0]
    assert p.messages[0]["role"] == "user" and p.ground_truth
    assert all(t["function"]["parameters"]["type"] == "object" for t in p.tools)
    assert p.registry().names == [t["function"]["name"] for t in p.tools]
    mixed = bfcl.tool_call_prompts(6, max_tools=4)
    assert [q.id.rsplit("_", 1)[0] for q in mixed[:3]] == ["simple_python", "multiple", "live_multiple"]
    assert all(0 < len(q.tools) <= 4 for q in mixed)


def test_real_environment_runs_a_class_doc_tool():
    entry = bfcl.multi_turn_entries("base")[0]
    names = {t["function"]["name"] for t in bfcl.entry_tools(entry)}
    env = bfcl.BfclEnvironment(entry["initial_config"], entry["involved_classes"])
    assert names <= set(env.methods)
    run = env.execute("ls", {})
    assert run.ok and "current_directory_content" in run.result
    bad = env.execute("cd", {"folder": "no-such-folder"})
    assert isinstance(bad.result, str) and bad.latency_s >= 0
