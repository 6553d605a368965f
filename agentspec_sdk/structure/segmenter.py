"""Incremental segmenter: text fed in any chunking → spans (start, end, kind, law class).

Rules (docs/formats.md): an open marker starts a new span at the marker's first character; a close
marker ends its span after the marker's last character, and the text after it goes to the format's
initial kind. Inside a delimited kind (one with a close marker) only its close marker is live.
Markers inside JSON strings (``json`` content) and inside ``` fences (``code`` content) are not
boundaries. A marker split across chunks is held back until it is decided, so any chunking of the
same text gives the same spans.

The state is a handful of scalars plus at most one marker's length of held-back text; `clone()`
shares the text and span history with the original (append-only logs), so it is O(1).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agentspec_sdk.structure.formats import FENCE, AgentFormat, LawClass

_OUT, _STR, _FENCE = 0, 1, 2  # sub-states: scanning markers, inside a JSON string, inside a fence
_QUOTE, _BACKSLASH = '"', "\\"


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    kind: str
    law_class: LawClass


class _Mode:
    """What is live in one (kind, close marker, sub-state): a regex over the live strings."""

    __slots__ = ("regex", "actions", "prefixes", "prefix_tail_chars", "longest")

    def __init__(self, actions: dict[str, tuple]):
        self.actions = actions
        live = sorted(actions, key=lambda s: (-len(s), s))
        # A mode with nothing live (a format without markers) must never match: `(?!)`.
        self.regex = re.compile("|".join(re.escape(s) for s in live) or "(?!)")
        self.prefixes = {s[:j] for s in live for j in range(1, len(s))}
        self.prefix_tail_chars = {p[-1] for p in self.prefixes}
        self.longest = max((len(s) for s in live), default=0)


class _Tables:
    """Scanner modes for one format, built once per format."""

    def __init__(self, fmt: AgentFormat):
        self.fmt = fmt
        self.class_of = {k.name: k.law_class for k in fmt.kinds}
        opens = {
            m: ("open", kind, idx if fmt.kind(kind).delimited else -1)
            for m, (kind, idx) in fmt.open_markers().items()
            if not fmt.kind(kind).anchored
        }
        # an anchored kind's markers open it at the turn's first character only (longest first)
        self.anchored = sorted(((m, k.name) for k in fmt.kinds if k.anchored for m in k.open),
                               key=lambda mk: (-len(mk[0]), mk[0]))
        self.modes: dict[tuple[str, int, int], _Mode] = {}
        for k in fmt.kinds:
            if k.delimited:
                for idx, close in enumerate(k.close):
                    out = {close: ("close",)}
                    if k.content == "json":
                        out[_QUOTE] = ("sub", _STR)
                    self.modes[(k.name, idx, _OUT)] = _Mode(out)
                    self.modes[(k.name, idx, _STR)] = _string_mode()
            else:
                out = dict(opens)
                if k.content == "json":
                    out.setdefault(_QUOTE, ("sub", _STR))
                    self.modes[(k.name, -1, _STR)] = _string_mode()
                elif k.content == "code":
                    out.setdefault(FENCE, ("sub", _FENCE))
                    self.modes[(k.name, -1, _FENCE)] = _Mode({FENCE: ("sub", _OUT)})
                self.modes[(k.name, -1, _OUT)] = _Mode(out)


def _string_mode() -> _Mode:
    return _Mode({_QUOTE: ("sub", _OUT), _BACKSLASH: ("escape",)})


_TABLES: dict[AgentFormat, _Tables] = {}


def _tables(fmt: AgentFormat) -> _Tables:
    t = _TABLES.get(fmt)
    if t is None:
        if len(_TABLES) >= 256:  # formats built in a loop must not pile up
            _TABLES.clear()
        t = _TABLES[fmt] = _Tables(fmt)
    return t


class _Log:
    """Append-only list whose forks share the common prefix (fork is O(1))."""

    __slots__ = ("base", "base_len", "items")

    def __init__(self, base: _Log | None = None, base_len: int = 0):
        self.base, self.base_len, self.items = base, base_len, []

    def __len__(self) -> int:
        return self.base_len + len(self.items)

    def fork(self) -> _Log:
        return _Log(self, len(self))

    def to_list(self) -> list:
        chain, log = [], self
        while log is not None:
            chain.append(log)
            log = log.base
        out: list = []
        for log in reversed(chain):
            del out[log.base_len :]
            out.extend(log.items)
        return out


class Segmenter:
    """Feed agent output in chunks; read closed `spans` and the open `current` span."""

    __slots__ = ("fmt", "_t", "_kind", "_close", "_sub", "_escape", "_start", "_pos", "_held",
                 "_mode", "_chunks", "_spans", "_fresh")

    def __init__(self, fmt: AgentFormat, *, initial: str | None = None):
        self.fmt = fmt
        self._t = _tables(fmt)
        self._kind = fmt.kind(initial or fmt.initial).name
        self._close = -1
        self._sub = _OUT
        self._escape = False
        self._start = 0
        self._pos = 0
        self._held = ""
        self._chunks = _Log()
        self._spans = _Log()
        self._fresh = bool(self._t.anchored)  # anchored markers still possible (nothing decided yet)
        self._set_mode()

    def _set_mode(self) -> None:
        self._mode = self._t.modes[(self._kind, self._close, self._sub)]

    # -- reading --------------------------------------------------------------------------------

    @property
    def current(self) -> Span:
        return Span(self._start, self._pos, self._kind, self._t.class_of[self._kind])

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def law_class(self) -> LawClass:
        return self._t.class_of[self._kind]

    @property
    def spans(self) -> list[Span]:
        return self._spans.to_list()

    def all_spans(self) -> list[Span]:
        """Closed spans plus the open one (if not empty)."""
        cur = self.current
        return self.spans + ([cur] if cur.end > cur.start else [])

    @property
    def text(self) -> str:
        return "".join(self._chunks.to_list())

    def __len__(self) -> int:
        return self._pos

    @property
    def pending(self) -> str:
        """Text at the end that may be the start of a marker (not yet decided)."""
        return self._held

    # -- feeding --------------------------------------------------------------------------------

    def feed(self, chunk: str) -> list[Span]:
        """Append `chunk`; return the spans this chunk closed."""
        if not chunk:
            return []
        self._chunks.items.append(chunk)
        closed = self._scan(chunk, first_only=False)
        if closed:
            self._spans.items.extend(closed)
        return closed

    def clone(self) -> Segmenter:
        other = object.__new__(Segmenter)
        other.fmt, other._t, other._mode = self.fmt, self._t, self._mode
        other._kind, other._close, other._sub, other._escape = (self._kind, self._close, self._sub,
                                                                self._escape)
        other._start, other._pos, other._held = self._start, self._pos, self._held
        other._fresh = self._fresh
        other._chunks = self._chunks.fork()
        other._spans = self._spans.fork()
        return other

    def boundary_in(self, text: str) -> int | None:
        """If appending `text` would start a new segment, the index in `text` where it starts.

        Text before that index stays in the current segment (a close marker is included: drafting
        ``</tool_call>`` is allowed, drafting past it is not). 0 when the boundary is in text already
        fed but held back as a possible marker. None when `text` stays in the current segment.
        """
        if not text:
            return None
        if not self._held and not self._fresh and self._mode.regex.search(text) is None:
            return None  # no live marker in it: what `_scan` finds too, without its state saved
        saved = (self._kind, self._close, self._sub, self._escape, self._start, self._pos, self._held,
                 self._mode, self._fresh)
        try:
            closed = self._scan(text, first_only=True)
        finally:
            (self._kind, self._close, self._sub, self._escape, self._start, self._pos, self._held,
             self._mode, self._fresh) = saved
        if not closed:
            return None
        return max(0, closed[0].end - self._pos)

    def _scan(self, chunk: str, *, first_only: bool) -> list[Span]:
        buf = self._held + chunk if self._held else chunk
        base = self._pos - len(self._held)  # absolute offset of buf[0]
        self._pos += len(chunk)
        n = len(buf)
        i = 0
        closed: list[Span] = []
        if self._escape:  # the previous chunk ended on a backslash inside a JSON string
            self._escape = False
            i = 1
        if self._fresh:
            i = self._anchored_start(buf, closed, first_only)
            if i < 0:  # all of it may still begin an anchored marker: hold it
                self._held = buf
                return closed
            if first_only and closed:
                self._held = ""
                return closed
        while i < n:
            mode = self._mode
            m = mode.regex.search(buf, i)
            if m is None:
                break
            s, e = m.span()
            if s > n - mode.longest:
                hold = self._hold_from(buf, i, s + 1)
                if hold is not None:
                    self._held = buf[hold:]
                    return closed
            action = mode.actions[m.group()]
            tag = action[0]
            if tag == "sub":
                self._sub = action[1]
                self._set_mode()
                i = e
            elif tag == "escape":
                if e < n:
                    i = e + 1
                else:
                    self._escape = True
                    i = e
            elif tag == "open":
                self._switch(base + s, action[1], action[2], closed, first_only)
                i = e
            else:  # close
                self._switch(base + e, self.fmt.initial, -1, closed, first_only)
                i = e
            if first_only and closed:
                self._held = ""
                return closed
        hold = self._hold_from(buf, i, n) if n else None
        self._held = buf[hold:] if hold is not None else ""
        return closed

    def _anchored_start(self, buf: str, closed: list[Span], probe: bool) -> int:
        """At the turn's start: open an anchored kind if the text begins with one of its markers (the
        index after the marker), -1 while the text is still a proper prefix of one, else 0."""
        for marker, kind in self._t.anchored:
            if buf.startswith(marker):
                self._fresh = False
                self._switch(0, kind, -1, closed, probe)
                return len(marker)
        if any(m.startswith(buf) for m, _ in self._t.anchored):
            return -1
        self._fresh = False
        return 0

    def _hold_from(self, buf: str, lo: int, hi: int) -> int | None:
        """First k in [lo, hi) with buf[k:] a proper prefix of a live string (k > n - longest)."""
        mode = self._mode
        n = len(buf)
        if not mode.prefixes or buf[-1] not in mode.prefix_tail_chars:
            return None
        for k in range(max(lo, n - mode.longest + 1), hi):
            if buf[k:] in mode.prefixes:
                return k
        return None

    def _switch(self, at: int, kind: str, close: int, closed: list[Span], probe: bool = False) -> None:
        # An empty span is dropped; a probe still reports an empty one when the kind changes.
        if at > self._start or (probe and kind != self._kind):
            closed.append(Span(self._start, at, self._kind, self._t.class_of[self._kind]))
            self._start = at
        self._kind, self._close, self._sub = kind, close, _OUT
        self._set_mode()


def segment(fmt: AgentFormat, text: str, *, initial: str | None = None) -> list[Span]:
    """All spans of `text` (closed ones and the final open one)."""
    seg = Segmenter(fmt, initial=initial)
    seg.feed(text)
    return seg.all_spans()


def label_tokens(
    fmt: AgentFormat, pieces: Iterable[str], *, initial: str | None = None
) -> list[tuple[str, LawClass]]:
    """(kind, law class) of each token piece: the segment that contains the piece's first character.

    An empty piece gets the segment at its offset (the last segment if it is at the end).
    """
    seg = Segmenter(fmt, initial=initial)
    starts = []
    for piece in pieces:
        starts.append(len(seg))
        seg.feed(piece)
    spans = seg.all_spans() or [seg.current]
    ends = [sp.end for sp in spans]
    out = []
    for at in starts:
        j = min(bisect.bisect_right(ends, at), len(spans) - 1)
        out.append((spans[j].kind, spans[j].law_class))
    return out
