"""Captured traffic, format v1 (docs/capture.md): each finished turn's prompt and output token ids,
temperature, the grammar as sent, agent format, tool set and episode key, as JSON Lines in a capture
directory. Written by the embedded engine (`Engine(capture=DIR)`), by `vllm serve` through
`inside_vllm.capture_hook` (`agentspec serve --capture DIR`), by replay and the demo; read by
`agentspec tune` and the offline replay (`benchmarks/offline_drafting.py`).

A file is `capture-<pid>-<seq>.jsonl`: a header line, then `tools`, `grammar` and `turn` lines; a
tools or grammar line comes once per file, before the first turn that names its id, so every file
reads alone. The writer is bounded (bytes per file, files kept, a sample rate decided per episode) and
writes files only their owner can read. Standard library only: vLLM's API server imports it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from agentspec_sdk.errors import CaptureError

__all__ = ["CAPTURE_VERSION", "FORMAT_HEADER", "Capture", "CaptureWriter", "CapturedTurn", "Grammar",
           "WRITERS", "read_capture", "writer_for"]

CAPTURE_VERSION = 1
# the agent format of a chat request, named by our client (`RemoteEngine`) for a capturing server
FORMAT_HEADER = "x-agentspec-format"
WRITERS = ("engine", "serve", "replay")
DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_MAX_FILES = 8


class Grammar(NamedTuple):
    """A grammar as sent to vLLM: `kind` is the structured-outputs field (lark, json, regex, choice,
    structural_tag, ...), `text` its value as a string (JSON-encoded where vLLM took an object)."""

    kind: str
    text: str


@dataclass
class CapturedTurn:
    id: str
    episode: str | None
    prompt: list[int]
    out: list[int]
    temperature: float
    grammar: Grammar | None
    format: str | None
    tools: list[dict] | None
    started: float | None
    finished: float | None
    finish_reason: str | None
    source: str  # "file:line"


@dataclass
class Capture:
    turns: list[CapturedTurn] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "x.jsonl:57: truncated last line skipped"


def _digest(prefix: str, payload: str) -> str:
    return prefix + hashlib.sha1(payload.encode("utf-8")).hexdigest()[:12]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def tools_id(tools: list[dict]) -> str:
    return _digest("t", _canonical(tools))


def grammar_id(grammar: Grammar) -> str:
    return _digest("g", _canonical([grammar.kind, grammar.text]))


# -- writing ------------------------------------------------------------------------------------------


class CaptureWriter:
    """Appends turns to `capture-<pid>-<seq>.jsonl` files in `directory` (created 0700; files 0600).

    A file past `max_bytes` is closed and the next one begun (a new header; a turn is never split, so
    a single turn larger than the cap makes a file of its own); beyond `max_files` files of this
    writer the oldest is removed. `sample`: the share of turns kept, decided per episode (all of an
    episode's turns in or all out; a turn without episode decided alone), reproducible with `seed`.
    Thread-safe; each turn is one write of whole lines, flushed."""

    def __init__(self, directory: str | os.PathLike, *, writer: str, model: str,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_files: int = DEFAULT_MAX_FILES, sample: float = 1.0,
                 seed: int | None = None):
        if writer not in WRITERS:
            raise CaptureError(f"capture writer must be one of {WRITERS}, got {writer!r}")
        self.check_settings(max_bytes=max_bytes, max_files=max_files, sample=sample)
        self.directory = Path(directory)
        self.writer, self.model = writer, str(model)
        self.max_bytes, self.max_files, self.sample = max_bytes, max_files, float(sample)
        self._salt = str(seed) if seed is not None else os.urandom(8).hex()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._files: list[Path] = []  # this writer's files, oldest first
        self._fh = None
        self._size = 0
        self._written: set[str] = set()  # tools and grammar ids already in the current file
        self._turns_in_file = 0
        self._closed = False
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CaptureError(f"capture directory {self.directory}: {exc.strerror or exc}") from None
        if not self.directory.is_dir():
            raise CaptureError(f"capture directory {self.directory} is not a directory")

    @staticmethod
    def check_settings(*, max_bytes: int, max_files: int, sample: float) -> None:
        """CaptureError naming the setting out of its range."""
        for name, value, low in (("max_bytes", max_bytes, 1024), ("max_files", max_files, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CaptureError(f"capture {name} must be an integer >= {low}, got {value!r}")
        if isinstance(sample, bool) or not isinstance(sample, int | float) or not 0.0 <= sample <= 1.0:
            raise CaptureError(f"capture sample must be a number in [0, 1], got {sample!r}")

    @property
    def files(self) -> list[Path]:
        return list(self._files)

    def keeps(self, episode: str | None) -> bool:
        """Whether a turn of `episode` is kept under the sample rate."""
        if self.sample >= 1.0:
            return True
        if self.sample <= 0.0:
            return False
        if episode is None:
            return self._rng.random() < self.sample
        return random.Random(f"{self._salt}:{episode}").random() < self.sample

    def write_turn(self, *, id: str, episode: str | None, prompt: Iterable[int], out: Iterable[int],
                   temperature: float, grammar: Grammar | None, format: str | None,
                   tools: list[dict] | None, started: float | None, finished: float | None,
                   finish_reason: str | None) -> bool:
        """Append one finished turn; False when the sample left it out."""
        with self._lock:
            if self._closed:
                raise CaptureError(f"capture writer for {self.directory} is closed")
            if not self.keeps(episode):
                return False
            extra: list[tuple[str, dict]] = []  # (id, record) of tools / grammar lines this turn needs
            tid = gid = None
            if tools is not None:
                tid = tools_id(tools)
                extra.append((tid, {"type": "tools", "id": tid, "tools": tools}))
            if grammar is not None:
                grammar = Grammar(str(grammar[0]), str(grammar[1]))
                gid = grammar_id(grammar)
                extra.append((gid, {"type": "grammar", "id": gid, "kind": grammar.kind,
                                    "text": grammar.text}))
            turn = _line({
                "type": "turn", "id": str(id), "episode": None if episode is None else str(episode),
                "prompt": [int(t) for t in prompt], "out": [int(t) for t in out],
                "temperature": float(temperature), "grammar": gid, "format": format, "tools": tid,
                "started": started, "finished": finished, "finish_reason": finish_reason})
            self._append(extra, turn)
            return True

    def _append(self, extra: list[tuple[str, dict]], turn: str) -> None:
        def block() -> bytes:  # a tools or grammar line once per file, before its first turn
            lines = [_line(record) for key, record in extra if key not in self._written] + [turn]
            return ("\n".join(lines) + "\n").encode("utf-8")

        data = block()
        if self._fh is None or (self._turns_in_file and self._size + len(data) > self.max_bytes):
            self._rotate()
            data = block()
        self._fh.write(data)
        self._fh.flush()
        self._size += len(data)
        self._written.update(key for key, _ in extra)
        self._turns_in_file += 1

    def _rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
        pid = os.getpid()
        seq = 1 + max((int(p.stem.rsplit("-", 1)[1]) for p in self.directory.glob(f"capture-{pid}-*.jsonl")
                       if p.stem.rsplit("-", 1)[1].isdigit()), default=-1)
        path = self.directory / f"capture-{pid}-{seq}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._fh = os.fdopen(fd, "wb")
        header = _line({"agentspec_capture": CAPTURE_VERSION,
                             "created": datetime.datetime.now(datetime.UTC).isoformat(),
                             "writer": self.writer, "model": self.model, "pid": pid}) + "\n"
        self._fh.write(header.encode("utf-8"))
        self._fh.flush()
        self._size, self._turns_in_file = len(header), 0
        self._written = set()
        self._files.append(path)
        while len(self._files) > self.max_files:
            self._files.pop(0).unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fh is not None:
                self._fh.close()
                self._fh = None


_WRITERS: dict[tuple[int, Path], CaptureWriter] = {}
_WRITERS_LOCK = threading.Lock()


def writer_for(directory: str | os.PathLike, **settings: Any) -> CaptureWriter:
    """The one writer of this process for `directory` (made with `settings` on first use): several
    engines in one process share it, so their turns go to the same files."""
    key = (os.getpid(), Path(directory).resolve())
    with _WRITERS_LOCK:
        writer = _WRITERS.get(key)
        if writer is None or writer._closed:
            writer = _WRITERS[key] = CaptureWriter(directory, **settings)
        return writer


# -- reading ------------------------------------------------------------------------------------------


def read_capture(paths: Iterable[str | os.PathLike]) -> Capture:
    """Every turn of the capture files and directories (a directory: its `*.jsonl`, sorted by name)."""
    capture = Capture()
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    for given in paths:
        path = Path(given)
        if path.is_dir():
            capture.files += [str(p) for p in sorted(path.glob("*.jsonl"))]
        elif path.is_file():
            capture.files.append(str(path))
        else:
            raise CaptureError(f"{path}: no such capture file or directory")
    for name in capture.files:
        _read_file(name, capture)
    return capture


def _read_file(name: str, capture: Capture) -> None:
    try:
        raw = Path(name).read_bytes()
    except OSError as exc:
        raise CaptureError(f"{name}: cannot read: {exc.strerror or exc}") from None
    lines = raw.split(b"\n")
    complete_end = raw.endswith(b"\n")
    if complete_end:
        lines.pop()  # the empty piece after the last newline
    if not lines or not lines[0].strip():
        raise CaptureError(f"{name}:1: no capture header (the file is empty)")
    _check_header(name, lines[0], truncated=len(lines) == 1 and not complete_end)
    tools: dict[str, list[dict]] = {}
    grammars: dict[str, Grammar] = {}
    for number, line in enumerate(lines[1:], start=2):
        last = number == len(lines)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if last:
                capture.notes.append(f"{name}:{number}: truncated last line skipped ({_short(exc)})")
                return
            raise CaptureError(f"{name}:{number}: malformed line: {_short(exc)}") from None
        if last and not complete_end:
            capture.notes.append(f"{name}:{number}: truncated last line skipped (no newline at its end)")
            return
        _take(record, f"{name}:{number}", tools, grammars, capture)


def _short(exc: Exception) -> str:
    return str(exc)[:120]


def _check_header(name: str, line: bytes, truncated: bool) -> None:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or "agentspec_capture" not in header:
        what = "truncated" if truncated else "not a capture header"
        raise CaptureError(f"{name}:1: no capture header ({what}: the first line must be "
                           f'{{"agentspec_capture": {CAPTURE_VERSION}, ...}})')
    if header["agentspec_capture"] != CAPTURE_VERSION:
        raise CaptureError(f"{name}:1: unknown capture version {header['agentspec_capture']!r} (this "
                           f"reader reads version {CAPTURE_VERSION})")


def _take(record: dict, where: str, tools: dict, grammars: dict, capture: Capture) -> None:
    kind = record.get("type")
    if kind == "tools":
        value = _field(record, "tools", list, where)
        if not all(isinstance(t, dict) for t in value):
            raise CaptureError(f"{where}: key 'tools': every tool must be a JSON object")
        tools[_field(record, "id", str, where)] = value
    elif kind == "grammar":
        grammars[_field(record, "id", str, where)] = Grammar(_field(record, "kind", str, where),
                                                             _field(record, "text", str, where))
    elif kind == "turn":
        capture.turns.append(_turn(record, where, tools, grammars))
    else:
        raise CaptureError(f"{where}: unknown line type {kind!r} (expected tools, grammar or turn)")


def _turn(record: dict, where: str, tools: dict, grammars: dict) -> CapturedTurn:
    def ref(key: str, table: dict, what: str):
        ident = _field(record, key, str, where, optional=True)
        if ident is None:
            return None
        if ident not in table:
            raise CaptureError(f"{where}: turn refers to unknown {what} id {ident!r} (no {what} line with "
                               "that id before it in this file)")
        return table[ident]

    prompt, out = _field(record, "prompt", list, where), _field(record, "out", list, where)
    for key, ids in (("prompt", prompt), ("out", out)):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise CaptureError(f"{where}: key {key!r}: token ids must be integers")
    return CapturedTurn(
        id=_field(record, "id", str, where), episode=_field(record, "episode", str, where, optional=True),
        prompt=prompt, out=out, temperature=float(_field(record, "temperature", int | float, where)),
        grammar=ref("grammar", grammars, "grammar"), tools=ref("tools", tools, "tools"),
        format=_field(record, "format", str, where, optional=True),
        started=_field(record, "started", int | float, where, optional=True),
        finished=_field(record, "finished", int | float, where, optional=True),
        finish_reason=_field(record, "finish_reason", str, where, optional=True), source=where)


def _field(record: dict, key: str, kind, where: str, optional: bool = False):
    if key not in record:
        raise CaptureError(f"{where}: {record.get('type', 'line')} has no key {key!r}")
    value = record[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise CaptureError(f"{where}: key {key!r} has the wrong type ({type(value).__name__})")
    return value
