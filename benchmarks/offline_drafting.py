"""Drafters compared offline on real agent turns: structure vs vLLM's ngram and suffix proposers.

Step 1 (`--capture`, needs the engine, ≈ 80 s on the bundled traces): replay a trace file (arm D;
`--traces`, default the bundled BFCL multi-turn set) with speculation off (b=8) and capture every
turn (`Engine(capture=DIR)`: prompt and output token ids, grammar, format, tools; docs/capture.md).
Any capture replays here, `agentspec serve --capture`'s too (`turns_from_capture`). Step 2 (no
engine, seconds): replay those turns through each drafter with greedy verification simulated
against the recorded outputs (at
temperature 0 the target writes the same tokens whatever was drafted): each step every active row
gets a draft, trimmed to the request grammar as vLLM does before verifying (turns captured
without a Lark grammar are replayed untrimmed); the draft's common prefix with the real continuation is
accepted, plus one token. Rows start as the engine starts agents' turns (`--schedule agents`: up to
`--batch` rows, a turn once its episode's previous turn has finished; `groups`, the replay before
2026-12-02, ran the turns `--batch` at a time, so a turn could run beside its own episode's earlier
turn), and a finished row's last tokens reach the drafters once more, as vLLM's proposer sees them.

Rows: `ngram` (vLLM's ngram proposer, n 2..5), `suffix` (arctic-inference's SuffixDecodingCache
driven exactly as vLLM 0.32's SuffixDecodingProposer drives it, vLLM's defaults), `structure` (the
product's drafter, its suffix-tree source included), `structure-plain` (without that source),
`union` (per step, the longer of the structure-plain and suffix drafts after the grammar: what a
proposer holding both could send), `union-bound` (per step, the one of the two that gets more
tokens accepted: needs the future, a bound on any choice between them) and `oracle` (exactly the
next gamma tokens the target writes: no drafter can do better at that gamma). `--ideas` adds rows
pricing candidate drafting knowledge (see IDEAS).

Reported per drafter: target passes (per row), drafted and accepted tokens, and a cost in passes,
`passes + delta * drafted` (delta = cost of one extra verified token per row of a pass: 0.2 at 8 rows
by the bench's step-log fit on 2 CPU cores, 3.2 ms per drafted token against 73 ms per pass + 6.6 ms
per row), whose ratio to `off` predicts the decode speedup; `÷stock` is the best stock drafter's
(ngram, suffix) cost divided by the row's (> 1: cheaper than what vLLM ships). The structure rows'
drafter is priced at that delta (`priced`: the engine's drafter learns its price from the passes it
times; a replay has none), so they do not depend on the plan's prior.

`--capture --arm A` captures the prose arm (no grammar; the replay adds the prose format).

  flock /tmp/agentspec-engine.lock python benchmarks/offline_drafting.py --capture CAPTURE_DIR [--traces FILE]
  python benchmarks/offline_drafting.py CAPTURE... [--gammas 8,16] [--delta 0.2] [--ideas] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json

from agentspec_sdk.backends.offline_peers import SuffixDrafter, ngram_drafter
from agentspec_sdk.backends.offline_peers import cut_at_confidence as _cut
from agentspec_sdk.tuning.candidates import SUFFIX_GRID, StructureCall, priced
from agentspec_sdk.tuning.candidates import structure_drafter as _structure_drafter
from agentspec_sdk.tuning.simulate import SCHEDULES, predecessors, simulate
from agentspec_sdk.tuning.simulate import agree as _agree
from agentspec_sdk.tuning.trim import GrammarTrim

# the replay, its drafters and the grammar trim live in the product (agentspec_sdk.tuning, `agentspec
# tune`); this bench adds the rows that price ideas and the --explain classification
__all__ = ["SCHEDULES", "SUFFIX_GRID", "GrammarTrim", "StructureCall", "SuffixDrafter", "ngram_drafter",
           "predecessors", "priced", "simulate"]


def capture(path: str, episodes: int, segments: int, max_tokens: int, traces: str | None = None,
            arm_name: str = "D") -> None:
    """The off engine's turns of one arm, captured (`Engine(capture=path)`: a capture directory,
    docs/capture.md)."""
    from agentspec_sdk.backends.capture import read_capture
    from agentspec_sdk.backends.embedded.vllm_engine import Engine
    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.replay.arms import PROSE, build_arm
    from agentspec_sdk.replay.replayer import replay
    from agentspec_sdk.replay.runner import _unique_tools
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    arm = build_arm(arm_name, episodes, max_tokens=max_tokens, max_segments=segments, trace_path=traces)
    tools = _unique_tools([arm])
    prose = bool(arm.episodes) and arm.episodes[0].format == PROSE.name  # arm A
    formats = [REACT, TOOL_CALLS, CODE_AGENT] + ([PROSE] if prose else [])
    engine = Engine(speculation="off", formats=formats, enforce_eager=True, capture=path)
    engine.register_tools(tools)
    try:
        replay(engine, arm.episodes, tokenizer=load_tokenizer(None), concurrency=8, max_tokens=max_tokens,
               max_segments=segments, max_steps=arm.max_steps, grammar=arm.grammar, fmt=arm.fmt)
    finally:
        engine.close()
    turns = read_capture([path]).turns
    print(f"{len(turns)} turns, {sum(len(t.out) for t in turns)} output tokens -> {path}")


def turns_from_capture(capture) -> tuple[list[dict], list[str], list[dict]]:
    """A capture (`backends.capture.read_capture`) as this replay's turns: `{prompt, out, grammar, fmt}`
    (`grammar`: an index into the Lark grammars, absent for a turn sent without one, which replays
    untrimmed; `fmt` absent where the capture names no format), the grammars, and the tools of every
    turn (the first of each name), in the order the turns were captured."""
    turns: list[dict] = []
    grammars: list[str] = []
    tools: list[dict] = []
    names: set[str] = set()
    for t in capture.turns:
        turn: dict = {"prompt": list(t.prompt), "out": list(t.out)}
        if t.grammar is not None and t.grammar.kind == "lark":
            if t.grammar.text not in grammars:
                grammars.append(t.grammar.text)
            turn["grammar"] = grammars.index(t.grammar.text)
        if t.format is not None:
            turn["fmt"] = t.format
        for tool in t.tools or []:
            name = tool.get("function", {}).get("name")
            if name not in names:
                names.add(name)
                tools.append(tool)
        turns.append(turn)
    return turns, grammars, tools


def load_turns(path) -> dict:
    """`{"turns", "grammars", "tools"}` of a capture file or directory (`turns_from_capture`); the
    reader's notes (a truncated last line skipped) go to stderr."""
    import sys

    from agentspec_sdk.backends.capture import read_capture

    capture = read_capture([path])
    for note in capture.notes:
        print(f"# {note}", file=sys.stderr)
    turns, grammars, tools = turns_from_capture(capture)
    return {"turns": turns, "grammars": grammars, "tools": tools}


class SuffixTrees:
    """Variants of the suffix drafter on arctic-inference's raw SuffixTree (the same trees and
    speculate call SuffixDecodingCache uses: a per-request tree over prompt + own response, a global
    tree over responses, the higher-scoring draft wins, ties to the request's own tree), to price
    where its knowledge comes from. `share`: "all" (every response, the in-flight rows of the batch
    included: SuffixDecodingCache, same counts as SuffixDrafter), "finished" (responses enter the
    global tree when they finish: no lookup across the rows of the same batch), "none" (no global
    tree: the request's own prompt and response only). `key(prompt) -> hashable`: one global tree
    per key (e.g. the system prompt, i.e. the tool set), so values recur only among requests with
    the same tools; the proposer sees prompts, so such keys need no request ids."""

    keyed = True

    def __init__(self, gamma: int, *, share: str = "all", key=None, max_tree_depth: int = 24,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1, cut: float = 0.0):
        from arctic_inference.suffix_decoding._C import SuffixTree

        if share not in ("all", "finished", "none"):
            raise ValueError(f"share must be all, finished or none, got {share!r}")
        self._tree = SuffixTree
        self.gamma, self.depth, self.share, self.key = gamma, max_tree_depth, share, key
        self.factor, self.min_prob, self.cut = max_spec_factor, min_token_prob, cut
        self.local: dict = {}  # row key -> (tree over prompt + response, global tree key, seq id, response)
        self.globals: dict = {}
        self.next_seq = 0

    def _global(self, gkey):
        if gkey not in self.globals:
            self.globals[gkey] = self._tree(self.depth)
        return self.globals[gkey]

    def __call__(self, rows) -> list[list[int]]:
        drafts = []
        for key, prompt_len, history, new in rows:
            if key not in self.local:
                tree = self._tree(self.depth)
                tree.extend(0, [int(t) for t in history[:prompt_len]])
                gkey = self.key(history[:prompt_len]) if self.key else None
                self.local[key] = (tree, gkey, self.next_seq, [])
                self.next_seq += 1
            tree, gkey, seq, response = self.local[key]
            new = [int(t) for t in new]
            tree.extend(0, new)
            response.extend(new)
            if self.share == "all":
                self._global(gkey).extend(seq, new)
            pattern = [int(t) for t in history[max(0, len(history) - self.depth):]]
            args = (pattern, self.gamma, self.factor, 0.0, self.min_prob, False)
            best = tree.speculate(*args)
            if self.share != "none" and gkey in self.globals:
                other = self.globals[gkey].speculate(*args)
                if other.score > best.score:
                    best = other
            drafts.append(_cut(best.token_ids, best.probs, self.cut))
        return drafts

    def retire(self, key, new: list[int]) -> None:
        tree, gkey, seq, response = self.local.pop(key)
        new = [int(t) for t in new]
        if self.share == "all":
            self._global(gkey).extend(seq, new)
        elif self.share == "finished":
            self._global(gkey).extend(seq, response + new)


def system_prompt_key(tokenizer_name: str | None = None):
    """Key = the prompt up to its first user message (system prompt + tool list)."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    start = AutoTokenizer.from_pretrained(resolve_model(tokenizer_name)).convert_tokens_to_ids("<|im_start|>")

    def key(prompt) -> tuple:
        ids = [int(t) for t in prompt]
        opens = [j for j, t in enumerate(ids) if t == start]
        return tuple(ids[:opens[1]] if len(opens) > 1 else ids)
    return key


def longer(drafts: list[list[int]], truth: list[int], **_) -> int:
    """Per step the longest draft (ties: the first drafter's): what a proposer holding both can do."""
    return max(range(len(drafts)), key=lambda j: (len(drafts[j]), -j))


def better(drafts: list[list[int]], truth: list[int], **_) -> int:
    """Per step the draft that gets most tokens accepted (ties: the shorter): needs the future."""
    return max(range(len(drafts)), key=lambda j: (_agree(drafts[j], truth), -len(drafts[j]), -j))


class ExpectedGain:
    """Per step, of the structure draft and the suffix draft, the one (and its length) with the larger
    expected saving E[accepted] - delta * length, or no draft when neither pays: what a proposer holding
    both sources can decide without the future. Suffix tokens carry the tree's path probability; a
    structure token at position j is accepted with probability a**j, a learned per law class of the
    draft (Beta(1, 1) prior) from the tokens the target revealed after each step (the accepted ones
    plus one), as a proposer sees them at its next step; tokens after the first a**j <= delta, or
    after the first suffix probability <= delta, are not sent."""

    def __init__(self, structure: StructureCall, suffix: SuffixDrafter, delta: float):
        self.structure, self.suffix, self.delta = structure, suffix, delta
        self.counts: dict = {}  # law class -> [accepted, rejected] judged structure tokens

    def __call__(self, drafts: list[list[int]], truth: list[int], key=None,
                 index: int = 0) -> tuple[int, int]:
        st, sx = drafts
        cls = self.structure.classes[index] if index < len(self.structure.classes) else None
        hits, misses = self.counts.get(cls, (1, 1))
        a = hits / (hits + misses)
        n_st, gain_st, p = 0, 0.0, 1.0
        while n_st < len(st) and p * a > self.delta:
            p *= a
            n_st += 1
            gain_st += p - self.delta
        probs = self.suffix.probs.get(key, [])
        n_sx, gain_sx = 0, 0.0
        while n_sx < len(sx) and n_sx < len(probs) and probs[n_sx] > self.delta:
            gain_sx += probs[n_sx] - self.delta
            n_sx += 1
        pick, n = (0, n_st) if gain_st >= gain_sx else (1, n_sx)
        revealed = _agree(drafts[pick][:n], truth) + 1
        if st:  # what the next step shows of the structure draft, sent or not
            agree = _agree(st, truth)
            c = self.counts.setdefault(cls, [1, 1])
            c[0] += min(agree, revealed)
            c[1] += 1 if agree < min(len(st), revealed) else 0
        return pick, n


class Explainer:
    """`choose` for simulate over (structure, suffix): always structure's draft (so the replay is the
    `structure` row), and per step a comparison with what vLLM's suffix proposer drafts from the same
    history (both trimmed by the request grammar). A *loss* step: suffix's draft is accepted further
    than structure's; a *pay* step: structure is accepted no less but has more rejected (verified,
    wasted) tokens than suffix. Each is classified by its cause from what the drafter weighed
    (`StructureDrafter.explain` notes); see LOSS_CAUSES and PAY_CAUSES. Counted per format, per law
    class of the token the draft began at, and per source of structure's draft."""

    def __init__(self, structure: StructureCall, turns: list[dict], label: str):
        self.structure, self.turns, self.label = structure, turns, label
        self.rows: list[dict] = []  # one per loss or pay step

    def __call__(self, drafts: list[list[int]], truth: list[int], key=None, index: int = 0) -> int:
        st, sx = drafts
        # the turn's last token comes with the pass either way (the target's own token): accepting
        # it as a draft token saves nothing, so it is neither a loss nor a gain
        last = len(truth) - 1
        a_st, a_sx = min(_agree(st, truth), last), min(_agree(sx, truth), last)
        turn = self.turns[key]
        pos = len(turn["out"]) - len(truth)
        notes = self.structure.notes
        note = notes[index] if index < len(notes) else {}
        base = {"set": self.label, "fmt": turn.get("fmt", "tool_calls"),
                "law_class": turn["classes"][pos] if "classes" in turn else "?"}
        if a_sx > a_st:
            cause, source = loss_cause(note, truth, a_sx)
            self.rows.append({**base, "kind": "loss", "cause": cause, "source": source,
                              "tokens": a_sx - a_st})
        else:
            extra = (len(st) - a_st) - (len(sx) - a_sx)
            if extra > 0:
                cause, source = pay_cause(note, a_st)
                self.rows.append({**base, "kind": "pay", "cause": cause, "source": source, "tokens": extra})
            elif a_st > a_sx:
                self.rows.append({**base, "kind": "gain", "cause": "gain", "source": _source(note),
                                  "tokens": a_st - a_sx})
        return 0


LOSS_CAUSES = {
    "budget": "the chosen candidate held the accepted tokens, the budget (price) sent fewer",
    "gate": "the chosen candidate held accepted tokens, the budget sent none",
    "forced-first": "forced text / a begun marker went first; the tree's draft was accepted further",
    "source choice": "own candidate chosen by expected length; the tree's (cut) draft was accepted further",
    "tree chosen": "the tree draft chosen by expected length; own candidate was accepted further",
    "segment cut": "the tree's draft was cut at the segment end; uncut it was accepted further",
    "tree differs": "the drafter's own tree gave a shorter accepted draft than vLLM's suffix (tree state)",
    "no candidate": "neither source had a draft for the row",
}
PAY_CAUSES = {
    "<source> rejected": "structure sent more rejected tokens than suffix, the first rejected one from "
                         "<source>",
}


def _source(note: dict) -> str:
    chosen = note.get("chosen")
    return chosen.source if chosen is not None else "none"


def loss_cause(note: dict, truth: list[int], a_sx: int) -> tuple[str, str]:
    """(cause, source of structure's candidate) of a step where suffix's draft was accepted further."""
    chosen, own, tree = note.get("chosen"), note.get("own"), note.get("tree")
    sent, raw = note.get("sent") or [], note.get("tree_raw") or []
    a = lambda c: _agree(c.tokens, truth) if c is not None else 0  # noqa: E731
    source = _source(note)
    if chosen is not None and _agree(sent, truth) < a(chosen):
        return ("budget" if sent else "gate"), source
    if chosen is not None and chosen is own and tree is not None and a(tree) > a(own):
        return ("forced-first" if note.get("rule") == "forced-first" else "source choice"), source
    if note.get("rule") == "unpaid" and a(tree) > 0:  # the tree lost to a lookup not worth sending
        return "source choice", "lookup"
    if chosen is not None and chosen is tree and own is not None and a(own) > a(tree):
        return "tree chosen", source
    if _agree(raw, truth) > max(a(tree), a(chosen)):
        return "segment cut", source
    if _agree(raw, truth) < a_sx:
        return "tree differs", source
    return ("no candidate" if chosen is None else "other"), source


def pay_cause(note: dict, a_st: int) -> tuple[str, str]:
    chosen, sent = note.get("chosen"), note.get("sent") or []
    if chosen is None or a_st >= len(sent):
        return "trim", _source(note)
    src = chosen.sources[a_st] if a_st < len(chosen.sources) else chosen.source
    return f"{src} rejected", _source(note)


def explain_rows(turns: list[dict], tools: list[dict], grammars: list[str], gamma: int, batch: int,
                 label: str, boundary: str = "price", schedule: str = "agents",
                 delta: float | None = None) -> tuple[list[dict], dict]:
    """The loss/pay/gain steps of structure against suffix on one capture, and the structure row
    (`delta`: the drafter priced as a cost at that delta charges, `priced`; None: at its plan's prior)."""
    price = priced(delta, batch) if delta is not None else {}
    structure = structure_drafter(gamma, tools, explain=True, boundary=boundary, **price)
    explainer = Explainer(structure, turns, label)
    row = simulate(turns, (structure, SuffixDrafter(gamma)), batch, trim=GrammarTrim(grammars),
                   choose=explainer, schedule=schedule)
    return explainer.rows, row


def explain_table(rows: list[dict]) -> str:
    """Counts per cause: steps and tokens per (trace set, format) column, then per law class and per
    source of structure's draft."""
    from collections import defaultdict

    out = []
    cols = sorted({(r["set"], r["fmt"]) for r in rows})
    for kind, title in (("loss", "LOSS steps: suffix's draft accepted further (tokens: accepted lost)"),
                        ("pay", "PAY steps: structure verifies more rejected tokens (tokens: extra)"),
                        ("gain", "GAIN steps: structure accepted further (tokens: accepted gained)")):
        sel = [r for r in rows if r["kind"] == kind]
        out.append(title)
        head = f"  {'cause':<22}" + "".join(f" {s[:10] + '/' + f[:10]:>22}" for s, f in cols)
        head += f" {'total':>12}"
        out.append(head)
        table: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for r in sel:
            for c in ((r["set"], r["fmt"]), "total"):
                cell = table[r["cause"]][c]
                cell[0] += 1
                cell[1] += r["tokens"]
        for cause in sorted(table, key=lambda c: -table[c]["total"][1]):
            line = f"  {cause:<22}"
            for c in cols:
                n, t = table[cause].get(c, [0, 0])
                line += f" {f'{n} st / {t} tok':>22}"
            n, t = table[cause]["total"]
            line += f" {f'{n}/{t}':>12}"
            out.append(line)
        for by in ("law_class", "source"):
            split: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
            for r in sel:
                cell = split[r["cause"]][r[by]]
                cell[0] += 1
                cell[1] += r["tokens"]
            keys = sorted({r[by] for r in sel})
            if not keys:
                continue
            out.append(f"  by {by} (steps/tokens): " + " | ".join(
                f"{cause}: " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in sorted(split[cause].items()))
                for cause in sorted(split, key=lambda c: -sum(v[1] for v in split[c].values()))))
        out.append("")
    return "\n".join(out)


def structure_drafter(gamma: int, tools: list[dict], suffix_trees: bool = True, explain: bool = False,
                      boundary: str = "price", finished_first: bool = False, **fields):
    """The product's structure drafter over the bundled formats; `suffix_trees=False`: without its
    SuffixDecoding trees (the drafter before they became one of its sources); `fields`: other
    DraftPlan fields (e.g. delta_ctx=0: every row priced alike, kinds: a policy per segment kind) or
    lab switches (drafting.lab.LabSwitches, e.g. budget_rule="rate"). `finished_first`: see
    `tuning.candidates.StructureCall`."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.lab import LAB_FIELDS, LabSwitches
    from agentspec_sdk.replay.arms import PROSE
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS, format_names

    model = resolve_model(None)
    # arm A's prose format where its turns were loaded (label_turns registers it), as the bench's
    # engine adds it for arm A
    formats = [REACT, TOOL_CALLS, CODE_AGENT] + ([PROSE] if PROSE.name in format_names() else [])
    lab = LabSwitches(suffix_trees=suffix_trees, **{k: v for k, v in fields.items() if k in LAB_FIELDS})
    plan_fields = {"formats": formats, "tools": tools, "tokenizer": model, "boundary": boundary,
                   **{k: v for k, v in fields.items() if k not in LAB_FIELDS}}
    return _structure_drafter(gamma, AutoTokenizer.from_pretrained(model), plan_fields, explain=explain,
                              lab=lab, finished_first=finished_first)


def label_turns(turns: list[dict], fmt: str = "tool_calls") -> None:
    """Each turn's `classes` (the law class S/R/F of every output token) and `kinds` (its segment
    kind), as the report classifies them; simulate then splits the drafted and accepted tokens by the
    class and kind of the token each draft began at, as the engine's per-class rows do."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.tuning.labels import TurnLabeller

    if any(t.get("fmt") == "prose" for t in turns):  # arm A's turns (`--capture --arm A`)
        from agentspec_sdk.replay.arms import ensure_prose_format
        ensure_prose_format()
    labeller = TurnLabeller(AutoTokenizer.from_pretrained(resolve_model(None)))
    for t in turns:
        if "classes" not in t:
            labeller.label(t, get_format(t.get("fmt", fmt)))


IDEAS = {
    # where suffix decoding's knowledge comes from
    "suffix-own": "suffix without a global tree: the request's own prompt (tool docs, observations) "
                  "and response",
    "suffix-finished": "suffix whose global tree holds finished responses only: no lookup across the "
                       "batch's rows",
    "suffix-by-tools": "suffix with one global tree per system prompt (tool set): values recur among "
                       "same-tool requests",
    # confidence-sized drafts: a token is worth sending when P(accepted) > delta (its verify cost in passes)
    "suffix-conf": "suffix drafts cut where the tree's probability estimate falls below delta",
    "suffix-f2": "suffix allowed twice the matched length (vLLM's suffix_decoding_max_spec_factor 2 "
                 "instead of 1)",
    "union-conf": "per step the longer of structure-plain / confidence-cut suffix",
    "union-ev": "per step the structure-plain or suffix draft, and its length, with the larger expected "
                "saving (ExpectedGain), or none",
}


def tuned_suffix(turns: list[dict], gamma: int, batch: int, delta: float, trim,
                 schedule: str = "agents") -> tuple[dict, dict]:
    """vLLM's suffix proposer with its two knobs tuned on these turns (the grid point of least cost
    passes + delta * drafted; in-sample: a bound on what tuning per trace set can give suffix)."""
    best, knobs = None, {}
    for factor in SUFFIX_GRID["max_spec_factor"]:
        for prob in SUFFIX_GRID["min_token_prob"]:
            row = simulate(turns, SuffixDrafter(gamma, max_spec_factor=factor, min_token_prob=prob), batch,
                           trim=trim(), schedule=schedule)
            cost = row["passes"] + delta * row["drafted"]
            if best is None or cost < best["passes"] + delta * best["drafted"]:
                best, knobs = row, {"max_spec_factor": factor, "min_token_prob": prob}
    return best, knobs


def rows_at(turns: list[dict], tools: list[dict], grammars: list[str], gamma: int, batch: int, delta: float,
            ideas: bool, quick: bool = False, schedule: str = "agents") -> dict:
    """`quick`: without structure-plain, union and union-bound (the rows that price knowledge);
    `schedule`: simulate's ("agents": as the engine runs agents)."""
    replay = functools.partial(simulate, schedule=schedule)  # every row under the same schedule

    def trim():  # one GrammarTrim per replay: its matchers advance with the turns
        return GrammarTrim(grammars)

    price = priced(delta, batch)
    structure = lambda: structure_drafter(gamma, tools, **price)  # noqa: E731
    plain = lambda: structure_drafter(gamma, tools, suffix_trees=False, **price)  # noqa: E731
    tokens = sum(len(t["out"]) - 1 for t in turns)
    rows = {"off": {"passes": tokens, "drafted": 0, "accepted": 0}}
    rows["ngram"] = replay(turns, ngram_drafter(gamma), batch, trim=trim())
    rows["suffix"] = replay(turns, SuffixDrafter(gamma), batch, trim=trim())
    rows["structure"] = replay(turns, structure(), batch, trim=trim())
    rows["structure-wall"] = replay(turns, structure_drafter(gamma, tools, boundary="wall", **price), batch,
                                      trim=trim())
    tuned, knobs = tuned_suffix(turns, gamma, batch, delta, trim, schedule)
    rows["suffix-tuned"] = {**tuned, "knobs": knobs}
    if not quick:
        rows["structure-plain"] = replay(turns, plain(), batch, trim=trim())
        rows["union"] = replay(turns, (plain(), SuffixDrafter(gamma)), batch, trim=trim(), choose=longer)
        rows["union-bound"] = replay(turns, (plain(), SuffixDrafter(gamma)), batch, trim=trim(),
                                       choose=better)
    if ideas:
        rows["suffix-own"] = replay(turns, SuffixTrees(gamma, share="none"), batch, trim=trim())
        rows["suffix-finished"] = replay(turns, SuffixTrees(gamma, share="finished"), batch, trim=trim())
        rows["suffix-by-tools"] = replay(turns, SuffixTrees(gamma, key=system_prompt_key()), batch,
                                           trim=trim())
        rows["suffix-conf"] = replay(turns, SuffixDrafter(gamma, cut=delta), batch, trim=trim())
        rows["suffix-f2"] = replay(turns, SuffixDrafter(gamma, max_spec_factor=2.0), batch, trim=trim())
        rows["union-conf"] = replay(turns, (plain(), SuffixDrafter(gamma, cut=delta)), batch, trim=trim(),
                                      choose=longer)
        st, sx = plain(), SuffixDrafter(gamma)
        rows["union-ev"] = replay(turns, (st, sx), batch, trim=trim(), choose=ExpectedGain(st, sx, delta))
    rows["oracle"] = replay(turns, None, batch, gamma)
    for row in rows.values():
        row["cost"] = row["passes"] + delta * row["drafted"]
        row["predicted_speedup"] = rows["off"]["passes"] / row["cost"]
    stock = min(rows["ngram"]["cost"], rows["suffix"]["cost"], rows["suffix-tuned"]["cost"])
    for row in rows.values():
        row["vs_best_stock"] = stock / row["cost"]
    return rows


def set_label(path: str) -> str:
    """A capture's name: its file or directory name without `.capture.jsonl` / `.jsonl`."""
    from pathlib import Path

    name = Path(path).name
    for suffix in (".capture.jsonl", ".jsonl"):
        name = name.removesuffix(suffix)
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("turns", nargs="+", help="capture file(s) or directories (docs/capture.md; one directory "
                                          "with --capture)")
    ap.add_argument("--capture", action="store_true", help="run the off engine and capture its turns")
    ap.add_argument("--arm", default="D", help="arm to capture: D, D-react or D-code")
    ap.add_argument("--traces", help="trace file to capture (default: the bundled BFCL multi-turn traces)")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--segments", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gammas", default="8", help="comma list of draft length caps")
    ap.add_argument("--gamma", type=int, help="one gamma (same as --gammas N)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--ideas", action="store_true", help="add the rows of IDEAS")
    ap.add_argument("--quick", action="store_true", help="without the structure-plain and union rows")
    ap.add_argument("--explain", action="store_true",
                    help="classify every step where suffix's draft beats structure's (see Explainer)")
    ap.add_argument("--boundary", default="price", choices=("wall", "price"),
                    help="--explain: the structure drafter's plan boundary")
    ap.add_argument("--schedule", default="agents", choices=SCHEDULES,
                    help="agents: rows start as the engine starts agents' turns (after the episode's "
                         "previous turn); groups: the turns batch at a time (before 2026-12-02)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.capture:
        if len(args.turns) != 1:
            ap.error("--capture writes one capture directory")
        capture(args.turns[0], args.episodes, args.segments, args.max_tokens, args.traces, args.arm)
        return
    gammas = [args.gamma] if args.gamma else [int(g) for g in args.gammas.split(",") if g.strip()]
    files = []
    for path in args.turns:
        data = load_turns(path)
        label_turns(data["turns"])
        files.append((path, data))
    if args.explain:
        for g in gammas:
            rows, summary = [], []
            for path, data in files:
                got, row = explain_rows(data["turns"], data["tools"], data.get("grammars", []), g, args.batch,
                                        set_label(path), args.boundary, args.schedule, args.delta)
                rows += got
                summary.append(f"{path}: {len(data['turns'])} turns, structure passes {row['passes']}, "
                               f"drafted {row['drafted']}, accepted {row['accepted']}")
            if args.json:
                print(json.dumps({"gamma": g, "batch": args.batch, "steps": rows}, indent=1))
                continue
            print(f"explain: structure (boundary {args.boundary}) against vLLM's suffix on the same "
                  "histories, "
                  f"γ={g}, b={args.batch}")
            print("\n".join(summary))
            print(explain_table(rows))
        return
    for path, data in files:
        report(path, data, gammas, args)


def report(path: str, data: dict, gammas: list[int], args) -> None:
    turns = data["turns"]
    tokens = sum(len(t["out"]) - 1 for t in turns)
    result = {g: rows_at(turns, data["tools"], data.get("grammars", []), g, args.batch, args.delta,
                         args.ideas, args.quick, args.schedule)
              for g in gammas}
    if args.json:
        print(json.dumps({"capture": path,
                          "turns": len(turns), "tokens": tokens, "batch": args.batch, "delta": args.delta,
                          "gammas": {str(g): rows for g, rows in result.items()}}, indent=1))
        return
    for g, rows in result.items():
        print(f"{path} ({set_label(path)}): {len(turns)} turns, {tokens} "
              f"output tokens after the first, b={args.batch}, γ={g}, delta={args.delta}")
        print(f"{'drafter':<16} {'passes':>7} {'drafted':>8} {'accepted':>9} {'cost':>7} {'× off':>6} "
              f"{'÷stock':>7}  (stock: the best of ngram, suffix, suffix-tuned)")
        for name, r in rows.items():
            knobs = f"  {r['knobs']}" if "knobs" in r else ""
            print(f"{name:<16} {r['passes']:>7} {r['drafted']:>8} {r['accepted']:>9} {r['cost']:>7.1f} "
                  f"{r['predicted_speedup']:>6.2f} {r['vs_best_stock']:>7.3f}{knobs}")
        print("per class of the token a draft began at (drafted / accepted, acceptance):")
        for name, r in rows.items():
            if r.get("by_class") and r["drafted"]:
                print(f"  {name:<16} " + "  ".join(
                    f"{c} {v['drafted']}/{v['accepted']} ({v['accepted'] / v['drafted']:.0%})"
                    if v["drafted"] else f"{c} 0/0" for c, v in r["by_class"].items()))
        print()


if __name__ == "__main__":
    main()
