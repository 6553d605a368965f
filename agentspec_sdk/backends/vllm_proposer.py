"""vLLM's `custom_class` proposer, delegating to the pure `StructureDrafter`.

vLLM instantiates `AgentSpecProposer(vllm_config)` inside the engine core (in-process or in a separate
process, also under `vllm serve`), calls `load_model(model)` on CPU, then once per step
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` for the whole batch.
The plan (formats, tools, law parameters, records file) comes from the file named in `AGENTSPEC_PLAN`.

Besides the drafter's own round/step lines, each draft handed to vLLM is appended to the records file as
a "draft" line, so the engine wrapper can settle the last round of a request (which the drafter never
sees resolved: the row leaves the batch) against the final output.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from agentspec_sdk.drafting.drafter import RowInput, StructureDrafter
from agentspec_sdk.drafting.plan import PLAN_ENV, DraftPlan

log = logging.getLogger("agentspec.proposer")


class AgentSpecProposer:
    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        plan_path = os.environ.get(PLAN_ENV)
        plan = DraftPlan.from_env()  # PlanError names the variable / file when missing
        tokenizer = _load_tokenizer(plan.tokenizer or vllm_config.model_config.tokenizer)
        self.drafter = StructureDrafter(plan, tokenizer, plan_path=plan_path)
        self.batch_errors = 0  # steps where the drafter raised: the whole batch got no drafts
        self.steps = 0
        self.seconds = 0.0

    def load_model(self, *args, **kwargs) -> None:
        """No model: drafts come from structure, grammar and lookup."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **kwargs) -> list[list[int]]:
        started = time.perf_counter()
        n = len(sampled_token_ids)
        rows = [RowInput(token_ids_cpu[i], int(num_tokens_no_spec[i]), bool(len(sampled_token_ids[i])))
                for i in range(n)]  # basic slicing inside history(): views, no copies
        try:
            drafts = self.drafter.propose(rows)
            drafts = [self._clip(d, r.num_tokens) for d, r in zip(drafts, rows, strict=True)]
            self._log_drafts(drafts)
        except Exception:  # the engine must survive any drafter bug: no drafts this step
            self.batch_errors += 1
            log.exception("agentspec proposer failed; no drafts for this step (%d so far)", self.batch_errors)
            drafts = [[] for _ in range(n)]
            self._log_error(n)
        self.steps += 1
        self.seconds += time.perf_counter() - started
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
        _append(path, lines)

    def _log_error(self, rows: int) -> None:
        path = self._records_path()
        if path is not None:
            _append(path, [json.dumps({"type": "step", "rows": rows, "drafted": 0, "proposer_s": 0.0,
                                       "errors": rows, "batch_error": True})])

    def stats(self) -> dict:
        out = self.drafter.stats()
        out["batch_errors"] = self.batch_errors
        out["adapter_steps"] = self.steps
        out["adapter_s"] = self.seconds
        return out


def _append(path: Path, lines: list[str]) -> None:
    if not lines:
        return
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    except OSError:
        log.warning("agentspec proposer cannot write records to %s", path)


def _load_tokenizer(name):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
