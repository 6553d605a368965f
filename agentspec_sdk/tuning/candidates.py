"""The drafters `agentspec tune` replays: vLLM's stock peers (ngram; suffix at vLLM's defaults and on a
grid of its two knobs) and the structure drafter under candidate per-segment-kind policies.

A candidate is a picklable `Candidate` (name, family, settings) so that replays can run in worker
processes; `build_drafter` turns it into the drafter `simulate` calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentspec_sdk.backends.offline_peers import SUFFIX_DEFAULTS, SuffixDrafter, ngram_drafter
from agentspec_sdk.drafting.budget import sequence_price
from agentspec_sdk.drafting.rows import RowInput

__all__ = ["FAMILIES", "SUFFIX_GRID", "Candidate", "StructureCall", "build_drafter", "kind_candidates",
           "priced", "stock_candidates", "suffix_grid"]

FAMILIES = ("ngram", "suffix", "structure")
# the tuned peer's grid: vLLM's suffix_decoding_max_spec_factor and suffix_decoding_min_token_prob
SUFFIX_GRID = {"max_spec_factor": (0.5, 1.0, 2.0, 4.0), "min_token_prob": (0.05, 0.1, 0.2, 0.3)}


@dataclass(frozen=True)
class Candidate:
    """One drafter to replay. `family`: ngram, suffix (`knobs`: max_spec_factor, min_token_prob) or
    structure (`kinds`: the plan's KindPolicy per segment kind, as dicts; "*": every kind not named)."""

    name: str
    family: str
    knobs: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"candidate family must be one of {FAMILIES}, got {self.family!r}")


def suffix_grid() -> list[Candidate]:
    """vLLM's suffix proposer at every point of SUFFIX_GRID (vLLM's defaults among them)."""
    return [Candidate(f"suffix[{f:g},{p:g}]", "suffix", {"max_spec_factor": f, "min_token_prob": p})
            for f in SUFFIX_GRID["max_spec_factor"] for p in SUFFIX_GRID["min_token_prob"]]


def stock_candidates() -> list[Candidate]:
    """ngram and suffix at vLLM's defaults."""
    defaults = {k: SUFFIX_DEFAULTS[k] for k in ("max_spec_factor", "min_token_prob")}
    return [Candidate("ngram", "ngram"), Candidate("suffix", "suffix", defaults)]


def kind_candidates(tree_knobs: dict[str, float]) -> list[Candidate]:
    """The structure drafter with one policy in every segment kind (`kinds: {"*": policy}`): the plan's
    defaults, the boundary wall, the lookups at longer minimum matches, no extension draft, vLLM's
    suffix draft (`trees`, at the knobs of `tree_knobs`: the suffix-tuned grid point) and no draft.
    The per-kind choice picks, in each kind, the candidate that costs least there."""
    trees = {"policy": "trees", "tree_spec_factor": float(tree_knobs["max_spec_factor"]),
             "tree_min_token_prob": float(tree_knobs["min_token_prob"])}
    policies = {
        "structure": {"policy": "structure"},
        "structure-wall": {"policy": "structure", "boundary": "wall"},
        "structure-lookup6": {"policy": "structure", "lookup_min_chars": 6},
        "structure-no-extend": {"policy": "structure", "extend_factor": 0.0},
        "trees": trees,
        "off": {"policy": "off"},
    }
    return [Candidate(name, "structure", kinds={"*": policy}) for name, policy in policies.items()]


def priced(delta: float, batch: int) -> dict:
    """The plan fields that price the structure drafter's tokens as the replay's cost charges them:
    `delta` per drafted token per row of a `batch`-row step, every row alike. The engine's drafter
    learns its price from the passes it times; a replay has no passes, so it is given the price its
    cost uses: the one-sequence delta whose `budget.batch_price` at `batch` rows is `delta`."""
    return {"delta": sequence_price(delta, batch), "delta_ctx": 0.0}


class StructureCall:
    """The structure drafter as simulate calls it; `classes[k]` / `kinds[k]`: the law class of row k's
    last draft / the segment kind row k was in (drafter.last_kinds); with `explain`, `notes[k]`: what
    the drafter weighed for row k in the last step.

    `finished_first`: the rows that finished in the previous step are handed over before the active
    ones (simulate's `first`), as the keyed SuffixDrafter learns them (`retire`) before its next
    step: the order under which a "trees" policy drafts what SuffixDrafter drafts. `qualified`: the
    kinds as "<format>.<kind>" (the format the drafter picked for the row), as a plan's `kinds` keys
    one format's kind."""

    def __init__(self, drafter, explain: bool = False, finished_first: bool = False, qualified: bool = False):
        self.drafter, self.classes, self.kinds, self.notes = drafter, [], [], []
        self.finished_first, self.qualified = finished_first, qualified
        if explain:
            drafter.explain = []

    def __call__(self, histories, first: int = 0) -> list[list[int]]:
        """Drafts for `histories[first:]` (the rows before `first` are only learned from)."""
        drafts = self.drafter.propose([RowInput(h) for h in histories])[first:]
        if self.drafter.explain is not None:
            self.notes = (self.drafter.explain.pop()[first:] if self.drafter.explain
                          else [{} for _ in drafts])
            self.drafter.explain.clear()
        pending = [self.drafter.pending_draft(first + k) if d else None for k, d in enumerate(drafts)]
        self.classes = [p.law_class if p is not None else None for p in pending]
        self.kinds = self.drafter.last_kinds[first:]
        if self.qualified:
            states = self.drafter.rows.states[first:]
            self.kinds = [f"{st.fmt.name}.{kind}" if kind is not None and st is not None else None
                          for kind, st in zip(self.kinds, states, strict=True)]
        return drafts


def structure_drafter(gamma: int, tokenizer, plan_fields: dict, explain: bool = False, lab=None,
                      finished_first: bool = False, qualified: bool = False) -> StructureCall:
    """The product's structure drafter over a plan of `plan_fields` (formats, tools, tokenizer, kinds,
    prices ...), at most `gamma` tokens a draft; `lab`: the bench's ablation switches
    (drafting.lab.LabSwitches); `finished_first`, `qualified`: see StructureCall."""
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan

    # learn_delta off: the simulated steps have no target pass to time
    plan = DraftPlan(**{**plan_fields, "gamma_max": gamma, "learn_delta": False})
    return StructureCall(StructureDrafter(plan, tokenizer, lab=lab), explain=explain,
                         finished_first=finished_first, qualified=qualified)


def build_drafter(candidate: Candidate, gamma: int, tokenizer, plan_fields: dict, qualified: bool = False):
    """The drafter simulate replays for `candidate` (a fresh one: drafters learn as they go);
    `qualified`: see StructureCall."""
    if candidate.family == "ngram":
        return ngram_drafter(gamma)
    if candidate.family == "suffix":
        return SuffixDrafter(gamma, **candidate.knobs)
    kinds = {kind: dict(policy) for kind, policy in candidate.kinds.items()}
    # finished rows first: a kind under "trees" then drafts exactly what vLLM's suffix proposer drafts
    return structure_drafter(gamma, tokenizer, {**plan_fields, "kinds": kinds}, finished_first=True,
                             qualified=qualified)
