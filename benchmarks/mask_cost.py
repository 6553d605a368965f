"""What the exact-mask patch adds to vLLM's own grammar masks per step, by batch size.

vLLM 0.32 builds a speculative step's llguidance masks on the scheduler's thread, row after row
(`StructuredOutputManager.grammar_bitmask`: per row, fill the mask, accept the draft token, ... fill
the bonus position's mask, then `rollback` the walk), and advances each row's grammar over the tokens
it kept (`accept_tokens`, from `update_from_output`) and trims the next draft (`validate_tokens`,
from `update_draft_token_ids`). This drives vLLM's own `GuidanceGrammar` objects through exactly those
calls on real captured turns (`tests/data/{tool_calls,react,code}.capture.jsonl`: prompt and output
token ids; the turn grammars as captured, the ReAct turns' rebuilt with `turn_grammar` from the
capture's tools), in arms over the same rows and tokens, interleaved step by step (the arms' order
rotates every step):

- `vllm`: vLLM's class and tokenizer as they ship (`GuidanceBackend._build_ll_tokenizer`);
- `agentspec`: what an AgentSpec engine or `agentspec serve` runs, `patch_guidance` (exact masks) on
  a subclass and the tokenizer of a `GuidanceBackend` subclass with `patch_slices`;
- `exact-only` (`--arms`): `patch_guidance` with vLLM's own tokenizer (the exact-mask part alone);
- `slices-only` (`--arms`): vLLM's class with the `patch_slices` tokenizer (the slices part alone);
- `copy-per-fill` (`--arms`): the exact-mask patch before 2026-12 (every mask filled from a fresh
  `deep_copy` of the request's matcher, which never computes one: exact by construction, so the other
  arms' masks are compared with it when it runs), with the `patch_slices` tokenizer.

Times are the scheduler thread's CPU time (`time.thread_time`; `--clock wall` for wall time): on a
machine shared with other jobs, CPU time leaves out the time the thread waited for a core.

Rows: B rows, row r replays turn r mod n of the set (distinct copies: every row has its own
matchers), the rows' starting positions staggered over the turns; a row that reaches its turn's end
is replaced by the next turn (not timed: vLLM compiles grammars off the step's path). Each step a
row's draft is what a drafter rejected at a seeded random position k (uniform in 0..gamma) sends: the
turn's own next k tokens, a token the grammar allows there other than the target's, then the target's
tokens after the one it replaced as far as the grammar takes them (a walk the grammar accepts, as vLLM
walks only validated drafts; where the grammar allows only the target's token, or k = gamma, the
draft is kept whole). The row keeps the k tokens and the target's next one; every arm gets the same
drafts and tokens.

Reported per (set, B, arm): median and p90 ms per step of the masks (`grammar_bitmask`, all rows) and
of the grammar's whole step (masks + accept + validate), µs per row (median / B), the ratio of the
medians to the first arm's, llguidance calls per row and step (deep_copy, consume_tokens, rollback, masks,
validate_tokens) counted through a proxy on a second, untimed run of the cell (`--count`), and mask
rows that differ from `copy-per-fill`'s where it runs, else from the first arm's (after a rolled-back
walk vLLM's own masks can be wrong, which is what the patch is for); the 1-minute load average before
and after each cell.

    .venv/bin/python benchmarks/mask_cost.py [--batches 8,32,64,128] [--sets tool_calls,react,code]
        [--steps 20] [--warmup 3] [--gamma 8] [--arms vllm,agentspec] [--count] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ("tool_calls", "react", "code")
ARMS = ("vllm", "agentspec", "exact-only", "slices-only", "copy-per-fill")


def _offline():
    """benchmarks/offline_drafting.py (its capture reader, `load_turns`)."""
    import sys

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import offline_drafting

    return offline_drafting


def load_set(name: str) -> tuple[list[dict], list[str]]:
    """The set's turns and their Lark grammars (a turn's `grammar` indexes them)."""
    data = _offline().load_turns(ROOT / "tests" / "data" / f"{name}.capture.jsonl")
    turns = data["turns"]
    if data["grammars"]:
        return turns, data["grammars"]
    # the ReAct capture left its grammars out: rebuilt as the engine writes them (grammar_for)
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turn_grammar import turn_grammar

    registry = ToolRegistry()
    for tool in data["tools"]:
        registry.add(tool)
    fmts = sorted({t["fmt"] for t in turns})
    grammars = [turn_grammar(get_format(f), registry, tool_choice="auto") for f in fmts]
    return [{**t, "grammar": fmts.index(t["fmt"])} for t in turns], grammars


def _unwrapped(fn):
    """The function our patch wrapped (`functools.wraps` keeps it as `__wrapped__`), else `fn`."""
    while getattr(fn, "__code__", None) is not None and fn.__code__.co_filename.endswith("vllm_grammar.py") \
            and "agentspec_sdk" in fn.__code__.co_filename and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


class Setup:
    """vLLM's llguidance tokenizers and grammar classes, stock and patched."""

    def __init__(self):
        import llguidance.torch as llguidance_torch
        from transformers import AutoConfig
        from vllm.v1.structured_output.backend_guidance import GuidanceBackend, GuidanceGrammar

        from agentspec_sdk.backends.inside_vllm.vllm_grammar import _HOOKED, patch_guidance, patch_slices
        from agentspec_sdk.backends.model_bundle import load_tokenizer, resolve_model

        tokenizer = load_tokenizer(None)
        vocab = AutoConfig.from_pretrained(resolve_model(None)).vocab_size  # ModelConfig.get_vocab_size
        # vLLM's classes as vLLM ships them, also where this process already patched them (an
        # embedded engine installs both patches in-process): the patches wrap the originals
        GuidanceGrammar = type("GuidanceGrammar", (GuidanceGrammar,), {
            name: _unwrapped(getattr(GuidanceGrammar, name)) for name in _HOOKED})
        GuidanceBackend = type("GuidanceBackend", (GuidanceBackend,), {
            "_build_ll_tokenizer": staticmethod(_unwrapped(GuidanceBackend._build_ll_tokenizer))})

        class SlicedBackend(GuidanceBackend):
            pass

        class ExactGrammar(GuidanceGrammar):
            pass

        class CopyPerFill(GuidanceGrammar):
            def fill_bitmask(self, bitmask, idx: int) -> None:
                llguidance_torch.fill_next_token_bitmask(self.ll_matcher.deep_copy(), bitmask, idx)
                self.check_error()

        patch_slices(SlicedBackend)
        patch_guidance(ExactGrammar)
        stock = GuidanceBackend._build_ll_tokenizer(tokenizer, vocab)
        sliced = SlicedBackend._build_ll_tokenizer(tokenizer, vocab)
        self.vocab = vocab
        self.arms = {"vllm": (GuidanceGrammar, stock), "agentspec": (ExactGrammar, sliced),
                     "exact-only": (ExactGrammar, stock), "slices-only": (GuidanceGrammar, sliced),
                     "copy-per-fill": (CopyPerFill, sliced)}
        self._serialized: dict[str, str] = {}

    def grammar(self, arm: str, lark: str, counts: dict | None = None):
        """A request's grammar as `GuidanceBackend.compile_grammar` builds it; with `counts`, its
        matcher seen through a counting proxy."""
        import llguidance
        from vllm.v1.structured_output.backend_guidance import serialize_guidance_grammar
        from vllm.v1.structured_output.backend_types import StructuredOutputOptions

        if lark not in self._serialized:
            self._serialized[lark] = serialize_guidance_grammar(StructuredOutputOptions.GRAMMAR, lark)
        cls, ll_tokenizer = self.arms[arm]
        matcher = llguidance.LLMatcher(ll_tokenizer, self._serialized[lark],
                                       log_level=int(os.environ.get("LLGUIDANCE_LOG_LEVEL", "1")))
        if counts is not None:
            matcher = Counting(matcher, counts)
        grammar = cls(ll_matcher=matcher, ll_tokenizer=ll_tokenizer, vocab_size=self.vocab)
        grammar.check_error()
        return grammar


def grammar_bitmask(rows, bitmask, full_mask: int = -1) -> int:
    """`StructuredOutputManager.grammar_bitmask`'s serial path (vLLM 0.32) for rows of (grammar, draft),
    no reasoning parser: every position constrained. Returns the bitmask rows filled."""
    index = 0
    for grammar, draft in rows:
        advanced = 0
        failed = None
        for token in draft:
            if failed is not None:
                bitmask[index].copy_(bitmask[failed])
                index += 1
                continue
            if not grammar.is_terminated():  # _fill_bitmasks
                grammar.fill_bitmask(bitmask, index)
            else:
                bitmask[index].fill_(full_mask)
            if not grammar.is_terminated() and grammar.accept_tokens("r", [token]):
                advanced += 1
            else:
                failed = index
            index += 1
        if failed is not None:
            bitmask[index].copy_(bitmask[failed])
        elif not grammar.is_terminated():
            grammar.fill_bitmask(bitmask, index)
        else:
            bitmask[index].fill_(full_mask)
        index += 1
        if advanced > 0:
            grammar.rollback(advanced)
    return index


class Counting:
    """An LLMatcher seen through a proxy that counts llguidance calls (and the copies' calls)."""

    COUNTED = ("deep_copy", "consume_tokens", "rollback", "unsafe_compute_mask_ptr", "validate_tokens")

    def __init__(self, matcher, counts: dict):
        self._m, self._counts = matcher, counts

    def __getattr__(self, name):
        attr = getattr(self._m, name)
        if name not in self.COUNTED:
            return attr

        def call(*args, **kwargs):
            self._counts[name] = self._counts.get(name, 0) + 1
            out = attr(*args, **kwargs)
            return Counting(out, self._counts) if name == "deep_copy" else out
        return call


class Row:
    """One row: its turn, position, a grammar per arm, and a helper matcher (the stock class, kept
    tokens only, never computing a mask itself) that chooses the rejected drafts' tokens."""

    def __init__(self, setup: Setup, arms: list[str], turn: dict, grammar: str, start: int,
                 counts: dict | None):
        self.turn, self.pos = turn, start
        self.grammars = {arm: setup.grammar(arm, grammar, None if counts is None else counts[arm])
                         for arm in arms}
        self.helper = setup.grammar("agentspec", grammar).ll_matcher
        for g in self.grammars.values():
            if not g.accept_tokens("r", turn["out"][:start]):
                raise RuntimeError(f"the turn's grammar refuses its own output before {start}")
        self.helper.consume_tokens(turn["out"][:start])

    def tokens(self, start: int, n: int) -> list[int]:
        return self.turn["out"][self.pos + start:self.pos + start + n]

    def step(self, gamma: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """(draft, kept): k, uniform in 0..gamma, draft tokens are the target's; then a token the
        grammar allows other than the target's (rejected), then the target's tokens after the one it
        replaced, as far as the grammar takes them (a drafter that skipped a token). k = gamma, or a
        position where the grammar allows only the target's token: the draft is kept whole. kept:
        the draft's accepted tokens and the target's next token."""
        import numpy as np

        k = rng.randint(0, gamma)
        truth = self.tokens(0, gamma + 1)
        if k >= len(truth) - 1:  # kept whole: (up to) gamma draft tokens and the bonus token
            return truth[:gamma], truth
        probe = self.helper.deep_copy()
        probe.consume_tokens(truth[:k])
        allowed = np.flatnonzero(np.unpackbits(np.frombuffer(probe.compute_bitmask(), dtype=np.uint8),
                                               bitorder="little"))
        allowed = allowed[allowed != truth[k]]
        if len(allowed) == 0 or probe.is_stopped():
            return truth[:k], truth[:k + 1]
        alt = int(allowed[rng.randrange(len(allowed))])
        draft = truth[:k] + [alt]
        if probe.consume_tokens([alt]) and not probe.is_stopped():
            rest = self.tokens(k + 1, gamma - k - 1)
            draft += rest[:probe.validate_tokens(rest)]
        return draft, truth[:k + 1]

    def advance(self, kept: list[int]) -> None:
        self.helper.consume_tokens(kept)
        self.pos += len(kept)

    def done(self) -> bool:
        return self.pos >= len(self.turn["out"]) or self.helper.is_stopped()


def accepted_prefix(setup: Setup, turn: dict, grammar: str) -> int:
    """How many of the turn's output tokens its grammar accepts (a turn is replayed up to there)."""
    g = setup.grammar("vllm", grammar)
    for i, token in enumerate(turn["out"]):
        if g.is_terminated():
            return i
        if not g.accept_tokens("r", [token]):
            return i
    return len(turn["out"])


def run_cell(setup: Setup, turns: list[dict], grammars: list[str], batch: int, arms: list[str],
             steps: int, warmup: int, gamma: int, seed: int, counts: dict | None = None,
             clock=time.thread_time) -> dict:
    """One (set, B) cell: timings per arm, or with `counts` ({arm: {}}) the llguidance calls per row
    and step through counting proxies (the same rows and tokens; no timings)."""
    import llguidance.torch as lt

    rng = random.Random(seed)
    bitmasks = {arm: lt.allocate_token_bitmask(batch * (gamma + 1), setup.arms[arm][1].vocab_size)
                for arm in arms}
    next_turn = 0

    def new_row(start: int | None = None) -> Row:
        nonlocal next_turn
        turn = turns[next_turn % len(turns)]
        next_turn += 1
        first = 1 if start is None else 1 + start % max(len(turn["out"]) - 1, 1)
        return Row(setup, arms, turn, grammars[turn["grammar"]], first, counts)

    rows = [new_row(start=5 * r) for r in range(batch)]
    times = {arm: {"masks": [], "all": []} for arm in arms}
    differ = {arm: 0 for arm in arms}
    mask_rows = row_steps = 0
    load = [os.getloadavg()[0]]
    for step in range(warmup + steps):
        if counts is not None and step == warmup:
            for c in counts.values():
                c.clear()
        drafts, kept = zip(*(row.step(gamma, rng) for row in rows), strict=True)
        order = arms[step % len(arms):] + arms[:step % len(arms)]
        filled = {}
        for arm in order:
            work = [(row.grammars[arm], d) for row, d in zip(rows, drafts, strict=True)]
            t0 = clock()
            filled[arm] = grammar_bitmask(work, bitmasks[arm])
            t1 = clock()
            for (g, _), keep in zip(work, kept, strict=True):  # update_from_output
                g.accept_tokens("r", keep)
            for row, (g, _), keep in zip(rows, work, kept, strict=True):  # update_draft_token_ids
                g.validate_tokens(row.tokens(len(keep), gamma))
            t2 = clock()
            if step >= warmup:
                times[arm]["masks"].append(t1 - t0)
                times[arm]["all"].append(t2 - t0)
        if step >= warmup:
            row_steps += len(rows)
            ref_arm = "copy-per-fill" if "copy-per-fill" in arms else arms[0]
            ref = bitmasks[ref_arm][:filled[ref_arm]].numpy()
            mask_rows += filled[ref_arm]
            for arm in arms:
                differ[arm] += int((bitmasks[arm][:filled[arm]].numpy() != ref).any(axis=1).sum())
        for i, (row, keep) in enumerate(zip(rows, kept, strict=True)):
            row.advance(keep)
            if row.done():
                rows[i] = new_row()
    load.append(os.getloadavg()[0])
    out = {"batch": batch, "steps": steps, "load": load, "mask_rows": mask_rows, "arms": {}}
    if counts is not None:
        for arm in arms:
            per_row = {k: v / row_steps for k, v in sorted(counts[arm].items())}
            out["arms"][arm] = {"calls_per_row_step": per_row, "differ": differ[arm]}
        return out
    base = {what: statistics.median(times[arms[0]][what]) for what in ("masks", "all")}
    for arm in arms:
        cell = {}
        for what in ("masks", "all"):
            xs = sorted(times[arm][what])
            med = statistics.median(xs)
            cell[what] = {"median_ms": med * 1e3, "p90_ms": xs[int(0.9 * (len(xs) - 1))] * 1e3,
                          "us_per_row": med * 1e6 / batch, "ratio": med / base[what]}
        cell["differ"] = differ[arm]
        out["arms"][arm] = cell
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="8,32,64,128")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--arms", default="vllm,agentspec", help=f"from {','.join(ARMS)}; the first is the base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", action="store_true",
                    help="run each cell once more (untimed) counting llguidance calls per row and step")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        raise SystemExit(f"unknown arms {sorted(unknown)}; choose from {ARMS}")
    setup = Setup()
    results = []
    print(f"gamma {args.gamma}, {args.steps} steps after {args.warmup} warm-up, arms {arms} "
          f"(ratio: median / {arms[0]}'s), {args.clock} time, load average at start "
          f"{os.getloadavg()[0]:.2f}")
    for name in args.sets.split(","):
        turns, grammars = load_set(name)
        kept = []
        for t in turns:
            n = accepted_prefix(setup, t, grammars[t["grammar"]])
            if n < len(t["out"]):
                print(f"  {name}: a turn's grammar accepts {n} of its {len(t['out'])} tokens; "
                      "replayed to there")
            if n > 1:
                kept.append({**t, "out": t["out"][:n]})
        print(f"\n{name}: {len(kept)} turns, {sum(len(t['out']) for t in kept)} output tokens")
        print(f"  {'B':>4} {'arm':<11} {'masks ms med':>12} {'p90':>7} {'µs/row':>7} {'ratio':>6}"
              f" {'all ms med':>11} {'p90':>7} {'µs/row':>7} {'ratio':>6} {'differ':>9}  load 1m")
        for batch in (int(b) for b in args.batches.split(",")):
            cell = run_cell(setup, kept, grammars, batch, arms, args.steps, args.warmup, args.gamma,
                            args.seed, clock=time.thread_time if args.clock == "cpu" else time.perf_counter)
            if args.count:
                counted = run_cell(setup, kept, grammars, batch, arms, args.steps, args.warmup,
                                   args.gamma, args.seed, counts={arm: {} for arm in arms})
                for arm in arms:
                    cell["arms"][arm]["calls_per_row_step"] = counted["arms"][arm]["calls_per_row_step"]
            results.append({"set": name, **cell})
            for arm, c in cell["arms"].items():
                m, a = c["masks"], c["all"]
                print(f"  {batch:>4} {arm:<11} {m['median_ms']:>12.2f} {m['p90_ms']:>7.2f} "
                      f"{m['us_per_row']:>7.1f} {m['ratio']:>6.2f} {a['median_ms']:>11.2f} "
                      f"{a['p90_ms']:>7.2f} {a['us_per_row']:>7.1f} {a['ratio']:>6.2f} "
                      f"{c['differ']:>4}/{cell['mask_rows']:<4}  {cell['load'][0]:.2f}→{cell['load'][1]:.2f}")
                if "calls_per_row_step" in c:
                    print("       llguidance calls per row and step: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in c["calls_per_row_step"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
