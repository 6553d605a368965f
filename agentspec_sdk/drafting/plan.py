"""The plan the SDK hands to the in-vLLM proposer: formats, tools, tokenizer, law parameters, switches.

It is a JSON file whose path is in the environment variable AGENTSPEC_PLAN, so it also reaches a
separately started `vllm serve`. The engine rewrites it when tools are registered after start; the
drafter notices through `PlanWatcher` (mtime checked at most every `poll_s`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agentspec_sdk.errors import AgentSpecError, PlanError
from agentspec_sdk.structure.formats import AgentFormat, get_format
from agentspec_sdk.structure.tools import ToolRegistry

PLAN_ENV = "AGENTSPEC_PLAN"
DEFAULT_PRIOR = {"S": 0.8, "R": 0.45, "F": 0.3}


@dataclass
class DraftPlan:
    formats: list[dict] = field(default_factory=lambda: [get_format("tool_calls").to_dict()])
    tools: list[dict] = field(default_factory=list)
    tokenizer: str | None = None
    turn_start: str | None = None  # text that opens the model's turn; None: from the chat template
    gamma_max: int = 8
    # draft tokens per step over all rows; None: no cap (the price sizes drafts)
    step_budget: int | None = None
    kappa: float = 1.0
    # verify cost of one extra token / one target pass, for one sequence; the prior when learn_delta.
    # 0.04: what the drafter learned in every bench run of 2026-12-04/05 (0.037 on prose rows of 0.3k
    # tokens, 0.041-0.049 on the agent arms' rows of 1-1.5k); the earlier 0.02 priced a draft token at
    # b 8 at 0.03 on prose until learned, against the 0.16-0.25 the pass cost
    # (docs/experiments/2026-12-05-prior-price-and-prose.md)
    delta: float = 0.04
    learn_delta: bool = True  # learn delta from the proposer's own step times (law.OnlineStepCost)
    d: float = 0.0  # drafter cost per drafted token / one target pass (forced + lookup: ~0)
    # A drafted token's verify cost grows with its row's context (the pass cost model's verified_ctx):
    # delta_ctx per 1k tokens of context, in delta's units (the bench's pass cost fits here: 1.2-1.7 ms
    # per verified token per 1k context against 111-115 ms per one-row pass). delta holds at ctx_ref
    # tokens; once learned, at the mean context of the steps it was learned from. ctx_ref None (the
    # default): the prior holds at each step's own mean row context, so a row pays for its context
    # against the rows it shares the pass with. A fixed reference made a step of short rows nearly
    # free, yet its pass is short too: the learned delta was 0.037 at 0.3k tokens per row and
    # 0.041-0.049 at 1-1.5k, not 0.016 lower
    delta_ctx: float = 0.013
    ctx_ref: int | None = None
    prior_acceptance: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PRIOR))
    gate: bool = True
    isolation: bool = True  # False: ablation "structure-without-isolation" (drafts may cross boundaries)
    budget: bool = True  # False: ablation "structure-without-budget" (fixed gamma_max for every row)
    # which draft tokens the budget sends: "value" every token whose expected acceptance is worth its
    # price; "rate" only those worth their price times the run's tokens per unit of pass cost
    # (budget.TokenRate: the law's optimal draft when the acceptance estimates are calibrated). "rate"
    # wins offline on code_agent (up to +4.4%) and long_context (up to +2.7%) but loses ReAct plain
    # (up to -3.3%) and, in the engine, D-react (-10% in cost): the tails' estimated values are too
    # low for it, so it is not the default
    # (docs/experiments/2026-12-04-decode-time-and-budget-rule.md)
    budget_rule: str = "value"
    # Past the segment end: "wall" (a draft stops there) or "price" (the suffix tree's tokens past the
    # boundary stay in the candidate as source "cross", each worth its tree confidence times the
    # learned acceptance of (class, "cross"), and the budget sends them only where that pays; the
    # default: >= "wall" offline on tool_calls, both ReAct sets (+13-14%) and long_context; code_agent
    # -0.19%, docs/experiments/2026-12-02-price-fixes.md)
    boundary: str = "price"
    records_path: str | None = None
    records_max_bytes: int | None = None  # rotate the records file past this size; None: 64 MiB
    lookup_min_chars: int = 3
    # the same inside code (segment kinds of content "code": code blocks, Gemma's tool_code), where
    # 3-5 characters (`(self`, `    re`) recur with many continuations
    # (docs/experiments/2026-12-02-replay-schedule-and-code-lookups.md)
    lookup_min_chars_code: int = 6
    # SuffixDecoding's trees (arctic-inference) as a draft source inside segments; off when the
    # package is missing (logged) or for the ablation "structure-no-suffix"
    suffix_trees: bool = True
    # the trees' two knobs (vLLM's suffix_decoding_max_spec_factor / _min_token_prob; vLLM's defaults)
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    # the trees' draft at this larger spec factor: its tokens past the factor-1 draft are a source of
    # their own ("extend", priced by their learned acceptance per class and kind); None: none
    suffix_extend_factor: float | None = 2.0
    # learn, per (segment kind, own candidate's source), a bias added to own's worth in the row's choice
    # between own and the tree, from which of the two the target's tokens show went further
    # (choice.ChoiceBias.judge); False: the worths compared as they are
    learn_choice: bool = True
    # the estimates a draft is sized by (the trees' confidences, the lookups' learned acceptance) times
    # a factor learned per (class, segment kind, source, depth) from what the target accepted
    # (law.OnlineCalibration); False: the estimates as they are
    calibrate: bool = True
    version: int = 0

    def __post_init__(self) -> None:
        self.formats = [f.to_dict() if isinstance(f, AgentFormat) else
                        get_format(f).to_dict() if isinstance(f, str) else dict(f) for f in self.formats]
        if isinstance(self.tools, ToolRegistry):
            self.tools = self.tools.openai_tools()
        self.tools = [dict(t) for t in self.tools]
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.gamma_max, int) or not 0 <= self.gamma_max <= 64:
            raise PlanError(f"plan: gamma_max must be an integer in [0, 64], got {self.gamma_max!r}")
        if self.step_budget is not None and (not isinstance(self.step_budget, int) or self.step_budget < 0):
            raise PlanError(f"plan: step_budget must be None or an integer >= 0, got {self.step_budget!r}")
        if self.ctx_ref is not None and (isinstance(self.ctx_ref, bool) or not isinstance(self.ctx_ref, int)
                                         or self.ctx_ref < 0):
            raise PlanError(f"plan: ctx_ref must be null or an integer >= 0, got {self.ctx_ref!r}")
        for name in ("kappa", "delta", "d", "delta_ctx"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise PlanError(f"plan: {name} must be a number >= 0, got {value!r}")
        for name in ("learn_delta", "gate", "isolation", "budget", "suffix_trees", "learn_choice",
                     "calibrate"):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(f"plan: {name} must be true or false, got {getattr(self, name)!r}")
        for cls, alpha in self.prior_acceptance.items():
            if not isinstance(alpha, int | float) or not 0.0 <= alpha <= 1.0:
                raise PlanError(f"plan: prior_acceptance[{cls!r}] must be in [0, 1], got {alpha!r}")
        if self.records_max_bytes is not None and (
                isinstance(self.records_max_bytes, bool) or not isinstance(self.records_max_bytes, int)
                or self.records_max_bytes < 4096):
            raise PlanError(f"plan: records_max_bytes must be None or an integer >= 4096, "
                            f"got {self.records_max_bytes!r}")
        for name in ("lookup_min_chars", "lookup_min_chars_code"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"plan: {name} must be an integer >= 1, got {value!r}")
        factor, prob = self.suffix_max_spec_factor, self.suffix_min_token_prob
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0:
            raise PlanError(f"plan: suffix_max_spec_factor must be a number > 0, got {factor!r}")
        if isinstance(prob, bool) or not isinstance(prob, int | float) or not 0 <= prob <= 1:
            raise PlanError(f"plan: suffix_min_token_prob must be in [0, 1], got {prob!r}")
        ext = self.suffix_extend_factor
        if ext is not None and (isinstance(ext, bool) or not isinstance(ext, int | float) or ext <= 0):
            raise PlanError(f"plan: suffix_extend_factor must be None or a number > 0, got {ext!r}")
        if self.budget_rule not in ("rate", "value"):
            raise PlanError(f"plan: budget_rule must be 'rate' or 'value', got {self.budget_rule!r}")
        if self.boundary not in ("wall", "price"):
            raise PlanError(f"plan: boundary must be 'wall' or 'price', got {self.boundary!r}")
        if not self.formats:
            raise PlanError("plan: formats must name at least one agent format")
        try:
            self.agent_formats()
            self.registry()
        except AgentSpecError as exc:
            raise PlanError(f"plan: {exc}") from exc

    # -- derived objects ----------------------------------------------------------------------

    def agent_formats(self) -> list[AgentFormat]:
        return [AgentFormat.from_dict(f) for f in self.formats]

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self.tools)

    def effective_step_budget(self) -> int | None:
        return self.step_budget

    # -- file ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> int:
        """The plan's content (its `version` aside) as a 48-bit number, exact in a float: replicas that
        read one plan file show one value on their /metrics (`agentspec:plan_digest`)."""
        import hashlib

        content = {k: v for k, v in self.to_dict().items() if k != "version"}
        text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
        return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftPlan:
        if not isinstance(data, Mapping):
            raise PlanError(f"plan must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise PlanError(f"plan: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(data))

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (a reader never sees half a file) and bump `version`."""
        path = Path(path)
        self.version += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> DraftPlan:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise PlanError(f"cannot read plan file {path}: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_env(cls) -> DraftPlan:
        path = os.environ.get(PLAN_ENV)
        if not path:
            raise PlanError(f"environment variable {PLAN_ENV} is not set (it names the draft plan file)")
        return cls.load(path)


class PlanWatcher:
    """Reloads a plan file when its mtime changes; checks at most every `poll_s` seconds."""

    def __init__(self, path: str | os.PathLike, poll_s: float = 0.5):
        self.path = Path(path)
        self.poll_s = poll_s
        self._mtime = self.path.stat().st_mtime_ns
        self._next = time.monotonic() + poll_s
        self.plan = DraftPlan.load(self.path)

    def poll(self) -> DraftPlan | None:
        """The new plan if the file changed since the last load, else None. A bad file keeps the old."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.poll_s
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if mtime == self._mtime:
            return None
        self._mtime = mtime
        try:
            plan = DraftPlan.load(self.path)
        except PlanError:
            return None
        self.plan = plan
        return plan
