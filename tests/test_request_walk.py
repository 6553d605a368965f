"""One conversion per request: the format resolved once where the request comes in, the turn grammar
built once per format, tools and tool choice, and the walk of `Engine.submit` that
`scripts/walk_count.py` counts (issue 47: at most 15 stops in at most 8 modules, no module re-entered
from a lower room)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agentspec_sdk.backends.chat_template import ChatTemplate
from agentspec_sdk.backends.embedded.turn_sampling import TurnSampling
from agentspec_sdk.structure.formats import REACT, TOOL_CALLS, AgentFormat, get_format
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar

SEARCH = {"name": "search", "description": "Search.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                         "required": ["query"]}}
CALC = {"name": "calc", "description": "Add.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}


def _walk_count():
    path = Path(__file__).resolve().parents[1] / "scripts" / "walk_count.py"
    spec = importlib.util.spec_from_file_location("walk_count", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_turn_grammar_is_built_once_per_format_tools_and_choice():
    sampling = TurnSampling()
    one = sampling.turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH]), "auto")
    assert one == turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH]))
    assert sampling.turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH]), "auto") is one  # a new, equal registry
    assert sampling.turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH, CALC]), "auto") == \
        turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH, CALC]))
    assert sampling.turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH]), "none") == \
        turn_grammar(TOOL_CALLS, ToolRegistry([SEARCH]), tool_choice="none")
    assert sampling.turn_grammar(REACT, ToolRegistry([SEARCH]), "auto") == \
        turn_grammar(REACT, ToolRegistry([SEARCH]))
    # a format of the same name with another definition is another format
    other = AgentFormat.from_dict({**TOOL_CALLS.to_dict(), "description": "another definition"})
    assert other.name == TOOL_CALLS.name and other != TOOL_CALLS
    sampling.turn_grammar(other, ToolRegistry([SEARCH]), "auto")
    assert sampling._grammars[TOOL_CALLS.name, ToolRegistry([SEARCH]).key(), "auto"][0] is other


def test_the_registry_names_what_it_lacks_and_keys_its_tools():
    known = ToolRegistry([SEARCH])
    assert [t.name for t in known.missing(ToolRegistry([CALC, SEARCH]))] == ["calc"]
    assert known.missing(ToolRegistry([SEARCH])) == []
    assert ToolRegistry([SEARCH, CALC]).key() == ToolRegistry([SEARCH, CALC]).key()
    assert ToolRegistry([SEARCH, CALC]).key() != ToolRegistry([CALC, SEARCH]).key()  # order is the grammar's


def test_a_format_object_passes_the_template_as_it_is():
    template = ChatTemplate(None)
    assert template.resolve(TOOL_CALLS) is TOOL_CALLS
    assert template.resolve("react") is get_format("react")
    assert template.resolve("auto") is get_format("tool_calls")  # no template: no native syntax


def test_the_walk_counts_stops_modules_reentries_and_climbs():
    wc = _walk_count()

    def imports(a, b):  # the fake graph: formats imports nothing of ours
        return False

    events = []

    def call():
        events.append(1)

    walk, _ = wc.trace(call, imports)
    assert walk.calls == [] and events == [1]  # the test module's own code is not ours
    walk, _ = wc.trace(lambda: get_format("react").kind("action"), imports)
    assert [(c.module, c.function, c.stop) for c in walk.calls] == [
        ("agentspec_sdk.structure.formats", "get_format", True),
        ("agentspec_sdk.structure.formats", "AgentFormat.kind", True)]
    assert walk.reentries == 1 and walk.climbs == 0 and len(walk.modules) == 1


@pytest.mark.engine
def test_the_walk_of_a_second_submit_meets_the_target(engine_off):
    wc = _walk_count()
    second = wc.measure(engine_off)[-1][1]
    assert second.meets_target(), wc.report("second submit", second, show_all=True)
    assert second.stops[0].function == "Engine.submit" and "structure.turn_grammar" not in \
        {c.module.removeprefix("agentspec_sdk.") for c in second.calls}  # the grammar was built once
