"""Pre-registered predictions and falsifiers of the Draft Law, each with the numbers behind it.

P1  tau_S > tau_R > tau_F and tau_S / tau_F > 1.5                (prediction)
R1  tau_S <= tau_F                    => the Draft Law is rejected
R2  an arm with w_S >= 0.6 and s < 0  => the breakeven model is rejected
R3  composition residual > 15%        => the orthogonal-composition claim is rejected
R4  any token mismatch at temperature 0 => the lossless claim is rejected
R5  |predicted - measured| / measured decode speedup > 15% for a speculative run
                                      => the net-saving prediction (law + pass cost model) is rejected

Per-class tau is compared at one common gamma, from the per-position acceptance alpha_c of each
class (tau_c = sum_{i<=gamma} alpha_c^i), because rounds of different classes draft different lengths.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from agentspec_sdk.law.estimators import ClassAcceptance, RoundRecord, acceptance_by_class

PASS, REJECTED, INSUFFICIENT = "pass", "rejected", "insufficient data"
P1_RATIO = 1.5
R2_MIN_W_S = 0.6
R3_MAX_RESIDUAL = 0.15
R5_MAX_ERROR = 0.15
MIN_ROUNDS = 20


@dataclass(frozen=True)
class Verdict:
    name: str
    status: str
    numbers: dict = field(default_factory=dict)
    text: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASS

    @property
    def rejected(self) -> bool:
        return self.status == REJECTED

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ArmSaving:
    """Measured net saving of one arm (e.g. A: free prose, B: tool calls) at its schema share."""

    arm: str
    w_s: float
    saving: float


@dataclass(frozen=True)
class CompositionCheck:
    """Predicted C_total (composition_cost) against the measured total cost of one configuration."""

    name: str
    predicted: float
    measured: float

    @property
    def residual(self) -> float:
        return abs(self.measured - self.predicted) / abs(self.measured)


@dataclass(frozen=True)
class SpeedupCheck:
    """Predicted against measured decode speedup of one speculative run. `factors`: per factor of the
    speedup (e.g. tokens per row-pass, pass costs, time outside passes) the predicted and the
    measured value and `error` = the factor's predicted / measured contribution to the speedup, so
    the product of the errors is predicted / measured speedup."""

    name: str
    predicted: float
    measured: float
    factors: dict = field(default_factory=dict)

    @property
    def error(self) -> float:
        return abs(self.predicted - self.measured) / abs(self.measured)

    @property
    def off_term(self) -> str | None:
        """The factor whose error is largest (in log terms), or None without factors."""
        import math

        scored = [(abs(math.log(f["error"])), k) for k, f in self.factors.items()
                  if f.get("error") and f["error"] > 0]
        return max(scored)[1] if scored else None


def _class_taus(acc: Mapping[str, ClassAcceptance], gamma: int) -> dict:
    out = {}
    for c in ("S", "R", "F"):
        if c in acc:
            t, lo, hi = acc[c].tau_at(gamma)
            out[c] = {"tau": t, "ci": [lo, hi], "alpha": acc[c].alpha, "rounds": acc[c].rounds,
                      "mean_accepted": acc[c].mean_accepted}
    return out


def _enough(acc: Mapping[str, ClassAcceptance], classes: Sequence[str], min_rounds: int) -> list[str]:
    return [c for c in classes if c not in acc or acc[c].rounds < min_rounds]


def verdict_p1(acc: Mapping[str, ClassAcceptance], gamma: int, min_rounds: int = MIN_ROUNDS) -> Verdict:
    numbers = {"gamma": gamma, "min_rounds": min_rounds, "classes": _class_taus(acc, gamma)}
    short = _enough(acc, ("S", "R", "F"), min_rounds)
    if short:
        return Verdict("P1", INSUFFICIENT, numbers, f"fewer than {min_rounds} rounds in class(es) {short}")
    t = {c: numbers["classes"][c]["tau"] for c in "SRF"}
    ratio = t["S"] / t["F"] if t["F"] > 0 else float("inf")
    numbers["tau_S_over_tau_F"] = ratio
    ok = t["S"] > t["R"] > t["F"] and ratio > P1_RATIO
    separated = numbers["classes"]["S"]["ci"][0] > numbers["classes"]["F"]["ci"][1]
    numbers["S_F_intervals_separated"] = separated
    text = (f"tau_S={t['S']:.3f}, tau_R={t['R']:.3f}, tau_F={t['F']:.3f} at gamma={gamma}; "
            f"tau_S/tau_F={ratio:.3f} (needs > {P1_RATIO} and S > R > F)")
    return Verdict("P1", PASS if ok else REJECTED, numbers, text)


def verdict_r1(acc: Mapping[str, ClassAcceptance], gamma: int, min_rounds: int = MIN_ROUNDS) -> Verdict:
    numbers = {"gamma": gamma, "min_rounds": min_rounds, "classes": _class_taus(acc, gamma)}
    short = _enough(acc, ("S", "F"), min_rounds)
    if short:
        return Verdict("R1", INSUFFICIENT, numbers, f"fewer than {min_rounds} rounds in class(es) {short}")
    ts, tf = numbers["classes"]["S"]["tau"], numbers["classes"]["F"]["tau"]
    if ts <= tf:
        return Verdict("R1", REJECTED, numbers,
                       f"tau_S={ts:.3f} <= tau_F={tf:.3f}: the Draft Law is rejected")
    return Verdict("R1", PASS, numbers, f"tau_S={ts:.3f} > tau_F={tf:.3f}")


def verdict_r2(arms: Iterable[ArmSaving]) -> Verdict:
    arms = list(arms)
    numbers = {"min_w_s": R2_MIN_W_S, "arms": [asdict(a) for a in arms]}
    relevant = [a for a in arms if a.w_s >= R2_MIN_W_S]
    if not relevant:
        return Verdict("R2", INSUFFICIENT, numbers, f"no arm with w_S >= {R2_MIN_W_S}")
    losing = [a for a in relevant if a.saving < 0]
    numbers["losing_arms"] = [a.arm for a in losing]
    if losing:
        worst = min(losing, key=lambda a: a.saving)
        return Verdict("R2", REJECTED, numbers,
                       f"arm {worst.arm} has w_S={worst.w_s:.3f} >= {R2_MIN_W_S} and s={worst.saving:.3f} < "
                       "0: the breakeven model is rejected")
    return Verdict("R2", PASS, numbers,
                   f"{len(relevant)} arm(s) with w_S >= {R2_MIN_W_S}, all with s >= 0 "
                   f"(min s={min(a.saving for a in relevant):.3f})")


def verdict_r3(checks: Iterable[CompositionCheck]) -> Verdict:
    checks = [c for c in checks if c.measured != 0]
    numbers = {"max_residual": R3_MAX_RESIDUAL,
               "checks": [{**asdict(c), "residual": c.residual} for c in checks]}
    if not checks:
        return Verdict("R3", INSUFFICIENT, numbers, "no composition measurement")
    worst = max(checks, key=lambda c: c.residual)
    numbers["worst"] = worst.name
    if worst.residual > R3_MAX_RESIDUAL:
        return Verdict("R3", REJECTED, numbers,
                       f"{worst.name}: residual {worst.residual:.1%} > {R3_MAX_RESIDUAL:.0%}: "
                       "orthogonal composition is rejected")
    return Verdict("R3", PASS, numbers, f"largest residual {worst.residual:.1%} ({worst.name})")


def verdict_r4(compared: int, mismatched: int, first_mismatch: str | None = None) -> Verdict:
    """`compared` outputs at temperature 0 compared token by token with the non-speculative run."""
    numbers = {"compared": compared, "mismatched": mismatched, "first_mismatch": first_mismatch}
    if compared == 0:
        return Verdict("R4", INSUFFICIENT, numbers, "no temperature-0 comparison")
    if mismatched > 0:
        return Verdict("R4", REJECTED, numbers,
                       f"{mismatched} of {compared} outputs differ at temperature 0: lossless claim rejected")
    return Verdict("R4", PASS, numbers, f"{compared} outputs identical token for token at temperature 0")


def verdict_r5(checks: Iterable[SpeedupCheck], max_error: float = R5_MAX_ERROR) -> Verdict:
    """The net-saving prediction against the measured decode speedup of every speculative run."""
    checks = [c for c in checks if c.measured]
    numbers = {"max_error": max_error,
               "checks": [{**asdict(c), "error": c.error, "off_term": c.off_term} for c in checks]}
    if not checks:
        return Verdict("R5", INSUFFICIENT, numbers,
                       "no speculative run with a predicted and a measured speedup")
    bad = [c for c in checks if c.error > max_error]
    worst = max(checks, key=lambda c: c.error)
    numbers["worst"] = worst.name
    numbers["failed"] = [c.name for c in bad]
    if bad:
        parts = []
        for c in sorted(bad, key=lambda c: -c.error):
            term = c.off_term
            detail = ""
            if term:
                f = c.factors[term]
                detail = (f", {term} off: predicted {f['predicted']:.3g} vs measured {f['measured']:.3g}"
                          if f.get("measured") is not None else f", {term} off")
            parts.append(f"{c.name}: predicted {c.predicted:.2f}x vs measured {c.measured:.2f}x "
                         f"({c.error:.0%}{detail})")
        return Verdict("R5", REJECTED, numbers,
                       f"{len(bad)} of {len(checks)} run(s) off by more than {max_error:.0%}: "
                       + "; ".join(parts))
    return Verdict("R5", PASS, numbers,
                   f"{len(checks)} run(s) within {max_error:.0%}; largest error {worst.error:.1%} "
                   f"({worst.name}: predicted {worst.predicted:.2f}x, measured {worst.measured:.2f}x)")


def token_mismatches(pairs: Iterable[tuple[Sequence[int], Sequence[int]]]) -> tuple[int, int, str | None]:
    """(compared, mismatched, description of the first mismatch) over (reference, speculative) pairs."""
    compared = mismatched = 0
    first = None
    for i, (ref, spec) in enumerate(pairs):
        compared += 1
        if list(ref) != list(spec):
            mismatched += 1
            if first is None:
                pos = next((j for j, (a, b) in enumerate(zip(ref, spec, strict=False)) if a != b),
                           min(len(ref), len(spec)))
                first = f"output {i} at token {pos}"
    return compared, mismatched, first


def verdicts(records: Iterable[RoundRecord] = (), *, gamma: int = 8, arms: Iterable[ArmSaving] = (),
             compositions: Iterable[CompositionCheck] = (), compared: int = 0, mismatched: int = 0,
             first_mismatch: str | None = None, min_rounds: int = MIN_ROUNDS,
             speedups: Iterable[SpeedupCheck] = ()) -> list[Verdict]:
    """All six verdicts; the ones without data come back as "insufficient data"."""
    acc = acceptance_by_class(records)
    return [verdict_p1(acc, gamma, min_rounds), verdict_r1(acc, gamma, min_rounds), verdict_r2(arms),
            verdict_r3(compositions), verdict_r4(compared, mismatched, first_mismatch), verdict_r5(speedups)]
