"""The per-segment-kind choice: in each kind, the candidate policy of least cost (passes + delta *
drafted of the passes whose draft began in that kind), and the best stock drafter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["STOCK", "best_stock", "choose_per_kind", "composed_kinds", "cost", "differences", "kind_costs"]

STOCK = ("ngram", "suffix", "suffix-tuned")  # vLLM's drafters, suffix-tuned at the fitting part's best knobs


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


def composed_kinds(choice: Mapping[str, str], policies: Mapping[str, Mapping]) -> dict[str, dict]:
    """The plan's `kinds`: each kind's chosen candidate's policy (`policies[name]`: its "*" policy)."""
    return {kind: dict(policies[name]) for kind, name in sorted(choice.items())}


def differences(fit: Mapping[str, str], held: Mapping[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """The kinds where the choice on the held-out part differs from the one on the fitting part."""
    return {k: (fit.get(k), held.get(k)) for k in sorted(set(fit) | set(held)) if fit.get(k) != held.get(k)}


def best_stock(rows: Mapping[str, Mapping], delta: float, names: Sequence[str] = STOCK) -> tuple[str, float]:
    """(name, cost) of the cheapest stock drafter among `rows`."""
    found = [(cost(rows[n], delta), n) for n in names if n in rows]
    value, name = min(found)
    return name, value
