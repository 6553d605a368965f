"""The per-segment-kind choice and the best stock drafter.

Two rules. `choose_per_kind`: in each kind, the candidate policy of least cost (passes + delta *
drafted of the passes whose draft began in that kind). `choose_clear_wins` (the one `agentspec tune`
writes plans by): in each kind its default (the peer's own draft, `trees`, token-identical to vLLM's
suffix proposer at its tuned knobs; `agentspec tune` makes it `structure` in schema kinds) unless
another policy clearly wins, that is, its paired per-episode saving over the default in that kind
has a mean above CLEAR_WIN_SE standard errors of that mean (`paired_saving`); among the clear winners
the largest mean saving. docs/tuning.md says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["CLEAR_WIN_SE", "DEFAULT_POLICY", "STOCK", "best_stock", "choose_clear_wins", "choose_per_kind",
           "clear_winner", "composed_kinds", "cost", "differences", "kind_costs", "paired_saving"]

STOCK = ("ngram", "suffix", "suffix-tuned")  # vLLM's drafters, suffix-tuned at the fitting part's knobs
DEFAULT_POLICY = "trees"  # the candidate a kind keeps unless another clearly wins
# a challenger clearly wins where its mean paired per-episode saving exceeds this many standard errors
CLEAR_WIN_SE = 2.0


def cost(counts: Mapping[str, int], delta: float) -> float:
    """A replay's (or a kind's) cost in target passes: passes + delta * drafted."""
    return counts["passes"] + delta * counts["drafted"]


def kind_costs(rows: Mapping[str, Mapping], delta: float) -> dict[str, dict[str, float]]:
    """{kind: {candidate: cost of the passes whose draft began in that kind}} over the candidates' rows."""
    out: dict[str, dict[str, float]] = {}
    for name, row in rows.items():
        for kind, counts in row.get("by_kind", {}).items():
            out.setdefault(kind, {})[name] = cost(counts, delta)
    return dict(sorted(out.items()))


def choose_per_kind(rows: Mapping[str, Mapping], delta: float) -> dict[str, str]:
    """{kind: the candidate of least cost in that kind}; ties go to the earlier candidate of `rows`
    (the plan's defaults first). A kind only some candidates reached is chosen among those."""
    order = {name: j for j, name in enumerate(rows)}
    return {kind: min(costs, key=lambda name: (costs[name], order[name]))
            for kind, costs in kind_costs(rows, delta).items()}


def composed_kinds(choice: Mapping[str, str], policies: Mapping[str, Mapping],
                   default: str | None = None) -> dict[str, dict]:
    """The plan's `kinds`: each kind's chosen candidate's policy (`policies[name]`: its "*" policy);
    `default`: the candidate whose policy "*" gets (the kinds the part never reached)."""
    out = {kind: dict(policies[name]) for kind, name in sorted(choice.items())}
    if default is not None:
        out["*"] = dict(policies[default])
    return out


def differences(fit: Mapping[str, str], held: Mapping[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """The kinds where the choice on the held-out part differs from the one on the fitting part."""
    return {k: (fit.get(k), held.get(k)) for k in sorted(set(fit) | set(held)) if fit.get(k) != held.get(k)}


def best_stock(rows: Mapping[str, Mapping], delta: float, names: Sequence[str] = STOCK) -> tuple[str, float]:
    """(name, cost) of the cheapest stock drafter among `rows`."""
    found = [(cost(rows[n], delta), n) for n in names if n in rows]
    value, name = min(found)
    return name, value


def _episode_costs(row: Mapping, delta: float, kind: str | None) -> dict[str, float]:
    """{episode: cost} of a replay row's `by_episode` (`kind` None: the whole episode)."""
    out = {}
    for episode, counts in row.get("by_episode", {}).items():
        c = counts["all"] if kind is None else counts["kinds"].get(kind)
        if c is not None:
            out[episode] = cost(c, delta)
    return out


def paired_saving(base: Mapping, row: Mapping, delta: float, kind: str | None = None) -> dict:
    """`row`'s saving over `base` paired by episode (replay rows with `by_episode`), in segment kind
    `kind` (None: whole episodes): {"saving": mean of base cost - row cost over the episodes where
    either drafted in the kind, "se": its standard error (sample standard deviation / sqrt n; inf
    below 2 episodes), "episodes": n, "total": the summed saving}."""
    a, b = _episode_costs(base, delta, kind), _episode_costs(row, delta, kind)
    diffs = [a.get(e, 0.0) - b.get(e, 0.0) for e in sorted(set(a) | set(b))]
    n = len(diffs)
    mean = sum(diffs) / n if n else 0.0
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n >= 2 else math.inf
    return {"saving": mean, "se": se, "episodes": n, "total": sum(diffs)}


def clear_winner(base_name: str, rows: Mapping[str, Mapping], delta: float, kind: str | None = None,
                 z: float = CLEAR_WIN_SE) -> tuple[str, dict]:
    """(the chosen name, why): `base_name` unless a row of `rows` saves over it, paired by episode
    (`paired_saving`, in `kind`), a mean above `z` standard errors; among such rows the one of the
    largest mean saving (ties: the earlier). `why`: {"default", "z", "tests": {name: paired_saving},
    "chosen", "reason"}."""
    base = rows[base_name]
    tests = {name: paired_saving(base, row, delta, kind) for name, row in rows.items() if name != base_name}
    wins = [name for name, t in tests.items() if t["saving"] > 0 and t["saving"] > z * t["se"]]
    chosen = max(wins, key=lambda n: (tests[n]["saving"], -list(rows).index(n))) if wins else base_name
    if wins:
        t = tests[chosen]
        reason = (f"{chosen} saves {t['saving']:.2f} per episode over {base_name} (se {t['se']:.2f}, "
                  f"{t['episodes']} episodes): above {z:g} se")
    else:
        best = max(tests, key=lambda n: tests[n]["saving"], default=None)
        reason = (f"no policy saves more than {z:g} se over {base_name}" + (
            f" (best {best}: {tests[best]['saving']:.2f} per episode, se {tests[best]['se']:.2f}, "
            f"{tests[best]['episodes']} episodes)" if best is not None else ""))
    return chosen, {"default": base_name, "z": z, "tests": tests, "chosen": chosen, "reason": reason}


def choose_clear_wins(rows: Mapping[str, Mapping], delta: float,
                      default: str | Mapping[str, str] = DEFAULT_POLICY,
                      z: float = CLEAR_WIN_SE) -> tuple[dict[str, str], dict[str, dict]]:
    """({kind: chosen candidate}, {kind: why}) by the clear-win rule (the module doc); `default`: the
    candidate a kind keeps unless another clearly wins, one for all kinds or per kind (a kind not in
    the mapping: DEFAULT_POLICY). A kind the default candidate never drafted in is chosen by least
    cost (`choose_per_kind`), said so."""
    least = choose_per_kind(rows, delta)
    choice, why = {}, {}
    for kind in kind_costs(rows, delta):
        default_of = default if isinstance(default, str) else default.get(kind, DEFAULT_POLICY)
        choice[kind], why[kind] = _clear_in_kind(rows, delta, kind, default_of, z, least)
    return choice, why


def _clear_in_kind(rows, delta, kind, default, z, least) -> tuple[str, dict]:
    if kind not in rows[default].get("by_kind", {}):
        return least[kind], {"default": default, "z": z, "tests": {}, "chosen": least[kind],
                             "reason": f"{default} never reached this kind: least cost"}
    return clear_winner(default, rows, delta, kind, z)
