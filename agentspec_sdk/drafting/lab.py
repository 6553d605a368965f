"""The bench's ablation switches (`LabSwitches`): parts of the structure drafter a lab run turns off
to measure what each is worth. Not deployment settings: never in the draft plan; the drafter takes
them as a constructor argument, and the in-vLLM proposer from the file named by AGENTSPEC_LAB, which
only the bench's engine writes (`Engine(lab=...)`). Absent: every part on, as a deployment runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from agentspec_sdk.errors import PlanError

__all__ = ["ABLATIONS", "LAB_ENV", "LAB_FIELDS", "LabSwitches"]

LAB_ENV = "AGENTSPEC_LAB"


class LabSwitches(BaseModel):
    """Each field True (or "value") is the drafter as it ships; the others are ablations."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    isolation: bool = True  # False: drafts and lookups may cross segment boundaries
    budget: bool = True  # False: every row drafts gamma_max tokens (no budget sizing)
    gate: bool = True  # without the budget: a row drafts only where its first token pays
    # "value": the budget sends each token worth its price; "rate": worth its price times the run's
    # tokens per unit of pass cost (budget.TokenRate)
    budget_rule: Literal["value", "rate"] = "value"
    calibrate: bool = True  # False: the estimates as the trees and the learned acceptance give them
    suffix_trees: bool = True  # False: no SuffixDecoding trees as a draft source
    learn_choice: bool = True  # False: own and tree compared by their worths as they are

    @classmethod
    def of(cls, value: LabSwitches | Mapping[str, Any] | None, source: str = "lab switches") -> LabSwitches:
        """`value` as switches (None: the defaults); `source`: what an error names."""
        if value is None:
            return cls()
        if isinstance(value, LabSwitches):
            return value
        if not isinstance(value, Mapping):
            raise PlanError(f"{source}: must be a JSON object, got {type(value).__name__}")
        try:
            return cls.model_validate(dict(value))
        except ValidationError as exc:
            raise PlanError("; ".join(f"{source}: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                      for e in exc.errors())) from None

    @property
    def is_default(self) -> bool:
        return self == LabSwitches()

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.model_dump()), encoding="utf-8")
        return path

    @classmethod
    def from_env(cls) -> LabSwitches:
        """The switches in the file AGENTSPEC_LAB names; every part on where it is unset."""
        path = os.environ.get(LAB_ENV)
        if not path:
            return cls()
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise PlanError(f"cannot read lab switches {path} ({LAB_ENV}): {exc}") from None
        return cls.of(data, f"lab switches {path}")


# the ablations the bench runs (`agentspec bench` modes structure-no-budget, ...): name -> switches
ABLATIONS: dict[str, LabSwitches] = {
    "no_budget": LabSwitches(budget=False),
    "no_isolation": LabSwitches(isolation=False),
    "rate_rule": LabSwitches(budget_rule="rate"),
    "uncalibrated": LabSwitches(calibrate=False),
    "no_suffix": LabSwitches(suffix_trees=False),
}
# what plan files written before the switches left the plan hold: each switch at its default
LAB_FIELDS: dict[str, Any] = {name: f.default for name, f in LabSwitches.model_fields.items()}
