"""A trace replays in the format it was recorded in: another format, or a mix where one format is
asked for (`fmt`, a trace file of an arm), is a TraceError. Episodes of several formats without `fmt`
replay together, each in its own (tests/test_code_agent.py's real-engine replay)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentspec_sdk.errors import TraceError
from agentspec_sdk.replay.replayer import replay
from agentspec_sdk.replay.trace import bundled_traces, check_formats, load_traces
from agentspec_sdk.structure.formats import get_format


def test_a_trace_in_another_format_is_an_error_naming_both():
    episodes = load_traces(bundled_traces("tool_calls"), limit=2)
    assert check_formats(episodes) == "tool_calls" == check_formats(episodes, "tool_calls")
    with pytest.raises(TraceError, match=r"in format 'tool_calls'.*cannot be replayed in format 'react'"):
        check_formats(episodes, "react")
    mixed = episodes + load_traces(bundled_traces("react"), limit=1)
    with pytest.raises(TraceError, match=r"mix agent formats 'react' \(e.g. episode .*\), 'tool_calls'"):
        check_formats(mixed)


def test_replay_refuses_before_any_turn_runs():
    """`replay(fmt=)` asks the engine what the name (or "auto") stands for, then refuses: no turn is
    submitted (the fake engine would fail the test if one were)."""

    class Engine:
        def resolve_format(self, fmt):
            return get_format("react" if fmt == "auto" else fmt)

        def submit(self, req):
            raise AssertionError("a turn ran")

    episodes = load_traces(bundled_traces("tool_calls"), limit=1)
    with pytest.raises(TraceError, match="cannot be replayed in format 'react'"):
        replay(Engine(), episodes, tokenizer=None, fmt="auto")


def test_replay_command_names_the_mismatch(tmp_path):
    from agentspec_sdk.replay.cli import app

    out = CliRunner().invoke(app(), ["replay", str(bundled_traces("react")), "--format", "tool_calls",
                                     "--out", str(tmp_path)])
    assert out.exit_code == 2 and "recorded in format 'react'" in out.output, out.output


def test_replay_with_a_format_refuses_a_mix():
    class Engine:
        def resolve_format(self, fmt):
            return get_format(fmt)

        def submit(self, req):
            raise AssertionError("a turn ran")

    mixed = load_traces(bundled_traces("tool_calls"), limit=1) + load_traces(bundled_traces("react"), limit=1)
    with pytest.raises(TraceError, match="mix agent formats"):
        replay(Engine(), mixed, tokenizer=None, fmt="react")
