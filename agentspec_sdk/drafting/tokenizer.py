"""The drafter's view of the target's tokenizer: the llguidance tokenizer with per-token bytes, and
the text the chat template puts around a model turn."""

from __future__ import annotations

from agentspec_sdk.drafting.text import TokenBytes

FALLBACK_TURN_START = "<|im_start|>assistant\n"
FALLBACK_TURN_END = "<|im_end|>"

_LL_CACHE: dict[int, tuple] = {}


def ll_tokenizer(tokenizer):
    """(llguidance tokenizer, per-token bytes) for an HF or llguidance tokenizer; cached (~1 s to build)."""
    import llguidance

    hit = _LL_CACHE.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1], hit[2]
    if isinstance(tokenizer, llguidance.LLTokenizer):
        ll = tokenizer
    else:
        import llguidance.hf

        ll = llguidance.hf.from_tokenizer(tokenizer)
    _LL_CACHE[id(tokenizer)] = (tokenizer, ll, TokenBytes(ll))
    return ll, _LL_CACHE[id(tokenizer)][2]


class MemoTokenizer:
    """The llguidance tokenizer's `tokenize_str` and `tokenize_bytes`, each remembered for up to
    `size` texts (then forgotten all at once), with `decode_bytes` and `decode_str` passed through:
    what `forced.canonical_tokens` and the tool-call matchers (`forced.CallMatcher`) call.

    Every turn opens with the same text (the chat template's last tokens, then the opening the
    format forces, e.g. `assistant\n<tool_call>{"name":"`), and draft text recurs: 15–43% of
    `canonical_tokens`' calls repeated one already made, on captured turns of code, ReAct, tool calls
    and long contexts; of the matchers' (the forced text checked for a closed object, the lookup text
    trimmed to what the grammar allows) 67-78% (docs/experiments/2026-12-06-corpus-index-and-token-value.md,
    2026-12-06-matcher-memo-and-suffix-fallback.md)."""

    __slots__ = ("ll", "size", "_memo", "_bytes_memo")

    def __init__(self, ll, size: int = 1024):
        self.ll, self.size = ll, size
        self._memo: dict[str, list[int]] = {}
        self._bytes_memo: dict[bytes, list[int]] = {}

    def tokenize_str(self, text: str) -> list[int]:
        tokens = self._memo.get(text)
        if tokens is None:
            if len(self._memo) >= self.size:
                self._memo.clear()
            tokens = self._memo[text] = self.ll.tokenize_str(text)
        return list(tokens)  # a copy: callers slice and keep what they get

    def tokenize_bytes(self, data: bytes) -> list[int]:
        tokens = self._bytes_memo.get(data)
        if tokens is None:
            if len(self._bytes_memo) >= self.size:
                self._bytes_memo.clear()
            tokens = self._bytes_memo[data] = self.ll.tokenize_bytes(data)
        return list(tokens)

    def decode_bytes(self, tokens) -> bytes:
        return self.ll.decode_bytes(tokens)

    def decode_str(self, tokens) -> str:
        return self.ll.decode_str(tokens)


def turn_markers(tokenizer) -> tuple[str, str]:
    """The text a chat template puts before a model turn (``<|im_start|>assistant\\n``) and the text
    that ends a turn (``<|im_end|>``)."""
    fallback = (FALLBACK_TURN_START, FALLBACK_TURN_END)
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is None or not getattr(tokenizer, "chat_template", None):
        return fallback
    mark = "\x07\x07"
    try:
        user = [{"role": "user", "content": "x"}]
        with_prompt = apply(user, tokenize=False, add_generation_prompt=True)
        without = apply(user, tokenize=False, add_generation_prompt=False)
        answered = apply(user + [{"role": "assistant", "content": mark}], tokenize=False)
    except Exception:
        return fallback
    if not (with_prompt.startswith(without) and len(with_prompt) > len(without)):
        return fallback
    after = answered.split(mark, 1)[1].strip() if mark in answered else ""
    return with_prompt[len(without):], after or FALLBACK_TURN_END
