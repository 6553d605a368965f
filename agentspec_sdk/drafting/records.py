"""Accounting of draft rounds: what was drafted where, how much of it the target accepted.

A round is resolved at the next `propose` call that sees the same row: the tokens the row gained since
the draft started are compared with the draft (accepted = length of their common prefix). Resolved
rounds are kept in memory and, when the plan names a `records_path`, appended to it as JSON lines
(buffered, flushed once per step):

    {"type": "round", "position": 412, "prefix_hash": 1234..., "kind": "tool_call", "law_class": "S",
     "source": "forced", "drafted": 6, "accepted": 6}
    {"type": "step", "t": 1764512345.123456, "rows": 8, "drafted": 23, "proposer_s": 0.00041, "errors": 0}

`t` is the wall-clock time the step's `propose` call began: the gap to the next step's `t` is the
target pass that verified this step's drafts, which is how the replay fits the verify cost delta.

The file is bounded: when an append would take it past `max_bytes` (the plan's `records_max_bytes`,
default 64 MiB) it is renamed to `<name>.1` (replacing the previous one) and a new file begins, so the
records never take more than twice the cap on disk; `vllm_metrics.RecordsTail` follows the rename.
An `observer` (the Prometheus counters of `backends.inside_vllm.prom_metrics`) sees every resolved round
and every budget decision as it happens, which is how a server reports acceptance without any file.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from agentspec_sdk.law.estimators import OnlineAcceptance, OnlineCalibration

log = logging.getLogger("agentspec.drafting")

DEFAULT_RECORDS_MAX_BYTES = 64 << 20
# sources whose estimates are calibrated online by what the target accepted (`OnlineCalibration`):
# the suffix trees' own, and the lookups' learned acceptance
CALIBRATED_SOURCES = frozenset({"suffix", "lookup"})


def rotated_path(path: str | os.PathLike) -> Path:
    """Where a full records file goes when a new one begins."""
    path = Path(path)
    return path.with_name(path.name + ".1")


def append_records(path: Path, lines: list[str], max_bytes: int | None = None) -> None:
    """Append JSON lines to a records file, rotating it first when they would take it past `max_bytes`.
    One writer per file (the proposer's process); readers follow the rotation by inode."""
    out = RecordsFile(path, max_bytes)
    try:
        out.append(lines)
    finally:
        out.close()


class RecordsFile:
    """A records file its one writer keeps open: an append is one stat (the file may have been
    rotated or removed by someone else: then it is opened anew) and one write, 4.9 µs where opening
    and closing it for every step's lines (with the folder's check) took 19.5 µs.
    Rotation as `append_records`."""

    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._fh = None
        self._inode: int | None = None

    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        data = ("\n".join(lines) + "\n").encode("utf-8")
        cap = DEFAULT_RECORDS_MAX_BYTES if self.max_bytes is None else self.max_bytes
        fh = self._current()
        size = fh.tell()
        if size and size + len(data) > cap:
            self.close()
            os.replace(self.path, rotated_path(self.path))
            fh = self._current()
        fh.write(data)
        fh.flush()

    def _current(self):
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            inode = None
        if self._fh is None or inode != self._inode:
            self.close()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("ab")
            self._inode = os.fstat(self._fh.fileno()).st_ino
        return self._fh

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass(frozen=True, slots=True)
class DraftRound:
    """One resolved round. `position` is the history length when the draft was made (the draft's first
    token would be token number `position`); `prefix_hash` is fingerprint H(history[:position])."""

    position: int
    prefix_hash: int
    kind: str
    law_class: str
    source: str
    drafted: int
    accepted: int


@dataclass(slots=True)
class PendingDraft:
    position: int
    prefix_hash: int
    kind: str
    law_class: str
    source: str  # the first token's
    tokens: list[int]
    sources: list[str] | None = None  # per token (a draft chains forced text, lookups, repeats)
    # per token, its source's estimate before calibration (`pricing.Estimates.estimates`)
    confidences: list[float] | None = None


def agreement(draft, tokens) -> int:
    """How many leading tokens of `draft` equal `tokens`."""
    n = 0
    for drafted_tok, real_tok in zip(draft, tokens, strict=False):
        if int(drafted_tok) != int(real_tok):
            break
        n += 1
    return n


def resolve(pending: PendingDraft, new_tokens, verified: int | None = None) -> DraftRound:
    """Compare a draft with the tokens the row holds after it now. `verified`, when known, is how many
    draft tokens vLLM accepted in the step that verified this draft: a token the grammar trimmed was
    never verified, even when the target then wrote the same token, so acceptance never exceeds it."""
    accepted = agreement(pending.tokens, new_tokens)
    if verified is not None:
        accepted = min(accepted, max(0, int(verified)))
    return DraftRound(pending.position, pending.prefix_hash, pending.kind, pending.law_class,
                      pending.source, len(pending.tokens), accepted)


class Accounting:
    """Online acceptance per (law class, source), the round log and the step log."""

    def __init__(self, acceptance: OnlineAcceptance, records_path: str | os.PathLike | None = None,
                 keep: int = 1_000_000, records_max_bytes: int | None = None,
                 calibration: OnlineCalibration | None = None):
        self.acceptance = acceptance
        self.calibration = calibration if calibration is not None else OnlineCalibration()
        self.records: list[DraftRound] = []  # the first `keep` rounds, for in-process inspection
        self.records_path = Path(records_path) if records_path else None
        self.records_max_bytes = records_max_bytes  # None: DEFAULT_RECORDS_MAX_BYTES
        self.keep = keep
        self.observer = None  # .round(rnd, sources) and .sized(law_class, candidate, drafted) when set
        self.withheld = 0  # candidate tokens the budget did not hand to vLLM
        self.gated = 0  # rows with a candidate that got no draft at all
        self._buffer: list[str] = []
        self._write_failing = False  # the last write to the records file failed (warned once)
        self._file: RecordsFile | None = None  # the records file, kept open between steps
        self._totals: dict = defaultdict(lambda: [0, 0, 0])  # (class, source) -> rounds, drafted, accepted
        self.steps = 0
        self.rows_seen = 0
        self.proposer_s = 0.0
        self.errors = 0  # rows that got no draft because drafting them failed (all rows of a failed step)
        self.batch_errors = 0  # steps that failed as a whole: no row got a draft
        self.rebuilds = 0
        self.dropped = 0  # drafts whose row left the batch before they could be resolved

    def resolve_row(self, st, ids, sampled: int | None, judge) -> int:
        """Resolve row state `st`'s pending draft (`rows.RowState.pending`) against the history `ids`
        it now has: accounted here, the row's source choice (`st.contest`) judged by `judge`
        (`choice.ChoiceBias.judge`); the draft tokens accepted. `sampled`: the tokens the step that
        just ran gave the row (vLLM's count), where known."""
        pending = st.pending
        if pending is None or len(ids) <= pending.position:
            return 0
        st.pending = None
        # verified in the step that just ran only when the draft began where that step's tokens begin
        verified = sampled - 1 if sampled and len(ids) - sampled == pending.position else None
        rnd = resolve(pending, ids[pending.position:].tolist(), verified)
        self.add(rnd, pending.sources, pending.confidences)
        if st.contest is not None:
            judge(st.contest, rnd.accepted, ids[pending.position:].tolist())
            st.contest = None
        return rnd.accepted

    def add(self, rnd: DraftRound, sources: list[str] | None = None,
            confidences: list[float] | None = None) -> None:
        """`sources`: per drafted token. The acceptance of each source is learned from its own run of
        tokens: the tokens before the first rejection were accepted, the rejected token counts against
        its source, and runs after it tell nothing (the target never judged them). `confidences`: per
        drafted token, its source's estimate before calibration; those of `CALIBRATED_SOURCES` are
        calibrated by it."""
        if sources and len(sources) == rnd.drafted:
            calibrate = confidences is not None and len(confidences) == rnd.drafted
            for source, start, end in _runs(sources):
                if start > rnd.accepted:
                    break
                accepted = min(end, rnd.accepted) - start
                self.acceptance.update(rnd.law_class, source, end - start, accepted, rnd.kind)
                if calibrate and source in CALIBRATED_SOURCES:
                    self.calibration.update(rnd.law_class, rnd.kind, source, confidences[start:end], accepted)
        else:
            self.acceptance.update(rnd.law_class, rnd.source, rnd.drafted, rnd.accepted, rnd.kind)
        tot = self._totals[(rnd.law_class, rnd.source)]
        tot[0] += 1
        tot[1] += rnd.drafted
        tot[2] += rnd.accepted
        if len(self.records) < self.keep:
            self.records.append(rnd)
        if self.records_path is not None:
            self._buffer.append(json.dumps({"type": "round", **asdict(rnd)}))
        if self.observer is not None:
            self.observer.round(rnd, sources)

    def sized(self, decisions) -> None:
        """The budget's decisions of one step: (law class, candidate tokens, drafted tokens) per row
        that had a candidate."""
        for law_class, candidate, drafted in decisions:
            self.withheld += candidate - drafted
            self.gated += drafted == 0
            if self.observer is not None:
                self.observer.sized(law_class, candidate, drafted)

    def end_step(self, rows: int, drafted: int, seconds: float, errors: int, at: float | None = None,
                 extra: dict | None = None) -> None:
        """`at`: wall-clock time (time.time()) the step began; default: now minus `seconds`; `extra`:
        more fields for the step line (context tokens, drafted tokens × context, schema-class drafts)."""
        self.steps += 1
        self.rows_seen += rows
        self.proposer_s += seconds
        self.errors += errors
        if self.records_path is not None:
            at = time.time() - seconds if at is None else at
            self._buffer.append(json.dumps({"type": "step", "t": round(at, 6), "rows": rows,
                                            "drafted": drafted,
                                            "proposer_s": round(seconds, 7), "errors": errors,
                                            **(extra or {})}))
            self.flush()

    def flush(self) -> None:
        if self.records_path is None or not self._buffer:
            return
        self.write(self._buffer)
        self._buffer.clear()

    def write(self, lines: list[str]) -> None:
        """Append lines to the records file (rotated at `records_max_bytes`); nothing without one. Lines
        that cannot be written are lost with a warning (once until a write succeeds again): drafting
        goes on without records."""
        if self.records_path is None:
            return
        out = self._file
        if out is None or out.path != self.records_path:  # the plan may name another file
            if out is not None:
                out.close()
            out = self._file = RecordsFile(self.records_path)
        out.max_bytes = self.records_max_bytes
        try:
            out.append(lines)
        except OSError as exc:
            out.close()
            if not self._write_failing:
                log.warning("cannot write draft records to %s (%s); drafting goes on without them",
                            self.records_path, exc)
            self._write_failing = True
        else:
            self._write_failing = False

    def stats(self) -> dict:
        by_class: dict = {}
        by_source: dict = {}
        for (cls, src), (rounds, drafted, accepted) in sorted(self._totals.items()):
            by_class.setdefault(cls, {"rounds": 0, "drafted": 0, "accepted": 0})
            by_class[cls]["rounds"] += rounds
            by_class[cls]["drafted"] += drafted
            by_class[cls]["accepted"] += accepted
            by_source[f"{cls}/{src}"] = {"rounds": rounds, "drafted": drafted, "accepted": accepted,
                                          "alpha": self.acceptance.alpha(cls, src)}
        return {
            "steps": self.steps,
            "rows": self.rows_seen,
            "errors": self.errors,
            "batch_errors": self.batch_errors,
            "rebuilds": self.rebuilds,
            "dropped": self.dropped,
            "proposer_s": self.proposer_s,
            "us_per_row": 1e6 * self.proposer_s / self.rows_seen if self.rows_seen else 0.0,
            "by_class": by_class,
            "by_source": by_source,
            "withheld": self.withheld,
            "gated": self.gated,
            "calibration": self.calibration.snapshot(),
        }

    def reset(self) -> None:
        """Forget counters and records (the learned acceptance stays)."""
        self.flush()
        self.records.clear()
        self._totals.clear()
        self.steps = self.rows_seen = self.errors = self.batch_errors = self.rebuilds = self.dropped = 0
        self.withheld = self.gated = 0
        self.proposer_s = 0.0


def _runs(sources: list[str]):
    """(source, start, end) of each run of equal sources."""
    start = 0
    for i in range(1, len(sources) + 1):
        if i == len(sources) or sources[i] != sources[start]:
            yield sources[start], start, i
            start = i
