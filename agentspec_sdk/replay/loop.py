"""The agent loop shared by the recorder and the replayer.

Per user message the agent generates assistant turns under its per-turn grammar; every tool call
it writes is answered by an `Observer` (the real tool when recording, the trace when replaying),
with the agent marked idle on the engine while the tool "runs".
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentspec_sdk.replay.trace import Episode, Turn
from agentspec_sdk.structure.token_labels import TokenClassifier, count_labels

if TYPE_CHECKING:
    from agentspec_sdk.backends.contract import AgentEngine

TURN_TIMEOUT_S = 900.0  # a turn the engine never answers fails the run instead of hanging it
CODE_TOOL = "python"  # a code agent's code block is a call of this tool with arguments {"code": …}


@dataclass
class Observation:
    result: str
    latency_s: float
    match: str  # exact | name | executed | missing | real
    done: bool = False  # the environment says the task is solved: the episode ends here


class Observer(Protocol):
    def __call__(self, name: str, arguments: dict, segment: int) -> Observation: ...


@dataclass
class TurnLog:
    """What one assistant turn cost and drafted; the unit the report aggregates."""

    episode: str
    segment: int
    step: int
    text: str
    output_tokens: int
    prompt_tokens: int
    tokens_by_class: dict[str, int]
    acceptance: dict[str, dict[str, int]]
    records: list[dict]
    timings: dict[str, float]
    finish_reason: str | None
    error: str | None
    tool_calls: list[dict] = field(default_factory=list)
    matches: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_hash: str = ""
    spec: dict | None = None  # vLLM's per-request spec-decode counters (ngram has no per-class records)
    token_classes: str = ""  # law class of each output token ("SSSR…")
    prompt_ids: list[int] = field(default_factory=list)
    grammar: str = ""  # the request's Lark grammar ("" = none)
    too_long: bool = False  # the prompt + max_tokens did not fit max_model_len: the episode ended here

    def to_dict(self) -> dict:
        return asdict(self)


def is_too_long(error: str | None) -> bool:
    """A turn refused because its prompt does not fit: the embedded engine's errors.PromptTooLong
    ("PromptTooLong: ...") or a vLLM server's 400 ("This model's maximum context length is ...")."""
    from agentspec_sdk.errors import PromptTooLong

    return bool(error) and (error.startswith(PromptTooLong.__name__) or "maximum context length is" in error)


def tool_message(result: str) -> dict:
    """The engine wraps tool messages in the format's environment markers (<tool_response>...)."""
    return {"role": "tool", "content": result}


def parse_calls(fmt: str, text: str) -> list[dict]:
    """Tool calls of a turn as [{"name", "arguments"}] via structure.parse_turn; a call cut off by
    max_tokens (malformed JSON) is not executed. A code agent's code block is one call of
    `CODE_TOOL` with {"code": the block's text}."""
    from agentspec_sdk.structure.turns import TurnParseError, parse_turn

    try:
        parsed = parse_turn(fmt, text)
    except TurnParseError:
        return []
    calls = []
    for call in getattr(parsed, "tool_calls", []) or []:
        name = call["name"] if isinstance(call, dict) else call.name
        args = call.get("arguments", {}) if isinstance(call, dict) else call.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = {}
        calls.append({"name": name, "arguments": args if isinstance(args, dict) else {}})
    if getattr(parsed, "code", None):
        calls.append({"name": CODE_TOOL, "arguments": {"code": parsed.code}})
    return calls


def _hash(ids: Any) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:16]


def tool_choice_policy(step: int, steps: int) -> str:
    """The agent policy of recording and replay, per user message: every assistant turn but the
    last is one tool call written at once ("call"); the last may call a tool or answer ("auto").
    A 135M model given a free "required" turn reasons for hundreds of tokens before it calls."""
    return "call" if step < steps - 1 else "auto"


def call_first_grammar(fmt: str, tools: list[dict]) -> str:
    """One tool call and nothing else: the format's call markers around `tool_call_grammar`."""
    import re

    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turn_grammar import tool_call_grammar

    kind = get_format(fmt).kind("tool_call")
    body = tool_call_grammar(ToolRegistry(list(tools)))
    head = re.match(r"start:\s*(.+)\n", body)
    if head is None:
        raise ValueError("tool_call_grammar returned no start rule")
    return (f"start: {json.dumps(kind.open[0])} ({head.group(1)}) {json.dumps(kind.close[0])}\n"
            + body[head.end():])


THOUGHT_CHARS = 200  # a ReAct turn that must act thinks one line of at most this many characters


def react_call_grammar(fmt: str, tools: list[dict]) -> str:
    """A ReAct turn that must act: `Thought: `, one line of thought (at most THOUGHT_CHARS characters,
    no marker), then `Action:` one of the tools' names, `Action Input:` its arguments; the turn ends
    there (where `Observation:` would begin). The counterpart of `call_first_grammar`: a free Thought
    lets a 135M model talk to max_tokens without ever writing `Action:`."""
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turn_grammar import turn_grammar

    f = get_format(fmt)
    body = turn_grammar(f, ToolRegistry(list(tools)), tool_choice="required")
    head, _, rest = body.partition("\n")
    if not head.startswith("start:"):
        raise ValueError(f"unexpected first line of the ReAct turn grammar: {head!r}")
    markers = sorted((m for k in f.kinds for m in k.open), key=lambda m: (-len(m), m))
    avoid = "|".join(re.escape(m) for m in markers)
    thought = json.dumps(f.kind(f.initial).open[0] + " ")
    action = json.dumps(f.kind("action").open[0])
    return (f'start: {thought} REACT_THOUGHT "\\n" {action} " "? turn_react_call "\\n"?\n{rest}'
            f"REACT_THOUGHT: /[^\\n]{{1,{THOUGHT_CHARS}}}/ & ~/(?s:.*(?:{avoid}).*)/\n")


class GrammarCache:
    """Per-turn grammar text for (format, tools, tool_choice), built once per episode."""

    def __init__(self):
        self._cache: dict[tuple, str] = {}
        self._lock = threading.Lock()

    def get(self, episode: Episode, choice: str) -> str | None:
        """None when the episode has no tools (no grammar), except for code agents, whose code block
        needs none. "call" is one call and nothing else in the tool-call layout; the ReAct and code
        layouts have no call-only shape, so there it means "required" (Thought, then the action)."""
        from agentspec_sdk.structure.formats import get_format

        layout = get_format(episode.format).layout
        if not episode.tools and layout != "code_agent":
            return None
        key = (episode.id, episode.format, choice)
        with self._lock:
            if key not in self._cache:
                from agentspec_sdk.structure.tools import ToolRegistry
                from agentspec_sdk.structure.turn_grammar import turn_grammar

                if choice == "call" and layout == "tool_calls":
                    grammar = call_first_grammar(episode.format, episode.tools)
                elif choice == "call" and layout == "react":
                    grammar = react_call_grammar(episode.format, episode.tools)
                else:
                    grammar = turn_grammar(episode.format, ToolRegistry(list(episode.tools)),
                                           tool_choice=choice)
                self._cache[key] = grammar
            return self._cache[key]


_GRAMMARS = GrammarCache()


def make_request(**fields: Any) -> Any:
    from agentspec_sdk.backends.types import TurnRequest

    return TurnRequest(**fields)


def run_episode(engine: AgentEngine, episode: Episode, observe: Observer, *, classifier: TokenClassifier,
                max_tokens: int, max_steps: Callable[[int], int], max_segments: int | None = None,
                latency_scale: float = 1.0, sleep: bool = True,
                on_turn: Callable[[TurnLog], None] | None = None,
                temperature: float = 0.0, grammar: str | None = None,
                tool_choice: str | None = None) -> tuple[list[TurnLog], list[Turn]]:
    """Run one episode: returns the per-turn logs and the turns as this run produced them."""
    messages: list[dict] = [{"role": "system", "content": episode.system}]
    produced: list[Turn] = []
    logs: list[TurnLog] = []
    agent = episode.id
    users = [t for t in episode.turns if t.role == "user"]
    if max_segments is not None:
        users = users[:max_segments]
    for seg, user in enumerate(users):
        messages.append({"role": "user", "content": user.content})
        produced.append(Turn("user", user.content))
        steps = max(1, max_steps(seg))
        for step in range(steps):
            choice = tool_choice or tool_choice_policy(step, steps)
            step_grammar = grammar if grammar is not None else _GRAMMARS.get(episode, choice)
            req = make_request(messages=list(messages), fmt=episode.format, tools=episode.tools,
                              grammar=step_grammar, max_tokens=max_tokens, temperature=temperature,
                              request_id=f"{agent}/{seg}/{step}", agent_id=agent)
            res = engine.submit(req).result(timeout=TURN_TIMEOUT_S)
            calls = parse_calls(episode.format, res.text) if res.error is None else []
            labels = classifier.labels(res.text, list(res.token_ids), list(res.spans or []))
            log = TurnLog(
                episode=agent, segment=seg, step=step, text=res.text, output_tokens=len(res.token_ids),
                prompt_tokens=len(res.prompt_token_ids or []),
                tokens_by_class=count_labels(labels),
                acceptance={k: dict(v) for k, v in (res.acceptance or {}).items()},
                records=[dict(r) if isinstance(r, dict) else asdict(r) for r in (res.records or [])],
                timings=dict(res.timings or {}), finish_reason=res.finish_reason, error=res.error,
                tool_calls=calls, token_ids=list(res.token_ids),
                prompt_hash=_hash(res.prompt_token_ids or []), spec=getattr(res, "spec", None),
                token_classes=labels, prompt_ids=list(res.prompt_token_ids or []), grammar=step_grammar or "",
                too_long=is_too_long(res.error))
            if log.too_long:  # logged and counted; every later prompt of this episode is longer still
                logs.append(log)
                if on_turn is not None:
                    on_turn(log)
                return logs, produced
            messages.append({"role": "assistant", "content": res.text})
            produced.append(Turn("assistant", res.text, tool_calls=calls))
            done = False
            for call in calls:
                engine.mark_idle(agent)
                try:
                    obs = observe(call["name"], call["arguments"], seg)
                    if sleep and obs.latency_s > 0:
                        time.sleep(obs.latency_s * latency_scale)
                finally:
                    engine.mark_active(agent)
                log.matches.append(obs.match)
                messages.append(tool_message(obs.result))
                produced.append(Turn("tool", obs.result, name=call["name"], arguments=call["arguments"],
                                     latency_s=obs.latency_s))
                done = done or obs.done
            logs.append(log)
            if on_turn is not None:
                on_turn(log)
            if not calls or done:
                break
    return logs, produced
