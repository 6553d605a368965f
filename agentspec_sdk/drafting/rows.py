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

from agentspec_sdk.drafting.fingerprint import RollingHash, prefix_hashes
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
    # what the budget sizes it by (`pricing.Estimates.confidences`), kept for the step it is built in
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
    is recognised by its length and its last `TAIL` tokens.

    A row whose history begins with the whole history of a row that left the batch (`prev`: an
    agent's next turn, which resends the previous turn's prompt and output) takes that row's state
    over and works only in the tokens between (`_continue`): the decoded text, the prompt tree, the
    prompt's gram index and the corpora of the earlier model turns are those a new row builds."""

    __slots__ = ("tail", "n", "hash", "text", "fmt", "turn_char", "seg", "corpora", "prompt_text",
                 "call", "call_start", "pending", "contest", "trees", "tree_key", "tree_draft",
                 "prompt_pieces", "last_turn")

    def __init__(self, drafter: RowContext, ids: np.ndarray, prev: RowState | None = None,
                 hashes: np.ndarray | None = None, response: int = 0):
        """`hashes`: `fingerprint.prefix_hashes(ids)` where the caller has them; `response`: the
        last tokens of `ids` the trees take as the row's response (`SuffixTrees.start`)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.tail = ids[-TAIL:].copy()
        self.n = len(ids)
        self.trees = drafter.trees
        self.hash = RollingHash.of(ids) if hashes is None else RollingHash.at(int(hashes[-1]), len(ids))
        if prev is None or not self._continue(drafter, ids, prev, response):
            self._build(drafter, ids, response)
        self.seg = Segmenter(self.fmt)
        self._feed(self.text.slice(self.turn_char))
        self.call: CallMatcher | None = None
        self.call_start = -1
        self.pending: PendingDraft | None = None
        # the trees' draft for this step (`SuffixTrees.step`): (tokens, confidences, extension's
        # tokens, their confidences), or (tokens, confidences) for vLLM's suffix draft; None: none
        self.tree_draft: tuple | None = None
        # the row's source choice this step, judged when the target's tokens come (`Accounting.resolve_row`):
        # (choice key, the tree was chosen, the passed-over candidate's tokens as the budget would send them)
        self.contest: tuple | None = None

    def _build(self, drafter: RowContext, ids: np.ndarray, response: int = 0) -> None:
        self.tree_key = self.trees.start(ids, response, defer=True) if self.trees is not None else -1
        self.text = HistoryText(drafter.token_bytes)
        self.text.extend(ids.tolist())
        full = self.text.text
        self._split(drafter, full)
        self.prompt_text = CorpusIndex(full[: self.turn_char])
        self.fmt = drafter.pick_format(full[: self.turn_char])
        self._index_turns(drafter, full[: self.turn_char], 0, {})

    def _continue(self, drafter: RowContext, ids: np.ndarray, prev: RowState, response: int = 0) -> bool:
        """Take `prev`'s state over (its history is `ids[:prev.n]`); False, with `prev` forgotten,
        where the new turn does not follow `prev`'s as a new row would see it (another format, no
        turn marker after `prev`'s turn): the caller builds the row anew."""
        self.text = text = prev.text
        text.extend(ids[prev.n:].tolist())
        full = text.text
        self._split(drafter, full)
        prompt = full[: self.turn_char]
        previous_turn = prev.turn_char - len(drafter.turn_start)
        fmt = drafter.pick_format(prompt)
        if prev.last_turn != previous_turn or previous_turn < 0 or self.turn_char <= prev.turn_char \
                or fmt is not prev.fmt:
            prev.forget()
            return False
        self.fmt = fmt
        self.tree_key = -1
        if self.trees is not None:
            key = self.trees.adopt(prev.tree_key, ids[prev.n:], response, defer=True)
            self.tree_key = key if key is not None else self.trees.start(ids, response, defer=True)
            if key is None:
                prev.forget()
        self.prompt_text = CorpusIndex.extending(prev.prompt_text, prompt)
        self._index_turns(drafter, prompt, previous_turn, prev.prompt_pieces, prev.corpora)
        return True

    def _split(self, drafter: RowContext, full: str) -> None:
        at = full.rfind(drafter.turn_start)
        self.turn_char = at + len(drafter.turn_start) if at >= 0 else 0
        self.text.freeze(self.turn_char)

    def _index_turns(self, drafter: RowContext, prompt: str, start: int, pieces: dict[str, str],
                     indexes: dict[str, CorpusIndex] | None = None) -> None:
        """The lookup corpora of the prompt's model turns from character `start` on, after `pieces`
        (per segment kind, the text of the turns before `start`; `indexes`: indexes whose indexed
        text may begin those corpora), and the prompt's own index."""
        found: dict[str, list[str]] = {}
        begins = []
        for begin, turn in turn_spans(prompt[start:], drafter.turn_start, drafter.turn_end):
            begins.append(start + begin)
            for span in segment(self.fmt, turn):
                if span.end > span.start:
                    found.setdefault(span.kind, []).append(turn[span.start:span.end] + SEPARATOR)
        # where the scan of the whole prompt began its last turn: a continuing row's scan from there
        # finds the turns a scan of its whole prompt finds
        self.last_turn = begins[-1] - len(drafter.turn_start) if begins else -1
        texts = dict(pieces)
        for kind, more in found.items():
            texts[kind] = texts.get(kind, "") + "".join(more)
        self.prompt_pieces = texts
        indexes = indexes or {}
        self.corpora: dict[str, CorpusIndex] = {
            k: CorpusIndex.extending(indexes[k], v) if k in indexes else CorpusIndex(v)
            for k, v in texts.items()}
        for corpus in (self.prompt_text, *self.corpora.values()):
            corpus.prepare()

    def matches(self, ids: np.ndarray, max_growth: int) -> bool:
        n = self.n
        if not n <= len(ids) <= n + max_growth:
            return False
        if n and ids[n - 1] != self.tail[-1]:  # most rows tried against another row's state differ here
            return False
        k = len(self.tail)
        return np.array_equal(ids[n - k:n], self.tail)

    def advance(self, ids: np.ndarray) -> np.ndarray:
        """The row's history is now `ids` (its own followed by the tokens the step gained): text,
        segments and lookup corpora follow; returns the new tokens, which the caller adds to the
        trees (`SuffixTrees.step`, in the batch's row order)."""
        new = ids[self.n:]
        if not len(new):
            return new
        self.tail = np.asarray(ids[-TAIL:], dtype=np.int64).copy()
        self.n = len(ids)
        new_list = new.tolist()
        self.hash.extend(new_list)
        self._feed(self.text.extend(new_list))
        return new

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


PARKED_ROWS = 256  # rows kept after they leave the batch, for their episode's next turn (`Parking`)
PARKED_TOKENS = 1_000_000  # and their histories' tokens at most (a prompt tree: ≈ 0.3 KB per token)


class Parking:
    """Row states that left the batch, kept for the next turn of their episode (`take`): at most
    `max_rows` of them and `max_tokens` tokens of history, the oldest forgotten first. A new row
    takes the parked state with the longest history that its own history begins with (same length,
    prefix hash and last `TAIL` tokens)."""

    def __init__(self, max_rows: int = PARKED_ROWS, max_tokens: int = PARKED_TOKENS):
        self.max_rows, self.max_tokens = max_rows, max_tokens
        self._rows: list[RowState | None] = [None] * max_rows
        self._lengths = np.zeros(max_rows, dtype=np.int64)  # 0: a free slot
        self._hashes = np.zeros(max_rows, dtype=np.uint64)
        self._order: list[int] = []  # occupied slots, oldest first
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._order)

    def park(self, st: RowState) -> None:
        if self.max_rows == 0 or st.n == 0:
            st.forget()
            return
        while self._order and (len(self._order) >= self.max_rows or self.tokens + st.n > self.max_tokens):
            self._remove(self._order[0]).forget()
        slot = int(np.flatnonzero(self._lengths == 0)[0])
        self._rows[slot] = st
        self._lengths[slot], self._hashes[slot] = st.n, np.uint64(st.hash.value)
        self._order.append(slot)
        self.tokens += st.n

    def take(self, ids: np.ndarray, hashes: np.ndarray) -> RowState | None:
        """The parked state `ids` continues (`hashes`: `prefix_hashes(ids)`), removed; None if none."""
        if not self._order:
            return None
        lengths = self._lengths
        slots = np.flatnonzero((lengths > 0) & (lengths < len(ids)))
        if not len(slots):
            return None
        slots = slots[hashes[lengths[slots] - 1] == self._hashes[slots]]
        for slot in slots[np.argsort(-lengths[slots], kind="stable")].tolist():
            st = self._rows[slot]
            if np.array_equal(ids[st.n - len(st.tail):st.n], st.tail):
                return self._remove(slot)
        return None

    def clear(self) -> None:
        while self._order:
            self._remove(self._order[0]).forget()

    def _remove(self, slot: int) -> RowState:
        st = self._rows[slot]
        self._rows[slot] = None
        self._lengths[slot] = 0
        self._order.remove(slot)
        self.tokens -= st.n
        return st


class RowTracker:
    """The batch's row states between steps: each row is recognised by its history (`match`), a row
    not followed is built or continues a parked one (`new_row`), rows that leave the batch are parked
    for their episode's next turn (`parked`). `context`: what building a row needs (`reset` with a
    new one forgets every row: the plan's formats or tools changed)."""

    def __init__(self, context: RowContext | None = None):
        self.context = context
        self.states: list[RowState | None] = []  # the last step's, per batch row
        self.parked = Parking()
        self.continued = 0  # new rows that took over a parked row's state

    def reset(self, context: RowContext) -> None:
        self.forget()
        self.parked.clear()
        self.context = context

    def forget(self) -> None:
        """Forget the rows of the batch (not the parked ones)."""
        for st in self.states:
            if st is not None:
                st.forget()
        self.states = []

    def match(self, histories: list[np.ndarray], growth: int) -> tuple[list[RowState | None], int]:
        """(each row's state, or None for a row not followed; how many rows that left the batch had a
        draft pending). A state matches a row whose history extends its own by at most `growth`
        tokens (or its pending draft and one); a row keeps its batch slot's state first."""
        old = self.states
        out: list[RowState | None] = [None] * len(histories)
        free = set(range(len(old)))
        for i, ids in enumerate(histories):
            if i < len(old) and old[i] is not None and old[i].matches(ids,
                                                                      max(growth, old[i].pending_len + 1)):
                out[i] = old[i]
                free.discard(i)
        if free:
            for i, ids in enumerate(histories):
                if out[i] is not None:
                    continue
                for j in sorted(free):
                    st = old[j]
                    if st is not None and st.matches(ids, max(growth, st.pending_len + 1)):
                        out[i] = st
                        free.discard(j)
                        break
        dropped = 0
        for j in free:
            if old[j] is not None:
                dropped += old[j].pending is not None
                self.parked.park(old[j])
        return out, dropped

    def new_row(self, ids: np.ndarray, response: int = 0) -> RowState:
        """A row not followed: it continues a parked row (its episode's previous turn) or is built
        from its history (`response`: see `RowState`)."""
        ids = np.asarray(ids, dtype=np.int64)
        hashes = prefix_hashes(ids)
        prev = self.parked.take(ids, hashes)
        self.continued += prev is not None
        return RowState(self.context, ids, prev, hashes, response)


def turn_spans(prompt: str, turn_start: str, turn_end: str) -> list[tuple[int, str]]:
    """(character offset, text) of the earlier model turns in a rendered prompt (between turn start
    and turn end)."""
    turns = []
    at = prompt.find(turn_start)
    while at >= 0:
        begin = at + len(turn_start)
        end = prompt.find(turn_end, begin) if turn_end else -1
        end = len(prompt) if end < 0 else end
        turns.append((begin, prompt[begin:end]))
        at = prompt.find(turn_start, end)
    return turns
