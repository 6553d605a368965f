"""Next-token entropies of the target per law class, for the Draft Law's rho_c = exp(-mean H_c).

vLLM returns at most top-k log-probabilities, so the entropies are computed once, after the timed
runs, by the same model in transformers: one forward pass over each recorded turn (prompt + output),
the full softmax entropy at every output position, grouped by the class of the token that followed.
The distribution is the model's own, before any grammar mask, which is what rho_c describes.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentspec_sdk.replay.loop import TurnLog

MAX_TOKENS = 60_000  # prompt + output tokens scored in all; beyond it turns are skipped (bounded time)


def class_entropies(model: str | None, logs: Iterable[TurnLog], *, max_tokens: int = MAX_TOKENS) -> dict[str, list[float]]:
    """{class: [entropy in nats per output position]} over the distinct turns of `logs` that carry
    prompt ids and per-token classes."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentspec_sdk.backends.model_bundle import resolve_model

    path = resolve_model(model)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.eval()
    out: dict[str, list[float]] = {}
    seen: set[str] = set()
    budget = max_tokens
    with torch.inference_mode():
        for log in logs:
            if not log.prompt_ids or not log.token_ids or len(log.token_classes) != len(log.token_ids):
                continue
            key = log.prompt_hash + ":" + ",".join(map(str, log.token_ids[:8]))
            total = len(log.prompt_ids) + len(log.token_ids)
            if key in seen or total > budget:
                continue
            seen.add(key)
            budget -= total
            ids = torch.tensor([log.prompt_ids + log.token_ids[:-1]])
            logits = lm(input_ids=ids).logits[0, len(log.prompt_ids) - 1:]
            logp = torch.log_softmax(logits.float(), dim=-1)
            entropy = (-(logp.exp() * logp).sum(dim=-1)).tolist()
            for h, cls in zip(entropy, log.token_classes, strict=False):
                out.setdefault(cls, []).append(max(float(h), 0.0))
    return out
