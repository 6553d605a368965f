"""ChatAgentSpec: tool binding, grammar, message ↔ tool-call conversion, streaming, async, metadata."""

from __future__ import annotations

import asyncio

import pytest
from agentspec_langgraph import AgentSpecError, ChatAgentSpec, TurnRecord
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph_fake_engine import ACCEPTANCE, FakeEngine

from agentspec_sdk import TOOL_CALLS, ToolRegistry, get_format, turn_grammar
from agentspec_sdk.backends.types import StreamEvent
from agentspec_sdk.structure.segmenter import LawClass, Span


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


CALL_ADD = '<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'
CALL_MUL = '<tool_call>{"name":"multiply","arguments":{"a":4,"b":5}}</tool_call>'


def model_on(*outputs: str, **kw) -> tuple[ChatAgentSpec, FakeEngine]:
    engine = FakeEngine(list(outputs), **kw)
    return ChatAgentSpec(engine=engine), engine


def test_bind_tools_registers_schemas_and_sets_the_turn_grammar():
    model, engine = model_on(CALL_ADD)
    msg = model.bind_tools([add, multiply]).invoke("What is 2 + 3?")

    assert engine.registered == [["add", "multiply"]]
    request = engine.requests[0]
    assert request.fmt == "tool_calls"
    assert request.tools.names == ["add", "multiply"]
    assert request.grammar == turn_grammar(TOOL_CALLS, ToolRegistry([add, multiply]))
    assert request.messages == [{"role": "user", "content": "What is 2 + 3?"}]

    assert msg.content == ""
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert msg.tool_calls[0]["id"].startswith("call_")


def test_binding_again_does_not_register_twice_and_no_tools_means_no_grammar():
    model, engine = model_on("Hello there.", CALL_ADD, CALL_ADD)
    plain = model.invoke([HumanMessage("hi")])
    assert plain.content == "Hello there." and plain.tool_calls == []
    assert engine.requests[0].grammar == turn_grammar(TOOL_CALLS, ToolRegistry(), tool_choice="none")
    assert len(engine.requests[0].tools) == 0
    model.bind_tools([add]).invoke("x")
    model.bind_tools([add]).invoke("y")
    assert engine.registered == [["add"]]


def test_reasoning_is_content_and_parallel_calls_get_distinct_ids():
    model, _ = model_on(f"I add, then multiply.\n{CALL_ADD}\n{CALL_MUL}")
    msg = model.bind_tools([add, multiply]).invoke("go")
    assert msg.content == "I add, then multiply."
    assert [c["name"] for c in msg.tool_calls] == ["add", "multiply"]
    assert len({c["id"] for c in msg.tool_calls}) == 2


def test_history_is_sent_as_the_model_wrote_it():
    model, engine = model_on(f"Adding.\n{CALL_ADD}", "The sum is 5.")
    bound = model.bind_tools([add])
    first = bound.invoke([SystemMessage("Be brief."), HumanMessage("2+3?")])
    result = ToolMessage("5.0", tool_call_id=first.tool_calls[0]["id"])
    bound.invoke([SystemMessage("Be brief."), HumanMessage("2+3?"), first, result])

    sent = engine.requests[1].messages
    assert sent == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": f"Adding.\n{CALL_ADD}"},
        {"role": "tool", "content": "5.0"},
    ]


def test_edited_tool_calls_are_rendered_in_the_format_not_replayed():
    model, engine = model_on(CALL_ADD, "ok")
    bound = model.bind_tools([add])
    first = bound.invoke("2+3?")
    edited = first.model_copy(update={"tool_calls": [{**first.tool_calls[0], "args": {"a": 7, "b": 1}}]})
    foreign = AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 1}, "id": "x"}])
    bound.invoke([HumanMessage("q"), edited, ToolMessage("8", tool_call_id="x"), foreign])
    sent = [m["content"] for m in engine.requests[1].messages if m["role"] == "assistant"]
    assert sent == [
        '<tool_call>{"name":"add","arguments":{"a":7,"b":1}}</tool_call>',
        '<tool_call>{"name":"add","arguments":{"a":1,"b":1}}</tool_call>',
    ]


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "pythonic", "llama3_json", "gemma_tool_code"])
def test_foreign_tool_calls_are_written_in_the_models_native_syntax(fmt):
    """An AI message from elsewhere (no raw text) goes back in the format's own call syntax, as its
    turn grammar accepts it and its parser reads it back; without bound tools there are no schemas to
    write it by, which is named."""
    from agentspec_sdk import parse_calls, write_calls

    model = ChatAgentSpec(engine=FakeEngine(["ok", "ok"]), fmt=fmt)
    foreign = AIMessage("Adding.", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "x"}])
    history = [HumanMessage("1+2?"), foreign, ToolMessage("3", tool_call_id="x")]
    model.bind_tools([add, multiply]).invoke(history)
    [sent] = [m["content"] for m in model.engine.requests[0].messages if m["role"] == "assistant"]
    call = write_calls(get_format(fmt), [("add", {"a": 1, "b": 2})], ToolRegistry([add, multiply]))
    assert sent == f"Adding.\n{call}"
    read = [(c.name, dict(c.arguments)) for c in parse_calls(get_format(fmt), call)]
    assert read == [("add", {"a": 1, "b": 2})]
    with pytest.raises(AgentSpecError, match=rf"format '{fmt}': writing .* not bound: \['add'\]"):
        model.bind_tools([multiply]).invoke(history)


def test_usage_and_acceptance_per_class_are_reported_and_recorded():
    records: list[TurnRecord] = []
    engine = FakeEngine([CALL_ADD])
    model = ChatAgentSpec(engine=engine, agent_id="a1", recorder=records.append)
    msg = model.bind_tools([add]).invoke("2+3?")
    usage = msg.usage_metadata
    assert usage["output_tokens"] == len(CALL_ADD) // 3 + 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    assert msg.response_metadata["acceptance"] == ACCEPTANCE
    assert msg.response_metadata["finish_reason"] == "stop"
    assert engine.requests[0].agent_id == "a1"
    [rec] = records
    assert (rec.agent_id, rec.tool_calls, rec.acceptance) == ("a1", ("add",), ACCEPTANCE)


def _aggregate(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    return total


def test_stream_gives_content_deltas_then_whole_tool_calls_and_matches_invoke():
    text = f"  Let me add these.\n{CALL_ADD}\n{CALL_MUL}\n"
    model, _ = model_on(text, text)
    bound = model.bind_tools([add, multiply])
    chunks = list(bound.stream("go"))
    full = bound.invoke("go")

    content = [c.content for c in chunks if c.content]
    assert len(content) > 1 and "".join(content) == full.content == "Let me add these."
    assert [tc["name"] for c in chunks for tc in c.tool_call_chunks] == ["add", "multiply"]
    total = _aggregate(chunks)
    assert ([(c["name"], c["args"]) for c in total.tool_calls]
            == [(c["name"], c["args"]) for c in full.tool_calls])
    assert total.usage_metadata == full.usage_metadata
    assert total.response_metadata["acceptance"] == ACCEPTANCE


class LabelledEngine(FakeEngine):
    """Answers `text` with the given segment labels, in the stream's events and the result's spans."""

    def __init__(self, labels: list[tuple[str, str]]):
        super().__init__(["".join(piece for piece, _ in labels)] * 2)
        self.labels, self.spans, at = labels, [], 0
        for piece, law_class in labels:
            self.spans.append(Span(at, at + len(piece), "call" if law_class == "S" else "prose",
                                   LawClass(law_class)))
            at += len(piece)

    def _result(self, request):
        result = super()._result(request)
        result.spans = self.spans
        return result

    def stream(self, request):
        result = self._result(request)
        for piece, law_class in self.labels:
            yield StreamEvent(piece, "call" if law_class == "S" else "prose", law_class)
        yield StreamEvent("", "", "", result=result)


def test_stream_content_follows_the_engines_segment_labels():
    """The content is what the engine labelled outside S, in the stream (each event's `law_class`)
    and in the result (`spans`): the chat model does not segment the text a second time, so text
    the engine counts as a call is not content even where a second segmentation would say prose."""
    model = ChatAgentSpec(engine=LabelledEngine([("Sure. ", "F"), ("[add 2 3]", "S"), (" Done.", "F")]))
    streamed = "".join(c.content for c in model.stream("go"))
    assert streamed == "Sure.  Done." == model.invoke("go").content


def test_a_stream_without_labels_is_cut_by_the_results_segments():
    """A remote turn replayed from its ledger streams its text in one unlabelled event: held, then cut
    by the result's spans; the same content as invoke and as the labelled stream."""
    text = f"  Let me add.\n{CALL_ADD}\n"
    for unlabelled in (True, False):
        model, _ = model_on(text, text, unlabelled=unlabelled)
        bound = model.bind_tools([add])
        chunks = list(bound.stream("go"))
        assert "".join(c.content for c in chunks) == bound.invoke("go").content == "Let me add."
        assert [tc["name"] for c in chunks for tc in c.tool_call_chunks] == ["add"]


def test_async_invoke_and_stream():
    model, engine = model_on(CALL_MUL, f"Multiplying.{CALL_MUL}")
    bound = model.bind_tools([multiply])

    async def run():
        msg = await bound.ainvoke("4*5?")
        chunks = [c async for c in bound.astream("4*5?")]
        return msg, chunks

    msg, chunks = asyncio.run(run())
    assert msg.tool_calls[0]["args"] == {"a": 4, "b": 5}
    total = _aggregate(chunks)
    assert total.content == "Multiplying."
    assert total.tool_calls[0]["name"] == "multiply"
    assert len(engine.requests) == 2


def test_a_call_cut_at_max_tokens_is_an_invalid_tool_call_not_a_crash():
    model, _ = model_on('<tool_call>{"name":"add","argum', finish_reason="length")
    msg = model.bind_tools([add]).invoke("2+3?")
    assert msg.tool_calls == []
    [bad] = msg.invalid_tool_calls
    assert "max_tokens" in bad["error"]


def test_tool_choice_maps_to_the_turn_grammar():
    model, engine = model_on(CALL_MUL, CALL_MUL, CALL_MUL, "no call")
    both = ToolRegistry([add, multiply])
    model.bind_tools([add, multiply], tool_choice="multiply").invoke("x")
    assert engine.requests[0].tools.names == ["multiply"]
    assert engine.requests[0].grammar == turn_grammar(TOOL_CALLS, ToolRegistry([multiply]),
                                                      tool_choice="required")
    model.bind_tools([add, multiply], tool_choice="any").invoke("x")
    assert engine.requests[1].grammar == turn_grammar(TOOL_CALLS, both, tool_choice="required")
    model.bind_tools([add, multiply], tool_choice="auto").invoke("x")
    assert engine.requests[2].grammar == turn_grammar(TOOL_CALLS, both, tool_choice="auto")
    model.bind_tools([add, multiply], tool_choice="none").invoke("x")
    assert engine.requests[3].grammar == turn_grammar(TOOL_CALLS, ToolRegistry(), tool_choice="none")
    assert len(engine.requests[3].tools) == 0
    with pytest.raises(AgentSpecError, match="'divide', which is not bound"):
        model.bind_tools([add], tool_choice="divide")


def test_bad_settings_and_stop_sequences_are_named():
    model, _ = model_on(CALL_ADD)
    with pytest.raises(AgentSpecError, match=r"unknown settings \['temprature'\]"):
        model.bind_tools([add], temprature=0.3)
    with pytest.raises(AgentSpecError, match="stop sequences"):
        model.invoke("x", stop=["\n"])


def test_tools_that_are_not_langchain_tools_register_by_hand():
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    registry = ToolRegistry()
    registry.add(divide)
    registry.add({"type": "function", "function": {"name": "negate", "description": "Negate x.",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"x": {"type": "number"}},
                                                                  "required": ["x"]}}})
    model, engine = model_on('<tool_call>{"name":"negate","arguments":{"x":3}}</tool_call>')
    msg = model.bind_tools(registry.tools).invoke("negate 3")
    assert engine.registered == [["divide", "negate"]]
    assert msg.tool_calls[0]["name"] == "negate" and msg.tool_calls[0]["args"] == {"x": 3}
    assert engine.requests[0].tools.names == ["divide", "negate"]


def test_unknown_tool_name_cannot_be_produced_under_the_grammar():
    model, _ = model_on()
    accepted = _matcher_accepts(model.grammar_for(model.bind_tools([add, multiply]).kwargs["tools"]))
    assert accepted(CALL_ADD)
    assert not accepted('<tool_call>{"name":"delete_everything","arguments":{}}</tool_call>')
    assert not accepted('<tool_call>{"name":"add","arguments":{"a":"two","b":3}}</tool_call>')


def test_react_turns_become_tool_calls_and_history_is_rendered_in_react():
    engine = FakeEngine(['Thought: I need the sum.\nAction: add\nAction Input: {"a":1,"b":2}\n',
                         "Final Answer: 3"])
    bound = ChatAgentSpec(engine=engine, fmt="react").bind_tools([add])
    first = bound.invoke("1+2?")
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("add", {"a": 1, "b": 2})]
    assert first.content == "Thought: I need the sum."
    assert engine.requests[0].grammar == turn_grammar(get_format("react"), ToolRegistry([add]))
    foreign = AIMessage("I add.", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "x"}])
    bound.invoke([HumanMessage("1+2?"), foreign, ToolMessage("3", tool_call_id="x")])
    assert (engine.requests[1].messages[1]["content"]
            == 'Thought: I add.\nAction: add\nAction Input: {"a":1,"b":2}\n')


def _matcher_accepts(grammar: str):
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model()))
    tokenizer = llguidance.hf.from_tokenizer(hf)

    def accepted(text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
        ids = hf.encode(text, add_special_tokens=False)
        return matcher.try_consume_tokens(ids) == len(ids)

    return accepted


def test_reasoning_false_makes_a_required_turn_the_call_only():
    model = ChatAgentSpec(engine=FakeEngine(), reasoning=False)
    tools = model.bind_tools([add, multiply]).kwargs["tools"]
    assert model.grammar_for(tools, "auto") == turn_grammar(TOOL_CALLS, ToolRegistry([add, multiply]))
    accepted = _matcher_accepts(model.grammar_for(tools, "required"))
    assert accepted(CALL_MUL)
    assert not accepted("Let me think. " + CALL_MUL)
    assert not accepted(CALL_MUL + CALL_ADD)
    with pytest.raises(AgentSpecError, match="reasoning=False needs a tool-call format .*not 'react'"):
        ChatAgentSpec(engine=FakeEngine(), fmt="react", reasoning=False).grammar_for(tools, "required")


def test_fmt_auto_is_the_engines_format_resolved_once():
    """fmt="auto" (the default) asks the engine (its model's template) once; the turns then run in
    that format. An engine that cannot tell (no resolve_format) is refused with the reason."""
    engine = FakeEngine(['Thought: add\nAction: add\nAction Input: {"a":2,"b":3}'], native="react")
    model = ChatAgentSpec(engine=engine)
    assert model.fmt == "react" and engine.asked == ["auto"]
    msg = model.bind_tools([add]).invoke("What is 2 + 3?")
    assert engine.requests[0].fmt == "react" and msg.tool_calls[0]["args"] == {"a": 2, "b": 3}
    assert ChatAgentSpec(engine=FakeEngine()).fmt == "tool_calls"  # a template without tool syntax
    named = FakeEngine(native="hermes")
    assert ChatAgentSpec(engine=named, fmt="react").fmt == "react" and named.asked == []
    with pytest.raises(AgentSpecError, match=r"fmt='auto' \(the default\) needs an engine that knows"):
        ChatAgentSpec(engine=object())


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "pythonic", "llama3_json", "gemma_tool_code"])
def test_reasoning_false_takes_any_call_syntax_format(fmt):
    from agentspec_sdk.structure.call_syntax import write_calls

    model = ChatAgentSpec(engine=FakeEngine(), fmt=fmt, reasoning=False)
    tools = model.bind_tools([add, multiply]).kwargs["tools"]
    registry = ToolRegistry([add, multiply])
    accepted = _matcher_accepts(model.grammar_for(tools, "required"))
    call = write_calls(get_format(fmt), [("multiply", {"a": 6, "b": 7})], registry)
    assert accepted(call)
    assert not accepted("Let me think. " + call)
    two = [("multiply", {"a": 6, "b": 7}), ("add", {"a": 1, "b": 2})]
    assert not accepted(write_calls(get_format(fmt), two, registry))
