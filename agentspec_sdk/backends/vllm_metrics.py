"""Accounting on the engine side: the proposer's records file, settled per request, and vLLM's counters.

The proposer appends JSON lines to the plan's records file: "draft" (each draft handed to vLLM, with the
history length `position` and fingerprint `prefix_hash` where it starts), "round" (the drafter's own
resolution of its previous draft, used for its online acceptance) and "step" (rows, proposer seconds,
errors). A finished request claims the drafts whose `(position, prefix_hash)` lie on its token history
and settles each against the final tokens: accepted = common prefix of draft and what followed.

The proposer rotates the file at the plan's `records_max_bytes` (renamed to `<name>.1`); the tail
follows by inode: it finishes the renamed file from where it stopped, then reads the new one. A file
rotated twice between two polls loses the middle one (`lost_rotations` counts them); each claim polls.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict, defaultdict, deque
from pathlib import Path

from agentspec_sdk.drafting.fingerprint import prefix_hashes
from agentspec_sdk.drafting.records import rotated_path

# Memory caps of a tail (measured with tracemalloc: ~1.4 kB per open draft, ~0.4 kB per step entry):
# drafts not yet claimed by a finished request (in flight, or of aborted requests, which age out),
# at most ~70 MB; the step log (the replay's cost fit), at most ~100 MB.
MAX_OPEN_DRAFTS = 50_000
MAX_STEP_LOG = 250_000
STEP_FIELDS = ("t", "rows", "drafted", "proposer_s", "ctx", "drafted_ctx", "drafted_s")


def _identity(fh) -> tuple[int, bytes]:
    """A file's inode and first line: inode numbers are reused once a rotated file is deleted, the
    first line (a timestamp or a prefix hash) tells two files apart."""
    inode = os.fstat(fh.fileno()).st_ino
    head = os.pread(fh.fileno(), 256, 0)
    return inode, head.split(b"\n", 1)[0] if b"\n" in head else b""


class RecordsTail:
    """Reads the records file incrementally and keeps unclaimed drafts and running totals."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._ident: tuple[int, bytes] | None = None  # (inode, first bytes) of the file being read
        self.lost_rotations = 0
        self.bad_lines = 0
        self._drafts: OrderedDict[tuple[int, int], dict] = OrderedDict()
        self.steps = 0
        self.rows = 0
        self.drafted = 0
        self.proposer_s = 0.0
        self.errors = 0
        self.batch_errors = 0
        self.rounds: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        self.step_log: deque[dict] = deque(maxlen=MAX_STEP_LOG)  # {t, rows, drafted, proposer_s, ctx, ...}

    def poll(self) -> None:
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return
        with fh:
            ident = _identity(fh)
            if self._ident is not None and ident != self._ident:  # rotated since the last poll
                self._finish_rotated()
                self._offset, self._partial = 0, b""
            elif os.fstat(fh.fileno()).st_size < self._offset:  # truncated in place: start again
                self._offset, self._partial = 0, b""
            self._ident = ident if ident[1] else None  # an empty file has no identity yet
            fh.seek(self._offset)
            data = fh.read()
        self._feed(data)

    def _finish_rotated(self) -> None:
        """The rest of the file we were reading, now at `<name>.1` (unless rotated away again)."""
        try:
            with rotated_path(self.path).open("rb") as old:
                if _identity(old) != self._ident:
                    self.lost_rotations += 1
                    return
                old.seek(self._offset)
                data = old.read()
        except FileNotFoundError:
            self.lost_rotations += 1
            return
        self._feed(data)
        self._partial = b""  # a rotated file ends with a whole line; anything else is cut off

    def _feed(self, data: bytes) -> None:
        if not data:
            return
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next poll
        for line in lines:
            if line.strip():
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut by a crash, or a file we mistook for another
                    self.bad_lines += 1
                    continue
                self._take(rec)

    def _take(self, rec: dict) -> None:
        kind = rec.get("type")
        if kind == "draft":
            key = (int(rec["position"]), int(rec["prefix_hash"]))
            self._drafts[key] = rec
            self._drafts.move_to_end(key)
            while len(self._drafts) > MAX_OPEN_DRAFTS:
                self._drafts.popitem(last=False)
        elif kind == "step":
            self.steps += 1
            self.rows += int(rec.get("rows", 0))
            self.drafted += int(rec.get("drafted", 0))
            self.proposer_s += float(rec.get("proposer_s", 0.0))
            self.errors += int(rec.get("errors", 0))
            self.batch_errors += int(bool(rec.get("batch_error")))
            if "t" in rec:
                self.step_log.append({k: rec[k] for k in STEP_FIELDS if k in rec})
        elif kind == "round":
            tot = self.rounds[(rec["law_class"], rec["source"])]
            tot[0] += 1
            tot[1] += int(rec["drafted"])
            tot[2] += int(rec["accepted"])

    def claim(self, prompt_ids: list[int], output_ids: list[int]) -> list[dict]:
        """The settled rounds of one finished request, in order (draft lines are removed once claimed)."""
        ids = list(prompt_ids) + list(output_ids)
        if not self._drafts or not output_ids:
            return []
        hashes = prefix_hashes(ids)
        records = []
        start = len(prompt_ids)
        for pos in range(start, len(ids)):
            rec = self._drafts.pop((pos, int(hashes[pos - 1])), None)
            if rec is None:
                continue
            tokens = rec["tokens"]
            following = ids[pos:pos + len(tokens)]
            accepted = 0
            for a, b in zip(tokens, following, strict=False):
                if a != b:
                    break
                accepted += 1
            # A draft at the very end of the output (the request stopped there) settles to what exists.
            records.append({"position": pos - start, "kind": rec["kind"], "law_class": rec["law_class"],
                            "source": rec["source"], "drafted": len(tokens), "accepted": accepted,
                            "tokens": list(tokens)})
        return records

    def steps_between(self, start: float, end: float) -> list[dict]:
        """The proposer's steps that began in [start, end] (wall-clock), oldest first."""
        return [dict(s) for s in self.step_log if start <= s["t"] <= end]

    def proposer_stats(self) -> dict:
        by_source = {f"{cls}/{src}": {"rounds": r, "drafted": d, "accepted": a}
                     for (cls, src), (r, d, a) in sorted(self.rounds.items())}
        return {"steps": self.steps, "rows": self.rows, "drafted": self.drafted,
                "proposer_s": self.proposer_s, "errors": self.errors, "batch_errors": self.batch_errors,
                "resolved_rounds": by_source, "lost_rotations": self.lost_rotations,
                "bad_lines": self.bad_lines}


def settle_against_vllm(records: list[dict], num_output: int, spec: dict | None) -> None:
    """Settle a finished request's drafts against vLLM's own verify steps (`per_step_accepted`,
    `per_step_drafted`, from `per_request_spec_decode_metrics="detailed"`), so that claimed acceptance
    is what vLLM verified:

    - each draft is paired with its verify step, in order; a draft that has no step was never verified
      (every token trimmed by the grammar, e.g. the token that completes the grammar, which the target
      then writes anyway): it counts `accepted = 0` and is marked `unverified`;
    - a paired draft accepts at most what its step accepted (a token the grammar trimmed was never
      verified, even when the target then wrote that same token);
    - a last draft that runs into the end of the output takes its step's count: the stop check
      (max_tokens, EOS) can drop tokens vLLM accepted; `beyond_output` says how many.
    Steps that cannot be paired (more steps than drafts: records lost) leave the records as they are."""
    if not records or not spec or not spec.get("per_step_accepted"):
        return
    accepted = [int(n) for n in spec["per_step_accepted"]]
    drafted = [int(n) for n in spec.get("per_step_drafted") or []]
    pairs = _pair_steps(records, accepted, drafted if len(drafted) == len(accepted) else None, num_output)
    if pairs is None:
        return
    for r, j in zip(records, pairs, strict=True):
        if j is None:
            if r["accepted"]:
                r["unverified"] = r["accepted"]
            r["accepted"] = 0
        else:
            r["accepted"] = min(r["accepted"], accepted[j])
    last, j = records[-1], pairs[-1]
    if j is None or last["position"] + last["accepted"] < num_output or last["accepted"] >= last["drafted"]:
        return
    verified = min(accepted[j], last["drafted"])
    if verified > last["accepted"]:
        last["beyond_output"] = verified - last["accepted"]
        last["accepted"] = verified


def _pair_steps(records: list[dict], accepted: list[int], drafted: list[int] | None,
                num_output: int) -> list[int | None] | None:
    """For each record the index of its verify step, or None (never verified); None when the steps
    cannot all be paired. One step per record is the common case; otherwise, while more records than
    steps remain, a record is skipped when the next step cannot be its own (vLLM accepted more than
    the record's common prefix — except for the last record at the end of the output — or verified
    more tokens than it drafted); records left after the last step were never verified."""
    n_r, n_s = len(records), len(accepted)
    if n_r == n_s:
        return list(range(n_r))
    if n_r < n_s:
        return None
    pairs: list[int | None] = []
    j = 0
    for i, r in enumerate(records):
        spare = (n_r - i) - (n_s - j)  # records that must go unpaired among those left
        if j == n_s:
            pairs.append(None)
            continue
        at_end = r["position"] + r["accepted"] >= num_output
        fits = accepted[j] <= r["accepted"] or (at_end and i == n_r - 1)
        if drafted is not None:
            fits = fits and drafted[j] <= r["drafted"]
        if spare > 0 and not fits:
            pairs.append(None)
            continue
        pairs.append(j)
        j += 1
    return pairs if j == n_s else None


def label_records(records: list[dict], labels: str, starts: list[int], spans) -> None:
    """Kind and law class of records that came without (vLLM's own drafters): those of the output
    token each draft began at (`labels`: one law-class letter per output token, `starts`: where each
    token begins in the text the `spans` cut)."""
    for r in records:
        pos = min(int(r["position"]), len(labels) - 1)
        if r.get("law_class") is None and pos >= 0:
            r["law_class"] = labels[pos]
            at = starts[pos]
            r["kind"] = next((s.kind for s in spans if s.start <= at < s.end),
                             spans[-1].kind if spans else "?")


def acceptance_by_class(records: list[dict]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in records:
        cls = out.setdefault(r["law_class"], {"rounds": 0, "drafted": 0, "accepted": 0})
        cls["rounds"] += 1
        cls["drafted"] += r["drafted"]
        cls["accepted"] += r["accepted"]
    return out


def merge_acceptance(total: dict, part: dict) -> None:
    for cls, counts in part.items():
        dst = total.setdefault(cls, {"rounds": 0, "drafted": 0, "accepted": 0})
        for k, v in counts.items():
            dst[k] = dst.get(k, 0) + v


def vllm_spec_counters(llm_engine) -> dict:
    """vLLM's speculative-decoding counters (totals since start)."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    try:
        metrics = llm_engine.get_metrics()
    except AssertionError:  # stat logging disabled
        return out
    for m in metrics:
        name = m.name.removeprefix("vllm:spec_decode_")
        if name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            out[name] += int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            vals = list(m.values)
            acc = out["accepted_per_pos"]
            out["accepted_per_pos"] = [a + b for a, b in zip(acc + [0] * (len(vals) - len(acc)), vals,
                                                             strict=False)]
    return out
