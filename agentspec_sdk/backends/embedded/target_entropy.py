"""Next-token entropies of the target per law class, for the Draft Law's rho_c = exp(-mean H_c).

vLLM returns at most top-k log-probabilities, so the entropies are computed once, after the timed
runs, by the same model in transformers: one forward pass over each recorded turn (prompt + output),
the full softmax entropy at every output position, grouped by the class of the token that followed.
Where the turn ran under a grammar, the logits are first masked by it (llguidance, the same grammar
text vLLM was given): that masked distribution is the one the target sampled from, and inside a tool
call it is what makes schema-bound text predictable. Without the mask a small model spreads mass over
JSON it could never write there (measured on the bundled traces: S 1.22 nats raw).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_TOKENS = 60_000  # prompt + output tokens scored in all; beyond it turns are skipped (bounded time)


def class_entropies(model: str | None, logs: Iterable[Any], *,
                    max_tokens: int = MAX_TOKENS) -> dict[str, list[float]]:
    """{class: [entropy in nats per output position]} over the distinct turns of `logs` (the replay's
    TurnLog: `prompt_ids`, `token_ids`, `token_classes`, `grammar`, `prompt_hash`) that carry prompt
    ids and per-token classes."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentspec_sdk.backends.model_bundle import resolve_model

    path = resolve_model(model)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.eval()
    ll = None
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
            logits = lm(input_ids=ids).logits[0, len(log.prompt_ids) - 1:].float()
            if log.grammar:
                if ll is None:
                    import llguidance.hf
                    from transformers import AutoTokenizer

                    ll = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(path))
                _mask(ll, log.grammar, log.token_ids, logits)
            probs = torch.softmax(logits, dim=-1)
            entropy = (-torch.special.xlogy(probs, probs).sum(dim=-1)).tolist()  # 0 log 0 = 0 where masked
            for h, cls in zip(entropy, log.token_classes, strict=False):
                out.setdefault(cls, []).append(max(float(h), 0.0))
    return out


def _mask(ll, grammar: str, tokens: list[int], logits) -> None:
    """Mask each position's logits (in place) by what `grammar` allows there, feeding the matcher the
    tokens written; positions after the matcher stops or rejects a token stay unmasked."""
    import llguidance
    import llguidance.torch as llt
    import torch

    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    if matcher.is_error():
        return
    bitmask = llt.allocate_token_bitmask(1, ll.vocab_size)
    width = min(logits.shape[-1], ll.vocab_size)
    for i, tok in enumerate(tokens):
        if matcher.is_stopped() or matcher.is_error():
            return
        llt.fill_next_token_bitmask(matcher, bitmask, 0)
        row = logits[i:i + 1, :width]
        llt.apply_token_bitmask_inplace(row, bitmask)
        if logits.shape[-1] > width:
            logits[i, width:] = -torch.inf
        if not matcher.consume_token(int(tok)):
            return
