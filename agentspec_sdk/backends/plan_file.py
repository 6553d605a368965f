"""`PlanFile`: tools and formats added in place to the draft plan (`AGENTSPEC_PLAN`) of a server on this
machine, so its proposer drafts for them. Both the remote client (`RemoteEngine`) and the `agentspec` tool
parser inside `vllm serve` write through it; light (the plan's own module only, imported when used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["PlanFile"]


class PlanFile:
    """The plan of a server on this machine (`agentspec serve --plan`), edited in place."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def update(self, tools: list[dict] | None = None, fmt: Any = None) -> None:
        """Add the tools (OpenAI dicts) whose names the plan lacks, and `fmt` where it differs."""
        from agentspec_sdk.drafting.plan import DraftPlan

        plan = DraftPlan.load(self.path)
        changed = False
        if tools is not None:
            have = {t["function"]["name"] for t in plan.tools if "function" in t}
            new = [t for t in tools if t["function"]["name"] not in have]
            plan.tools, changed = plan.tools + new, bool(new)
        if fmt is not None and fmt.to_dict() not in plan.formats:
            plan.formats = [f for f in plan.formats if f.get("name") != fmt.name] + [fmt.to_dict()]
            changed = True
        if changed:
            plan.save(self.path)
