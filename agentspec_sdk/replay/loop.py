"""The agent loop shared by the recorder and the replayer.

Per user message the agent generates assistant turns under its per-turn grammar; every tool call
it writes is answered by an `Observer` (the real tool when recording, the trace when replaying),
with the agent marked idle on the engine while the tool "runs".
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentspec_sdk.errors import PromptTooLong, TurnParseError
from agentspec_sdk.replay.trace import Episode, Turn
from agentspec_sdk.structure.formats import AgentFormat, get_format
from agentspec_sdk.structure.token_labels import TokenClassifier, count_labels
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar
from agentspec_sdk.structure.turns import parse_calls

if TYPE_CHECKING:
    from agentspec_sdk.backends.contract import AgentEngine

TURN_TIMEOUT_S = 900.0  # a turn the engine never answers fails the run instead of hanging it


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
    passes: int | None = None  # target passes the engine counted (TurnResult.passes; None: not counted)

    def to_dict(self) -> dict:
        return asdict(self)


def is_too_long(error: str | None) -> bool:
    """A turn refused because its prompt does not fit: the embedded engine's errors.PromptTooLong
    ("PromptTooLong: ...") or a vLLM server's 400 ("This model's maximum context length is ...")."""
    return bool(error) and (error.startswith(PromptTooLong.__name__) or "maximum context length is" in error)


def tool_message(result: str) -> dict:
    """The engine wraps tool messages in the format's environment markers (<tool_response>...)."""
    return {"role": "tool", "content": result}


def turn_calls(fmt: AgentFormat, text: str) -> list[dict]:
    """The calls the loop executes for one turn, as [{"name", "arguments"}] (`structure.turns.parse_calls`:
    a code agent's block is one call of `CODE_TOOL`). A turn with a malformed call (cut off by
    max_tokens) executes none: the parse error is the turn's outcome, not the run's."""
    try:
        return [call.to_dict() for call in parse_calls(fmt, text)]
    except TurnParseError:
        return []


def _hash(ids: Any) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:16]


def tool_choice_policy(step: int, steps: int) -> str:
    """The agent policy of recording and replay, per user message: every assistant turn but the
    last is one tool call written at once ("call"); the last may call a tool or answer ("auto").
    A 135M model given a free "required" turn reasons for hundreds of tokens before it calls."""
    return "call" if step < steps - 1 else "auto"


THOUGHT_CHARS = 200  # a ReAct turn that must act thinks one line of at most this many characters


def call_shape(layout: str | None) -> dict[str, Any]:
    """The policy's "call" turn per layout, as `turn_grammar` arguments: in the tool-call layout one
    call and nothing else; in ReAct `Thought: `, one line of thought (a free Thought lets a 135M model
    talk to max_tokens without ever writing `Action:`), then the action; the code layout has no
    call-only shape ("call" means "required" there)."""
    return {"tool_calls": {"single_call": True}, "call_list": {"single_call": True},
            "react": {"thought_chars": THOUGHT_CHARS}}.get(layout, {})


class GrammarCache:
    """Per-turn grammar text for (format, tools, tool_choice), built once per episode."""

    def __init__(self):
        self._cache: dict[tuple, str] = {}
        self._lock = threading.Lock()

    def get(self, episode: Episode, choice: str) -> str | None:
        """None when the episode has no tools (no grammar), except for code agents, whose code block
        needs none. "call" is one call and nothing else in the tool-call layout; the ReAct and code
        layouts have no call-only shape, so there it means "required" (Thought, then the action);
        see `call_shape`."""
        fmt = get_format(episode.format)
        layout = fmt.layout
        if not episode.tools and layout != "code_agent":
            return None
        key = (episode.id, episode.format, choice)
        with self._lock:
            if key not in self._cache:
                shape = call_shape(layout) if choice == "call" else {}
                self._cache[key] = turn_grammar(fmt, ToolRegistry(list(episode.tools)),
                                                tool_choice=choice, **shape)
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
    # the format object only when the episode words its instructions itself (else the name, as before)
    fmt = episode.agent_format() if episode.instructions else episode.format
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
            req = make_request(messages=list(messages), fmt=fmt, tools=episode.tools,
                              grammar=step_grammar, max_tokens=max_tokens, temperature=temperature,
                              request_id=f"{agent}/{seg}/{step}", agent_id=agent)
            res = engine.submit(req).result(timeout=TURN_TIMEOUT_S)
            calls = turn_calls(get_format(episode.format), res.text) if res.error is None else []
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
                too_long=is_too_long(res.error), passes=getattr(res, "passes", None))
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
