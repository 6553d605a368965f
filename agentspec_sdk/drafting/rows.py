"""The drafter's view of batch rows: what vLLM hands over per row (`RowInput`), the state kept per row
between steps (`RowState`) and a row's candidate draft before sizing (`Candidate`).

A `RowState` holds the row's decoded text, the segmenter over the model's turn, the lookup corpora
(earlier segments of each kind, from the prompt's earlier model turns and from this turn), the
tool-call matcher of the open segment and the draft awaiting resolution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agentspec_sdk.drafting.fingerprint import RollingHash
from agentspec_sdk.drafting.forced import CallMatcher
from agentspec_sdk.drafting.lookup import SEPARATOR, CorpusIndex
from agentspec_sdk.drafting.records import PendingDraft
from agentspec_sdk.drafting.suffix_source import SuffixTrees
from agentspec_sdk.drafting.text import HistoryText, TokenBytes
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.segmenter import Segmenter, segment


@dataclass(frozen=True, slots=True)
class RowInput:
    """One batch row: its whole history (prompt + output so far, including the tokens just sampled).

    `num_tokens` limits the history to `token_ids[:num_tokens]` (vLLM's `num_tokens_no_spec`).
    `draftable` is False for a row that sampled nothing this step (chunked prefill): it gets no draft.
    `sampled` is how many tokens the row got in the step just run (vLLM's `sampled_token_ids`): the
    draft verified in that step had `sampled - 1` tokens accepted; None where unknown.
    """

    token_ids: np.ndarray
    num_tokens: int | None = None
    draftable: bool = True
    sampled: int | None = None

    def history(self) -> np.ndarray:
        ids = np.asarray(self.token_ids)
        return ids if self.num_tokens is None else ids[: self.num_tokens]


@dataclass(slots=True)
class Candidate:
    tokens: list[int]
    sources: list[str]  # per token: forced | marker | repeat | lookup | suffix
    kind: str
    law_class: str
    confidences: list[float] | None = None  # per token, given the ones before (suffix trees); None: learned
    # what the budget sizes it by (`CandidateBuilder._confidences`), kept for the step it is built in
    priced: list[float] | None = None

    @property
    def source(self) -> str:
        return self.sources[0]


@dataclass(frozen=True, slots=True)
class RowContext:
    """What a row's state needs from the drafter that tracks it (and nothing else): the suffix trees
    (or None), the vocabulary's bytes, the chat template's turn markers and the format picker."""

    trees: SuffixTrees | None
    token_bytes: TokenBytes
    turn_start: str
    turn_end: str
    pick_format: Callable[[str], AgentFormat]


TAIL = 64  # tokens of its history a row state keeps (≥ the suffix trees' depth and the BPE anchor)


class RowState:
    """Cached state of one request's row. Per step it does work in the tokens the row gained, not in
    its history: the prompt's text is decoded and indexed once (`HistoryText.freeze`,
    `lookup.CorpusIndex`), the segmenter and the suffix tree are fed the new tokens only, and a row
    is recognised by its length and its last `TAIL` tokens."""

    __slots__ = ("tail", "n", "hash", "text", "fmt", "turn_char", "seg", "corpora", "prompt_text",
                 "call", "call_start", "pending", "contest", "trees", "tree_key")

    def __init__(self, drafter: RowContext, ids: np.ndarray):
        ids = np.asarray(ids, dtype=np.int64)
        self.tail = ids[-TAIL:].copy()
        self.n = len(ids)
        self.trees = drafter.trees
        self.tree_key = self.trees.start(ids) if self.trees is not None else -1
        self.hash = RollingHash.of(ids)
        self.text = HistoryText(drafter.token_bytes)
        self.text.extend(ids.tolist())
        full = self.text.text
        at = full.rfind(drafter.turn_start)
        self.turn_char = at + len(drafter.turn_start) if at >= 0 else 0
        self.text.freeze(self.turn_char)
        self.prompt_text = CorpusIndex(full[: self.turn_char])
        self.fmt = drafter.pick_format(full[: self.turn_char])
        pieces: dict[str, list[str]] = {}
        for turn in model_turns(full[: self.turn_char], drafter.turn_start, drafter.turn_end):
            for span in segment(self.fmt, turn):
                if span.end > span.start:
                    pieces.setdefault(span.kind, []).append(turn[span.start:span.end] + SEPARATOR)
        self.corpora: dict[str, CorpusIndex] = {k: CorpusIndex("".join(v)) for k, v in pieces.items()}
        for corpus in (self.prompt_text, *self.corpora.values()):
            corpus.prepare()
        self.seg = Segmenter(self.fmt)
        self._feed(full[self.turn_char:])
        self.call: CallMatcher | None = None
        self.call_start = -1
        self.pending: PendingDraft | None = None
        # the row's source choice this step, judged when the target's tokens come (drafter._resolve):
        # (choice key, the tree was chosen, the passed-over candidate's tokens as the budget would send them)
        self.contest: tuple | None = None

    def matches(self, ids: np.ndarray, max_growth: int) -> bool:
        n = self.n
        if not n <= len(ids) <= n + max_growth:
            return False
        if n and ids[n - 1] != self.tail[-1]:  # most rows tried against another row's state differ here
            return False
        k = len(self.tail)
        return np.array_equal(ids[n - k:n], self.tail)

    def advance(self, ids: np.ndarray) -> None:
        new = ids[self.n:]
        if not len(new):
            return
        self.tail = np.asarray(ids[-TAIL:], dtype=np.int64).copy()
        self.n = len(ids)
        new_list = new.tolist()
        self.hash.extend(new_list)
        if self.trees is not None:
            self.trees.extend(self.tree_key, new)
        self._feed(self.text.extend(new_list))

    def _feed(self, chunk: str) -> None:
        if not chunk:
            return
        base = self.turn_char
        for span in self.seg.feed(chunk):
            self._add_corpus(span.kind, self.text.slice(base + span.start, base + span.end))

    def _add_corpus(self, kind: str, text: str) -> None:
        if text:
            if kind not in self.corpora:
                self.corpora[kind] = CorpusIndex()
            self.corpora[kind].extend(text + SEPARATOR)

    def segment_text(self) -> str:
        return self.text.slice(self.turn_char + self.seg.current.start)

    @property
    def pending_len(self) -> int:
        return len(self.pending.tokens) if self.pending is not None else 0

    def forget(self) -> None:
        """The row left the batch: its prompt tree goes, its response stays in the global tree."""
        if self.trees is not None:
            self.trees.stop(self.tree_key)


def model_turns(prompt: str, turn_start: str, turn_end: str) -> list[str]:
    """Texts of the earlier model turns in a rendered prompt (between turn start and turn end)."""
    turns = []
    at = prompt.find(turn_start)
    while at >= 0:
        begin = at + len(turn_start)
        end = prompt.find(turn_end, begin) if turn_end else -1
        end = len(prompt) if end < 0 else end
        turns.append(prompt[begin:end])
        at = prompt.find(turn_start, end)
    return turns
