"""Agent traces: one episode per JSONL line (schema in docs/replay.md).

An episode holds what an agent saw and did: the system prompt, the tools (OpenAI tool dicts), the
agent format, and the ordered turns — user messages, assistant turns as recorded, and tool
observations with the tool's arguments, result text and measured latency.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentspec_sdk.errors import TraceError

TRACE_VERSION = 1
ROLES = ("user", "assistant", "tool")


@dataclass
class Turn:
    """One entry of an episode. `role` is user | assistant | tool.

    user: `content`. assistant: `content` (the raw text the model wrote) and `tool_calls`
    (parsed [{"name", "arguments"}]). tool: `name`, `arguments`, `content` (the result text)
    and `latency_s` (wall time the tool took when recorded).
    """

    role: str
    content: str
    tool_calls: list[dict] = field(default_factory=list)
    name: str | None = None
    arguments: dict | None = None
    latency_s: float = 0.0

    def to_dict(self) -> dict:
        if self.role == "user":
            return {"role": "user", "content": self.content}
        if self.role == "assistant":
            return {"role": "assistant", "content": self.content, "tool_calls": self.tool_calls}
        return {"role": "tool", "name": self.name, "arguments": self.arguments,
                "content": self.content, "latency_s": self.latency_s}


@dataclass
class Episode:
    id: str
    source: dict
    system: str
    tools: list[dict]
    format: str
    turns: list[Turn]
    meta: dict = field(default_factory=dict)
    # The format's instructions as this episode's prompts carried them ("": the format's own,
    # `AgentFormat.instructions`): a recording made with other wording replays with that wording.
    instructions: str = ""

    def to_dict(self) -> dict:
        extra = {"instructions": self.instructions} if self.instructions else {}
        return {"version": TRACE_VERSION, "id": self.id, "source": self.source, "system": self.system,
                "tools": self.tools, "format": self.format, **extra, "meta": self.meta,
                "turns": [t.to_dict() for t in self.turns]}

    def agent_format(self):
        """The format its requests use: the named one, with this episode's instructions if it has own."""
        from dataclasses import replace

        from agentspec_sdk.structure.formats import get_format

        fmt = get_format(self.format)
        return replace(fmt, instructions=self.instructions) if self.instructions else fmt

    def user_segments(self) -> list[list[Turn]]:
        """The turns split at each user message; segment i starts with user message i."""
        segments: list[list[Turn]] = []
        for t in self.turns:
            if t.role == "user" or not segments:
                segments.append([])
            segments[-1].append(t)
        return segments

    def observations(self) -> list[tuple[int, Turn]]:
        """(user segment index, tool turn) for every recorded tool observation, in order."""
        out = []
        for i, seg in enumerate(self.user_segments()):
            out.extend((i, t) for t in seg if t.role == "tool")
        return out


class _Bad(Exception):
    pass


def _need(data: dict, key: str, kind: type | tuple, where: str) -> Any:
    if key not in data:
        raise _Bad(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool) and kind in (int, float)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _Bad(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _turn(data: Any, index: int) -> Turn:
    where = f"turns[{index}]"
    if not isinstance(data, dict):
        raise _Bad(f"{where} must be an object, got {type(data).__name__}")
    role = _need(data, "role", str, where)
    if role not in ROLES:
        raise _Bad(f"{where}: role must be one of {list(ROLES)}, got {role!r}")
    content = _need(data, "content", str, where)
    if role == "user":
        return Turn("user", content)
    if role == "assistant":
        calls = data.get("tool_calls", [])
        if not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("name"), str)
                and isinstance(c.get("arguments"), dict)
                for c in calls):
            raise _Bad(f"{where}: tool_calls must be a list of {{'name': str, 'arguments': object}}")
        return Turn("assistant", content, tool_calls=calls)
    name = _need(data, "name", str, where)
    arguments = _need(data, "arguments", dict, where)
    latency = _need(data, "latency_s", (int, float), where)
    if latency < 0:
        raise _Bad(f"{where}: latency_s must be >= 0, got {latency}")
    return Turn("tool", content, name=name, arguments=arguments, latency_s=float(latency))


# Per layout: the markers an assistant turn must contain when tool turns answer it (any one of each
# group), looked up by segment kind name in the episode's format.
_CALL_KINDS = {"tool_calls": ("tool_call",), "react": ("action", "action_input"), "code_agent": ("code",)}


def _check_format(name: str, turns: list[Turn], where: str) -> None:
    """The format must be known, and every assistant turn that tool turns answer (a call, a code
    run) must hold its format's markers for that: a trace whose turns do not follow its format
    would replay as something else."""
    from agentspec_sdk.errors import FormatError
    from agentspec_sdk.structure.formats import get_format

    try:
        fmt = get_format(name)
    except FormatError as err:
        raise _Bad(f"{where}: field 'format': {err}") from None
    groups = [fmt.kind(k).open for k in _CALL_KINDS.get(fmt.layout or "", ())]
    for i, t in enumerate(turns):
        answered = i + 1 < len(turns) and turns[i + 1].role == "tool"
        if t.role != "assistant" or not answered:
            continue
        for markers in groups:
            if not any(m in t.content for m in markers):
                shown = " or ".join(repr(m) for m in markers)
                raise _Bad(f"{where}: turns[{i}]: the assistant turn is answered by a tool turn but has no "
                           f"{shown} (format {name!r})")


def episode_from_dict(data: Any) -> Episode:
    """Validate one decoded line; raises TraceError without location (callers add it)."""
    try:
        if not isinstance(data, dict):
            raise _Bad(f"an episode must be a JSON object, got {type(data).__name__}")
        version = data.get("version", TRACE_VERSION)
        if version != TRACE_VERSION:
            raise _Bad(f"trace version {version!r} is not supported (expected {TRACE_VERSION})")
        ep_id = _need(data, "id", str, "episode")
        where = f"episode {ep_id!r}"
        tools = _need(data, "tools", list, where)
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise _Bad(f"{where}: tools[{i}] must be an OpenAI tool dict {{'type': 'function', "
                           f"'function': {{'name', 'parameters'}}}}")
        raw_turns = _need(data, "turns", list, where)
        turns = [_turn(t, i) for i, t in enumerate(raw_turns)]
        if not any(t.role == "user" for t in turns):
            raise _Bad(f"{where}: no user message")
        fmt = _need(data, "format", str, where)
        _check_format(fmt, turns, where)
        instructions = _need(data, "instructions", str, where) if "instructions" in data else ""
        return Episode(id=ep_id, source=_need(data, "source", dict, where),
                       system=_need(data, "system", str, where), tools=tools,
                       format=fmt, turns=turns,
                       meta=data.get("meta", {}) if isinstance(data.get("meta", {}), dict) else {},
                       instructions=instructions)
    except _Bad as bad:
        raise TraceError(str(bad)) from None


def check_formats(episodes: list[Episode], fmt: str | None = None) -> str | None:
    """The one agent format of `episodes` (None when there are none). A replay writes every turn in
    the format its trace was recorded in (the recorded turns, markers and observations are that
    format's), so episodes of different formats in one replay, or a replay asked to run in a format
    (`fmt`, already resolved: "auto" is the engine's business) other than the trace's, is a TraceError
    naming both rather than a run that mixes them."""
    names = {ep.format for ep in episodes}
    if len(names) > 1:
        by = {name: next(ep.id for ep in episodes if ep.format == name) for name in sorted(names)}
        raise TraceError("the episodes mix agent formats "
                         + ", ".join(f"{n!r} (e.g. episode {i!r})" for n, i in by.items())
                         + "; replay one format at a time (one trace file per format)")
    recorded = next(iter(names), None)
    if fmt is not None and recorded is not None and fmt != recorded:
        raise TraceError(f"the trace was recorded in format {recorded!r} (episode {episodes[0].id!r}); "
                         f"it cannot be replayed in format {fmt!r}: record it again in {fmt!r}, or replay "
                         f"it in {recorded!r}")
    return recorded


def iter_traces(path: str | Path) -> Iterator[Episode]:
    """Episodes of a JSONL trace file; a corrupt or truncated line raises TraceError naming
    the file and the line number."""
    path = Path(path)
    try:
        handle = path.open("r", encoding="utf-8")
    except OSError as err:
        raise TraceError(f"{path}: cannot read trace file ({err.strerror})") from None
    with handle:
        seen: set[str] = set()
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                hint = ("truncated line (no newline at end of file)" if not line.endswith("\n")
                        else "corrupt JSON")
                raise TraceError(f"{path}:{lineno}: {hint}: {err.msg} at column {err.colno}") from None
            try:
                episode = episode_from_dict(data)
            except TraceError as err:
                raise TraceError(f"{path}:{lineno}: {err}") from None
            if episode.id in seen:
                raise TraceError(f"{path}:{lineno}: duplicate episode id {episode.id!r}")
            seen.add(episode.id)
            yield episode


def load_traces(path: str | Path, limit: int | None = None) -> list[Episode]:
    episodes = []
    for ep in iter_traces(path):
        episodes.append(ep)
        if limit is not None and len(episodes) >= limit:
            break
    if not episodes:
        raise TraceError(f"{path}: no episodes in trace file")
    return episodes


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename over `path`: a reader never
    sees a half-written file, even if the writer is interrupted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump_traces(episodes: Iterable[Episode], path: str | Path) -> None:
    atomic_write_text(path, "".join(json.dumps(ep.to_dict(), ensure_ascii=False) + "\n" for ep in episodes))


def bundled_traces(fmt: str = "tool_calls") -> Path:
    """A trace file shipped with the package, recorded on the default model: BFCL multi-turn in
    `tool_calls` (the default) or `react`, HumanEval in `code_agent`."""
    names = {"tool_calls": "bfcl_multi_turn.jsonl", "react": "bfcl_react.jsonl",
             "code_agent": "humaneval_code_agent.jsonl"}
    if fmt not in names:
        raise TraceError(f"no bundled traces in format {fmt!r}; bundled: {sorted(names)}")
    return Path(__file__).with_name("traces") / names[fmt]
