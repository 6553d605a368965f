"""What vLLM does to every draft before verifying it: keep the prefix the request's grammar accepts."""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["TRIMMED_KINDS", "GrammarTrim", "llguidance_grammar"]

# grammar kinds (capture format: the `kind` of a grammar line) the trim turns into an llguidance grammar
TRIMMED_KINDS = ("lark", "json", "regex", "choice", "llguidance")


def llguidance_grammar(kind: str, text: str) -> str | None:
    """The llguidance grammar of a grammar as sent to vLLM; None for a kind the trim cannot read
    (e.g. structural_tag: such turns are replayed untrimmed)."""
    import llguidance

    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(text)
    if kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(text)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    if kind == "choice":
        choices = json.loads(text) if text.lstrip().startswith("[") else [text]
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(str(c)) for c in choices))
    if kind == "llguidance":
        return text
    return None


class GrammarTrim:
    """`trim(turn, pos, draft)`: the prefix of `draft` the turn's grammar allows after the turn's first
    `pos` output tokens (`validate_tokens` on the turn's llguidance matcher, advanced over the tokens
    written so far), as vLLM trims a draft before verifying it. `grammars[turn["grammar"]]`: the
    grammar text as llguidance reads it (a Lark grammar), or a (kind, text) pair as captured; a turn
    without a grammar, or whose grammar kind the trim cannot read, keeps its drafts whole."""

    def __init__(self, grammars: Sequence, tokenizer=None, *, ll_tokenizer=None):
        """`tokenizer`: the model's (transformers; default the default model's), or `ll_tokenizer`: its
        llguidance tokenizer, built once by the caller."""
        import llguidance
        import llguidance.hf

        if ll_tokenizer is None:
            if tokenizer is None:
                from transformers import AutoTokenizer

                from agentspec_sdk.backends.model_bundle import resolve_model
                tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
            ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self._llguidance = llguidance
        self.ll = ll_tokenizer
        self.grammars = [g if isinstance(g, str) else llguidance_grammar(*g) for g in grammars]
        self._matchers: dict[int, tuple] = {}  # id(turn) -> (matcher, tokens consumed)
        # grammar index -> a matcher that consumed nothing: each turn's matcher is a copy of it (a
        # grammar compiles once, not once per turn)
        self._fresh: dict[int, object] = {}

    def __call__(self, turn: dict, pos: int, draft: list[int]) -> list[int]:
        index = turn.get("grammar")
        grammar = self.grammars[index] if index is not None and index < len(self.grammars) else None
        if not grammar or not draft:
            return draft
        key = id(turn)
        if key not in self._matchers:
            if index not in self._fresh:
                self._fresh[index] = self._llguidance.LLMatcher(self.ll, grammar, log_level=0)
            self._matchers[key] = (self._fresh[index].deep_copy(), 0)
        matcher, done = self._matchers[key]
        if pos > done:
            matcher.consume_tokens(turn["out"][done:pos])
            self._matchers[key] = (matcher, pos)
        if matcher.is_stopped() or matcher.is_error():
            return []
        return draft[: matcher.validate_tokens(draft)]

    def release(self, turn: dict) -> None:
        """Forget a finished turn's matcher (a long capture holds one per turn otherwise)."""
        self._matchers.pop(id(turn), None)
