"""What to run with a tuned plan (`agentspec tune` prints it and the report holds it).

Where the plan drafts exactly as vLLM's suffix drafter in every kind (`DraftPlan.suffix_equivalent`),
vLLM's own suffix drafter sends the same drafts without the structure proposer's per-step work
(docs/deployment.md, what a GPU deployment pays per step): that is the command. Otherwise the
structure drafter serves the plan.
"""

from __future__ import annotations

import json
import os
import shlex

from agentspec_sdk.backends.engine_config import stock_speculative_config
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.suffix_source import MAX_SPEC_FACTOR, MIN_TOKEN_PROB

__all__ = ["deploy_advice"]


def deploy_advice(plan: DraftPlan, plan_path: str | os.PathLike, gamma: int) -> dict:
    """{"speculation": "suffix" | "structure", "command": the server's command line, "why": one line}."""
    knobs = plan.suffix_equivalent()
    where = shlex.quote(str(plan_path))
    if knobs is None:
        return {"speculation": "structure",
                "command": f"agentspec serve --speculation structure --plan {where} --gamma-max {gamma}",
                "why": "the plan drafts with the structure drafter in some kinds"}
    factor, prob = knobs
    why = ("every kind sends vLLM's suffix draft: vLLM's own suffix drafter sends the same drafts "
           "without the structure proposer's per-step work")
    if (factor, prob) == (MAX_SPEC_FACTOR, MIN_TOKEN_PROB):
        return {"speculation": "suffix", "why": why,
                "command": f"agentspec serve --speculation suffix --gamma-max {gamma}"}
    spec = stock_speculative_config("suffix", gamma, suffix_max_spec_factor=factor,
                                    suffix_min_token_prob=prob)
    return {"speculation": "suffix",
            "command": f"vllm serve MODEL --speculative-config {shlex.quote(json.dumps(spec))}",
            "why": why + f" (at spec factor {factor:g}, min token prob {prob:g})"}
