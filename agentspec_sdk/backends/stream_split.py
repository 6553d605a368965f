"""Stream splitting shared by both backends: text deltas in, `StreamEvent`s labelled by segment out.

An event never straddles a segment boundary. Text at the end that may still begin a marker (the
segmenter's `pending`) waits for the next delta, or for `final=True`, which sends everything.
"""

from __future__ import annotations

from agentspec_sdk.backends.types import StreamEvent
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.segmenter import Segmenter


class StreamSplitter:
    """Feed a turn's text deltas in order; get the events whose segment is decided."""

    def __init__(self, fmt: AgentFormat):
        self.segmenter = Segmenter(fmt)
        self.text = ""
        self.emitted = 0  # characters already sent as events

    def feed(self, delta: str, final: bool = False) -> list[StreamEvent]:
        seg = self.segmenter
        self.text += delta
        closed = seg.feed(delta)
        decided = len(seg) if final else len(seg) - len(seg.pending)
        at, out = self.emitted, []
        for span in closed:
            if span.end > at:
                out.append(StreamEvent(self.text[at:span.end], span.kind, span.law_class.value))
                at = span.end
        if decided > at:
            out.append(StreamEvent(self.text[at:decided], seg.kind, seg.law_class.value))
            at = decided
        self.emitted = at
        return out
