"""Structure-aware drafting logic (no vllm import): the plan, the proposer, the budget allocator."""

from agentspec_sdk.drafting.budget import allocate, batch_price, fixed, predicted_saving, row_prices
from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.fingerprint import RollingHash, prefix_hash, prefix_hashes
from agentspec_sdk.drafting.plan import PLAN_ENV, DraftPlan, PlanError, PlanWatcher
from agentspec_sdk.drafting.records import DraftRound

__all__ = [
    "PLAN_ENV",
    "DraftPlan",
    "DraftRound",
    "PlanError",
    "PlanWatcher",
    "RollingHash",
    "StructureDrafter",
    "allocate",
    "batch_price",
    "row_prices",
    "fixed",
    "predicted_saving",
    "prefix_hash",
    "prefix_hashes",
]
