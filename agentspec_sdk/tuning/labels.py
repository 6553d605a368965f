"""Per-token labels of captured outputs: the law class (S/R/F) and the segment kind of every output
token, as the report classifies them (segmenter spans over the decoded text, each token taking the
span its first character falls in); the replay attributes each draft to the labels of the token it
began at."""

from __future__ import annotations

import bisect

from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.segmenter import segment
from agentspec_sdk.structure.token_labels import TokenClassifier

__all__ = ["TurnLabeller"]


class TurnLabeller:
    """`label(turn, fmt)` sets `turn["classes"]` (one letter per output token) and `turn["kinds"]` (one
    segment kind name per output token; `qualified`: "<format>.<kind>") from the turn's output ids and
    its agent format."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.classifier = TokenClassifier(tokenizer)

    def label(self, turn: dict, fmt: AgentFormat, qualified: bool = False) -> None:
        out = turn["out"]
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        spans = segment(fmt, text)
        turn["classes"] = self.classifier.labels(text, out, spans)
        prefix = f"{fmt.name}." if qualified else ""
        if not spans:
            turn["kinds"] = [prefix + fmt.initial] * len(out)
            return
        ends = [sp.end for sp in spans]
        kinds = []
        for at in self.classifier.starts(text, out):
            j = min(bisect.bisect_right(ends, at), len(spans) - 1)
            kinds.append(prefix + spans[j].kind)
        turn["kinds"] = kinds
