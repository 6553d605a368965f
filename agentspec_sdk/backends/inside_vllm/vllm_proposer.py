"""vLLM's `custom_class` proposer, delegating to the pure `StructureDrafter`.

vLLM instantiates `AgentSpecProposer(vllm_config)` inside the engine core (in-process or in a separate
process, also under `vllm serve`), calls `load_model(model)` on CPU, then once per step
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` for the whole batch.
The plan (formats, tools, law parameters, records file) comes from the file named in `AGENTSPEC_PLAN`.

Besides the drafter's own round/step lines, each draft handed to vLLM is appended to the records file as
a "draft" line, so the engine wrapper can settle the last round of a request (which the drafter never
sees resolved: the row leaves the batch) against the final output.

Every settled round, budget decision and step also goes to the Prometheus metrics of
`backends.inside_vllm.prom_metrics` (on `vllm serve`'s own /metrics when PROMETHEUS_MULTIPROC_DIR is
set), with or without a records file. The drafter keeps only its first KEEP_ROUNDS rounds in memory.

The drafter's `propose` never raises: it catches a failing step itself (no drafts, a batch error,
logged with its traceback on `agentspec.drafting`), so this adapter has no catch of its own around it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from agentspec_sdk.backends.inside_vllm.prom_metrics import proposer_metrics
from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.hybrid import HybridDrafter
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.plan import PLAN_ENV, DraftPlan
from agentspec_sdk.drafting.rows import RowInput

log = logging.getLogger("agentspec.backends")
KEEP_ROUNDS = 10_000  # rounds kept in memory for in-process inspection; counters and metrics keep the rest


class AgentSpecProposer:
    def __init__(self, vllm_config, model_mode: str | None = None):
        """`model_mode` (one of drafting.hybrid.MODEL_MODES): the structure layer over vLLM's draft
        model (backends.inside_vllm.vllm_hybrid); `propose` then takes the model's drafts per row."""
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        plan_path = os.environ.get(PLAN_ENV)
        plan = DraftPlan.from_env()  # PlanError names the variable / file when missing
        tokenizer = _load_tokenizer(plan.tokenizer or vllm_config.model_config.tokenizer)
        self.model_mode = model_mode
        # the bench's ablation switches, where its engine wrote them (drafting.lab); else none
        options = {"max_model_len": self.max_model_len, "lab": LabSwitches.from_env()}
        self.drafter = (HybridDrafter(plan, tokenizer, mode=model_mode, plan_path=plan_path, **options)
                        if model_mode else StructureDrafter(plan, tokenizer, plan_path=plan_path, **options))
        self.replaced: list[bool] = []  # model_mode: per row of the last step, draft not the model's
        self.model_seconds = 0.0  # model_mode: time in vLLM's draft model (measured by vllm_hybrid)
        self.model_steps = 0
        self.drafter.accounting.keep = KEEP_ROUNDS
        self.metrics = proposer_metrics()
        self.drafter.accounting.observer = self.metrics
        self.steps = 0
        self.seconds = 0.0
        self._last_start: float | None = None

    def load_model(self, *args, **kwargs) -> None:
        """No model: drafts come from structure, grammar and lookup."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                model_drafts=None, **kwargs) -> list[list[int]]:
        started = time.perf_counter()
        n = len(sampled_token_ids)
        # basic slicing inside history(): views, no copies
        rows = [RowInput(token_ids_cpu[i], int(num_tokens_no_spec[i]), bool(len(sampled_token_ids[i])),
                         len(sampled_token_ids[i])) for i in range(n)]
        acc = self.drafter.accounting
        rebuilds, row_errors, batch_errors = acc.rebuilds, acc.errors, acc.batch_errors
        if self.model_mode:  # never raises either; `replaced`: rows whose draft is not the model's
            drafts, self.replaced = self.drafter.propose(rows, model_drafts)
        else:
            drafts = self.drafter.propose(rows)  # never raises: a failing step gives no drafts
        drafts = [self._clip(d, r.num_tokens) for d, r in zip(drafts, rows, strict=True)]
        self._log_drafts(drafts)
        batch_error = acc.batch_errors > batch_errors
        seconds = time.perf_counter() - started
        self.steps += 1
        self.seconds += seconds
        # A row the drafter already knew (not rebuilt) stayed in the batch since the last call: the gap
        # since that call is one engine step, not idle time.
        continued = sum(r.draftable for r in rows) - (acc.rebuilds - rebuilds)
        interval = started - self._last_start if continued > 0 and self._last_start is not None else None
        self._last_start = started
        try:
            self.metrics.step(n, seconds, 0 if batch_error else acc.errors - row_errors, batch_error,
                              interval)
        except Exception:  # metrics never take the engine down
            log.exception("agentspec proposer metrics failed")
        return drafts

    def _clip(self, draft: list[int], num_tokens: int) -> list[int]:
        room = min(self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
        return [int(t) for t in draft[: max(room, 0)]]

    def _records_path(self) -> Path | None:
        path = self.drafter.plan.records_path
        return Path(path) if path else None

    def _log_drafts(self, drafts: list[list[int]]) -> None:
        path = self._records_path()
        if path is None:
            return
        lines = []
        for i, draft in enumerate(drafts):
            pending = self.drafter.pending_draft(i) if draft else None
            if pending is None:
                continue
            lines.append(json.dumps({
                "type": "draft", "position": pending.position, "prefix_hash": pending.prefix_hash,
                "kind": pending.kind, "law_class": pending.law_class, "source": pending.source,
                "tokens": draft}))
        self._append(lines)

    def _append(self, lines: list[str]) -> None:
        # the drafter's file, rotated at the plan's cap; warns when it cannot
        self.drafter.accounting.write(lines)

    @property
    def batch_errors(self) -> int:
        """Steps where the drafter failed as a whole: the batch got no drafts."""
        return self.drafter.accounting.batch_errors

    def stats(self) -> dict:
        out = self.drafter.stats()  # batch_errors included
        out["adapter_steps"] = self.steps
        out["adapter_s"] = self.seconds
        if self.model_mode:
            out["model_draft_s"], out["model_draft_steps"] = self.model_seconds, self.model_steps
        return out


def _load_tokenizer(name):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
