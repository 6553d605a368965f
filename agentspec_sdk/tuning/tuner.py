"""`tune`: the candidates replayed on the fitting part, the per-kind choice, the composed plan replayed
on both parts, the stock drafters on the held-out part, the law's decision per class; `tuned_plan`: the
plan that comes out (the base plan's fields with `kinds` filled)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.errors import TuneError
from agentspec_sdk.structure.formats import AgentFormat, LawClass
from agentspec_sdk.tuning.candidates import Candidate, kind_candidates, stock_candidates, suffix_grid
from agentspec_sdk.tuning.choose import (
    CLEAR_WIN_SE,
    DEFAULT_POLICY,
    best_stock,
    choose_clear_wins,
    choose_per_kind,
    clear_winner,
    composed_kinds,
    cost,
    differences,
)
from agentspec_sdk.tuning.decisions import class_decisions, token_shares
from agentspec_sdk.tuning.episodes import TurnSet, episodes_of, split_episodes
from agentspec_sdk.tuning.labels import TurnLabeller
from agentspec_sdk.tuning.replays import ReplayPool, ReplaySetting

__all__ = ["AUTO_JOBS_TOKENS", "KIND_DEFAULTS", "MAX_AUTO_JOBS", "ORACLE", "PER_FORMAT", "PER_KIND",
           "PRICE_NOTE", "TuneOptions", "kind_defaults", "per_format_plan", "suffix_tuned", "tune",
           "tuned_plan"]

PER_KIND = "structure-per-kind"  # the plan composed of each kind's chosen policy
PER_FORMAT = "structure-per-format"  # per format: the composition or one policy, by the clear-win rule
KIND_DEFAULTS = ("class", "trees")  # TuneOptions.kind_default
ORACLE = "oracle-per-kind"  # each kind's cheapest policy on the held-out part, replayed there (the bound)
# `jobs` 0: one process below this many output tokens (a worker's start, importing vLLM for the ngram
# peer, costs more than such a capture's replays), else up to MAX_AUTO_JOBS
AUTO_JOBS_TOKENS = 50_000
MAX_AUTO_JOBS = 2

PRICE_NOTE = ("the capture holds each turn's start and finish times only, not the engine's step times: "
              "delta and d cannot be fitted from it; the given --delta and --d are used")


@dataclass(frozen=True)
class TuneOptions:
    gamma: int = 8
    batch: int = 8
    delta: float = 0.2
    d: float = 0.0
    holdout: float = 0.5
    seed: int = 0
    jobs: int = 1  # 0: by the capture's size (AUTO_JOBS_TOKENS)
    model: str = ""
    schedule: str = "agents"
    # also replay the bound: each kind's cheapest policy chosen on the held-out part itself
    oracle: bool = False
    clear_win_se: float = CLEAR_WIN_SE  # the clear-win rule's constant (choose.py)
    # the policy a kind keeps unless another clearly wins: "trees" in every kind, or "class": the
    # structure drafter's defaults in kinds of law class S (schema), trees elsewhere
    kind_default: str = "class"

    def check(self) -> None:
        if not 1 <= self.gamma <= 64:
            raise TuneError(f"--gamma must be in [1, 64], got {self.gamma}")
        if self.batch < 1:
            raise TuneError(f"--batch must be >= 1, got {self.batch}")
        if self.jobs < 0:
            raise TuneError(f"--jobs must be >= 0 (0: chosen by the capture's size), got {self.jobs}")
        if not 0.0 <= self.delta < 1.0:
            raise TuneError(f"--delta must be in [0, 1), got {self.delta}")
        if self.d < 0:
            raise TuneError(f"--d must be >= 0, got {self.d}")
        if self.clear_win_se < 0:
            raise TuneError(f"--clear-win-se must be >= 0, got {self.clear_win_se}")
        if self.kind_default not in KIND_DEFAULTS:
            raise TuneError(f"--kind-default must be one of {KIND_DEFAULTS}, got {self.kind_default!r}")


def _plan_fields(ts: TurnSet, base: DraftPlan | None, model: str) -> dict:
    """The fields every replayed plan starts from: the base plan's (its kinds dropped), with the
    capture's formats and tools added."""
    fields = base.to_dict() if base is not None else {}
    for key in ("kinds", "version"):
        fields.pop(key, None)
    formats = {f["name"]: f for f in fields.get("formats", [])}
    for name, fmt in ts.formats.items():
        formats.setdefault(name, fmt.to_dict())
    tools = list(fields.get("tools", []))
    tools += [t for t in ts.tools if t not in tools]
    return {**fields, "formats": list(formats.values()), "tools": tools,
            "tokenizer": fields.get("tokenizer") or model}


def kind_defaults(plan_fields: dict, qualified: bool, rule: str) -> dict[str, str] | str:
    """Per kind key, the candidate it keeps unless another clearly wins (`TuneOptions.kind_default`):
    "trees" everywhere, or by law class ("structure" in S kinds, "trees" elsewhere)."""
    if rule == "trees":
        return DEFAULT_POLICY
    out: dict[str, str] = {}
    for f in plan_fields.get("formats", []):
        fmt = AgentFormat.from_dict(f)
        for kind in fmt.kinds:
            key = f"{fmt.name}.{kind.name}" if qualified else kind.name
            out.setdefault(key, "structure" if kind.law_class is LawClass.S else DEFAULT_POLICY)
    return out


def suffix_tuned(rows: dict, delta: float, default: str, z: float) -> tuple[dict, dict, dict]:
    """(row, knobs, why) of the grid point suffix-tuned runs at: vLLM's defaults (`default`, the grid
    point at them) unless another point clearly saves over them on the fitting part, paired by
    episode (`clear_winner`, `z` standard errors): a grid point of least cost by chance is no tuning."""
    grid = suffix_grid()
    name, why = clear_winner(default, {c.name: rows[(c.name, "fit")] for c in grid}, delta, z=z)
    best = next(c for c in grid if c.name == name)
    return rows[(name, "fit")], dict(best.knobs), why


def tune(ts: TurnSet, opts: TuneOptions, base: DraftPlan | None = None,
         progress: Callable[[int, int], None] | None = None, labeller: TurnLabeller | None = None) -> dict:
    """Everything `agentspec tune` reports, as a JSON-able dict (see docs/tuning.md); `base`: the plan
    whose fields the replayed plans start from; `progress(done, total)` after each replay (output
    tokens replayed so far, of all the replays' output tokens)."""
    opts.check()
    started = time.perf_counter()
    if labeller is None:
        from transformers import AutoTokenizer
        labeller = TurnLabeller(AutoTokenizer.from_pretrained(opts.model))
    # several formats: kinds are chosen per format ("<format>.<kind>", the plan's most specific key)
    qualified = len(ts.formats) > 1
    for t in ts.turns:
        if "kinds" not in t:
            labeller.label(t, ts.formats[t["fmt"]], qualified)
    fit, held = split_episodes(ts.turns, opts.holdout, opts.seed)
    setting = ReplaySetting(opts.gamma, opts.batch, opts.delta, opts.model,
                            _plan_fields(ts, base, opts.model), opts.schedule, qualified)
    if opts.jobs == 0:
        jobs = 1 if ts.tokens < AUTO_JOBS_TOKENS else min(MAX_AUTO_JOBS, os.cpu_count() or 1)
        opts = dataclasses.replace(opts, jobs=jobs)
    return _tune_parts(ts, opts, setting, fit, held, progress, started)


def _tune_parts(ts: TurnSet, opts: TuneOptions, setting: ReplaySetting, fit: list[int], held: list[int],
                progress, started: float) -> dict:
    stock = stock_candidates()
    ngram, suffix = stock
    grid = suffix_grid()
    default_grid = next(c for c in grid if c.knobs == suffix.knobs)
    with ReplayPool(ts, {"fit": fit, "held": held}, setting, opts.jobs) as pool:
        no_trees = [c for c in kind_candidates({"max_spec_factor": 1.0, "min_token_prob": 0.1})
                    if c.name != "trees"]
        first = ([(c, "fit") for c in grid] + [(ngram, "fit"), (ngram, "held"), (suffix, "held")]
                 + [(c, part) for c in no_trees for part in ("fit", "held")])
        # the second and third rounds: trees and the composed plan on both parts, suffix-tuned held out
        # (and the oracle's composition)
        later = {"fit": 2 + setting.qualified_kinds, "held": 3 + opts.oracle + setting.qualified_kinds}
        total = sum(pool.tokens(p) * (sum(q == p for _, q in first) + later[p]) for p in ("fit", "held"))
        done = 0

        def step(tokens: int) -> None:
            nonlocal done
            done += tokens
            if progress is not None:
                progress(done, total)

        rows = pool.run(first, step)
        rows[("suffix", "fit")] = rows[(default_grid.name, "fit")]
        tuned_row, knobs, knobs_why = suffix_tuned(rows, opts.delta, default_grid.name, opts.clear_win_se)
        rows[("suffix-tuned", "fit")] = tuned_row
        candidates = kind_candidates(knobs)
        trees = next(c for c in candidates if c.name == "trees")
        second = [(trees, "fit"), (trees, "held"), (Candidate("suffix-tuned", "suffix", knobs), "held")]
        rows.update(pool.run(second, step))
        policies = {c.name: c.kinds["*"] for c in candidates}
        fit_rows = {c.name: rows[(c.name, "fit")] for c in candidates}
        held_rows = {c.name: rows[(c.name, "held")] for c in candidates}
        z, defaults = opts.clear_win_se, kind_defaults(setting.plan_fields, setting.qualified_kinds,
                                                         opts.kind_default)
        (choice, why), (choice_held, _) = (choose_clear_wins(fit_rows, opts.delta, defaults, z),
                                           choose_clear_wins(held_rows, opts.delta, defaults, z))
        composed = Candidate(PER_KIND, "structure",
                             kinds=composed_kinds(choice, policies, default=DEFAULT_POLICY))
        tasks = [(composed, "fit"), (composed, "held")]
        oracle = Candidate(ORACLE, "structure", kinds=composed_kinds(choose_per_kind(held_rows, opts.delta),
                                                                     policies, default=DEFAULT_POLICY))
        tasks += [(oracle, "held")] if opts.oracle else []
        rows.update(pool.run(tasks, step))
        # the plan: the per-kind composition, unless one policy everywhere clearly beats it on the
        # fitting part, paired by episode (the kinds' costs were measured apart; composed, they
        # interact); with several formats, that choice per format, on the format's own episodes
        plans = {c.name: c for c in (composed, *candidates)}
        if setting.qualified_kinds:
            mixed, plan_why = per_format_plan(ts, setting, rows, plans, policies, opts)
            if mixed is not None:
                plans[mixed.name] = mixed
                rows.update(pool.run([(mixed, "fit"), (mixed, "held")], step))
            name = PER_FORMAT if mixed is not None else PER_KIND
        else:
            name, plan_why = clear_winner(PER_KIND, {n: rows[(n, "fit")] for n in plans}, opts.delta,
                                          z=opts.clear_win_se)
    for part in ("fit", "held"):
        rows[("structure-tuned", part)] = rows[(name, part)]
    tuned = {"plan": name, "kinds": plans[name].kinds, "why": why, "plan_why": plan_why,
             "knobs_why": knobs_why, "least_cost_choice": choose_per_kind(fit_rows, opts.delta)}
    if opts.oracle:
        held_costs = {n: cost(rows[(n, "held")], opts.delta) for n in (ORACLE, *(c.name for c in candidates))}
        best = min(held_costs, key=held_costs.get)
        tuned["oracle"] = {"plan": best, "kinds": (oracle if best == ORACLE else plans[best]).kinds,
                           "cost": held_costs[best]}
    return _result(ts, opts, rows, fit, held, knobs, choice, choice_held, tuned, candidates, started)


def per_format_plan(ts: TurnSet, setting: ReplaySetting, rows: dict, plans: dict, policies: dict,
                     opts: TuneOptions) -> tuple[Candidate | None, dict]:
    """Per format, the clear-win rule between the per-kind composition and each one-policy plan on
    the fitting part's episodes of that format: (the plan mixing each format's winner, replayed next;
    None where every format keeps the composition, {format: why})."""
    episodes = episodes_of(ts.turns)
    format_of = {str(episodes[i]): t["fmt"] for i, t in enumerate(ts.turns)}
    kinds = dict(plans[PER_KIND].kinds)
    whys, changed = {}, False
    for fmt in sorted(ts.formats):
        mine = {e for e, f in format_of.items() if f == fmt}
        fit_rows = {n: _episodes_only(rows[(n, "fit")], mine) for n in plans}
        chosen, whys[fmt] = clear_winner(PER_KIND, fit_rows, opts.delta, z=opts.clear_win_se)
        if chosen != PER_KIND:
            changed = True
            kinds = {k: v for k, v in kinds.items() if not k.startswith(fmt + ".")}
            for kind in ts.formats[fmt].kinds:
                kinds[f"{fmt}.{kind.name}"] = dict(policies[chosen])
    why = {"chosen": PER_FORMAT if changed else PER_KIND, "per_format": whys,
           "reason": "; ".join(f"{fmt}: {w['reason']}" for fmt, w in whys.items())}
    return (Candidate(PER_FORMAT, "structure", kinds=kinds) if changed else None), why


def _episodes_only(row: dict, episodes: set[str]) -> dict:
    """A replay row's per-episode counts restricted to `episodes` (what `clear_winner` pairs)."""
    return {"by_episode": {e: c for e, c in row.get("by_episode", {}).items() if e in episodes}}


def _part_rows(rows: dict, part: str, names: list[str], tokens: int) -> dict:
    """The part's rows by name (the per-episode counts, used by the choice only, left out)."""
    out = {"off": {"passes": tokens, "drafted": 0, "accepted": 0, "cost": float(tokens)}}
    out.update({n: {k: v for k, v in rows[(n, part)].items() if k != "by_episode"}
                for n in names if (n, part) in rows})
    return out


def _result(ts, opts, rows, fit, held, knobs, choice, choice_held, plan, candidates, started) -> dict:
    fit_turns = [ts.turns[i] for i in fit]
    held_turns = [ts.turns[i] for i in held]
    tokens = {"fit": sum(len(t["out"]) - 1 for t in fit_turns),
              "held": sum(len(t["out"]) - 1 for t in held_turns)}
    names = ["ngram", "suffix", "suffix-tuned", *[c.name for c in candidates], PER_KIND, PER_FORMAT, ORACLE,
             "structure-tuned"]
    fit_rows = _part_rows(rows, "fit", names + [c.name for c in suffix_grid()], tokens["fit"])
    held_rows = _part_rows(rows, "held", names, tokens["held"])
    for part_rows in (fit_rows, held_rows):
        off = part_rows["off"]["cost"]
        for row in part_rows.values():
            row["cost"] = cost(row, opts.delta)
            row["speedup_vs_off"] = off / row["cost"] if row["cost"] else None
    stock_name, stock_cost = best_stock(held_rows, opts.delta)
    tuned = held_rows["structure-tuned"]["cost"]
    episodes = episodes_of(ts.turns)
    oracle = plan.get("oracle")
    if oracle is not None:
        oracle = {**oracle, "best_stock_over_oracle": stock_cost / oracle["cost"] if oracle["cost"] else None}
    return {
        "settings": {"gamma": opts.gamma, "batch": opts.batch, "delta": opts.delta, "d": opts.d,
                     "holdout": opts.holdout, "seed": opts.seed, "schedule": opts.schedule,
                     "clear_win_se": opts.clear_win_se, "kind_default": opts.kind_default,
                     "model": opts.model,
                     "jobs": opts.jobs},
        "turns": len(ts.turns), "episodes": {"all": len(set(episodes)),
                                             "fit": len({episodes[i] for i in fit}),
                                             "held": len({episodes[i] for i in held})},
        "tokens": tokens, "notes": [*ts.notes, PRICE_NOTE],
        "suffix_tuned_knobs": knobs, "suffix_tuned_why": plan["knobs_why"],
        "choice": choice, "choice_held_out": choice_held,
        "stability": {k: {"fit": a, "held_out": b} for k, (a, b) in differences(choice, choice_held).items()},
        "choice_why": plan["why"], "least_cost_choice": plan["least_cost_choice"],
        "plan_choice": plan["plan"], "plan_why": plan["plan_why"], "kinds": plan["kinds"],
        "fit": fit_rows, "held_out": held_rows, "held_out_oracle": oracle,
        "held_out_summary": {"structure_tuned": tuned, "structure": held_rows["structure"]["cost"],
                             "best_stock": stock_name, "best_stock_cost": stock_cost,
                             "best_stock_over_tuned": stock_cost / tuned if tuned else None},
        "law": class_decisions(fit_rows["structure"].get("rounds_by_class", {}), token_shares(fit_turns),
                               opts.gamma, opts.delta, opts.d),
        "seconds": time.perf_counter() - started,
    }


def tuned_plan(base: DraftPlan | None, ts: TurnSet, result: dict) -> DraftPlan:
    """The base plan (default: the default plan) with the capture's formats and tools, gamma_max at
    the tuned gamma and `kinds` as chosen."""
    fields = _plan_fields(ts, base, result["settings"]["model"])
    return DraftPlan(**{**fields, "gamma_max": result["settings"]["gamma"], "kinds": result["kinds"]})
