"""vLLM's llguidance grammars, patched: exact masks under speculative decoding (a workaround for
llguidance's masks after a rollback) and token slices that make masks in free text cheap.

vLLM builds a speculative step's grammar masks by walking the request's llguidance matcher over the
draft (`StructuredOutputManager.grammar_bitmask`: fill the mask, accept the draft token, ... then
`rollback` the walk). llguidance (1.7.6 as vLLM 0.32 pins it; 1.8.0 and 1.9.1 the same) keeps
something of a mask computed during such a walk past its rollback: a later mask, in another parser
state that reaches the same lexer state, can allow tokens the grammar forbids. Measured on the
long_context traces (BFCL, 18 file-system tools): after `<tool_call>{"name":"c` a draft
`p","arguments":{"source":"` (the tool `cp`) was walked and rolled back; the model wrote `d` and the
`cd` call up to `"folder":"Annual_Report_2023.docx`, where the mask then allowed `","` (cd has no
second argument). The target took it, the matcher refused it, and vLLM ended the request with an
error: a speculative output that differs from `off` (docs/engine.md, "Requests and grammars";
docs/experiments/2026-12-04-long-context-engine-exact-masks.md).
Every drafter can walk such a draft; structure's lookups made this one. What llguidance keeps is its
bias cache (`Parser::compute_bias`, parser/src/earley/parser.rs at v1.7.6): the last mask it computed,
reused while the lexer state, the Earley row index and "pending lexeme bytes" are the same. `rollback`
does not clear it (`TokenParser::rollback` at v1.7.6, and on llguidance's main branch of 2026-08-17),
and after a rollback the same row index holds another row: the cached mask of the walked draft answers
for the parser state the model wrote. Clearing it there would make vLLM's own masks exact.

The workaround (`patch_guidance`): the matcher that computes masks never rolls back. vLLM's
`GuidanceGrammar.ll_matcher` becomes a copy of the matcher vLLM built; a draft walk (the tokens
accepted between `fill_bitmask` and `rollback`) goes to a copy of it (`LLMatcher.deep_copy`, 3–8 µs,
which shares the lexer's automaton and copies the parser state with its bias cache), and `rollback`
drops that copy; the tokens the request keeps are then accepted by the matcher, or, where they
continue the walk (a draft kept whole), the walk's copy becomes the matcher. Every mask comes from a
matcher whose history has no rollback, so its cache is valid; that is llguidance without speculation.
A rollback past the walk (vLLM 0.32 and 0.33 never do one) starts over from a copy of the matcher vLLM
built, which never computes a mask and is brought up to the kept tokens only then. The masks equal
those of a fresh copy per mask (the patch before 2026-12, ≈ 3–16× vLLM's own mask cost because no copy
kept a cache), at vLLM's own llguidance calls per row and step (γ + 1 masks, the consumes, a
validation) less its rollback plus one copy (tests/test_exact_masks.py counts them;
benchmarks/mask_cost.py times them, docs/deployment.md "What a GPU deployment pays per step").

Token slices (`patch_slices`): vLLM builds its llguidance tokenizer with llguidance's own slices
(JSON string contents). A mask in a turn grammar's free text (a thought, a code body) then walks the
whole vocabulary, 0.29 ms with SmolLM2's 49k tokens, once per draft position and row every pass; with
`structure.marker_free.token_slices` (the same slices, first without the markers' delimiters) and
the turn grammar's plain-regex lexemes it takes 5 µs. The masks are the same.

Both are installed in every vLLM process an AgentSpec engine or `agentspec serve` starts: in-process
by `vllm_start`, in vLLM's own processes by the `vllm.general_plugins` entry point `register`, which is
inert unless `EXACT_MASKS_ENV` is "1" (our starts set it), so other vLLM users in the environment are
left alone.
"""

from __future__ import annotations

import functools
import logging
import os

from agentspec_sdk.errors import BackendError

__all__ = ["EXACT_MASKS_ENV", "register", "patch_guidance", "patch_slices"]

log = logging.getLogger("agentspec.backends")

EXACT_MASKS_ENV = "AGENTSPEC_EXACT_MASKS"
_PATCHED = "_agentspec_exact_masks"
_PATCHED_SLICES = "_agentspec_token_slices"


def register() -> None:
    """The entry point: patch vLLM's llguidance grammar and tokenizer when EXACT_MASKS_ENV is "1";
    else nothing."""
    if os.environ.get(EXACT_MASKS_ENV) == "1":
        patch_guidance()
        patch_slices()


def patch_guidance(grammar_cls=None) -> None:
    """Make `GuidanceGrammar`'s matcher one that never rolls back (idempotent): a draft walk's tokens
    go to a copy of it, dropped at the walk's rollback (or kept, where the tokens the request keeps
    continue the walk); a rollback past the walk starts over from a copy of a matcher that never
    computed a mask (module docstring). vLLM's own `fill_bitmask` and `validate_tokens` run on it
    unchanged. BackendError naming the vLLM version when the class is not laid out as in vLLM 0.32."""
    if grammar_cls is None:
        from vllm.v1.structured_output.backend_guidance import GuidanceGrammar as grammar_cls
    methods = {name: getattr(grammar_cls, name, None) for name in _HOOKED}
    fields = getattr(grammar_cls, "__dataclass_fields__", {})
    if None in methods.values() or not {"ll_matcher", "terminated", "rollback_lag"} <= set(fields):
        raise BackendError(f"vLLM {_vllm_version()}: {grammar_cls.__name__} has no "
                           f"{' / '.join(_HOOKED)} or no ll_matcher / terminated / rollback_lag "
                           "fields; the exact-mask workaround cannot hook it")
    if getattr(methods["fill_bitmask"], _PATCHED, False):
        return
    fill, _, rollback_past, reset_all = (methods[name] for name in _HOOKED)
    hooks = (_fill_bitmask_hook(fill), _accept_tokens_hook(), _rollback_hook(rollback_past),
             _reset_hook(reset_all))
    for name, fn in zip(_HOOKED, hooks, strict=True):
        functools.update_wrapper(fn, methods[name])
        setattr(grammar_cls, name, fn)
    setattr(hooks[0], _PATCHED, True)
    log.info("vLLM's llguidance masks are computed by matchers that never roll back (exact after "
             "draft walks)")


def _fill_bitmask_hook(fill):
    """`fill_bitmask` that marks a draft walk's start, then vLLM's own `fill`."""
    def fill_bitmask(self, bitmask, idx: int) -> None:
        (self.__dict__.get(_MASKS) or _masks(self)).walking = True  # accepts up to a rollback: a walk's
        fill(self, bitmask, idx)
    return fill_bitmask


def _accept_tokens_hook():
    """`accept_tokens`: a walk's tokens go to a copy of the matcher; kept tokens are remembered for
    the pristine matcher."""
    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        masks = self.__dict__.get(_MASKS) or _masks(self)
        if masks.walking:
            if masks.kept is None:  # the walk's first tokens: from here on a copy walks
                masks.kept, masks.walked = self.ll_matcher, []
                self.ll_matcher = self.ll_matcher.deep_copy()
        elif masks.last_walk is not None and masks.continue_walk(self, tokens):
            return True
        # vLLM 0.32's (and 0.33's) accept_tokens, telling whether the matcher consumed the tokens
        matcher = self.ll_matcher
        stopped = matcher.is_stopped()
        if self.ll_tokenizer.eos_token in tokens:
            if stopped and not self.terminated:
                self.rollback_lag = 1
            self.terminated = True
        if stopped:
            return True
        ok = matcher.consume_tokens(tokens)
        self.check_error()
        if masks.walking:
            if ok:
                masks.walked.extend(tokens)
        elif ok:  # kept tokens: the pristine matcher takes them when it is needed
            masks.behind.append(list(tokens))
        else:
            masks.lost()
        return ok
    return accept_tokens


def _rollback_hook(rollback_past):
    """`rollback`: back to the matcher before the walk (`rollback_past`, vLLM's own, where the
    pristine matcher is lost)."""
    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        masks = self.__dict__.get(_MASKS) or _masks(self)
        back = num_tokens - self.rollback_lag  # what vLLM rolls its matcher back by
        walk, walked = self.ll_matcher, masks.walked
        if masks.kept is not None:
            self.ll_matcher = masks.kept
        masks.kept, masks.walked, masks.walking, masks.last_walk = None, [], False, None
        if back > len(walked):  # past the walk, into kept tokens (vLLM 0.32 never does this)
            if masks.pristine is None:  # lost (an error state): vLLM's own rollback
                rollback_past(self, num_tokens - len(walked))
                return
            self.ll_matcher = masks.pristine_at(back - len(walked))
            self.terminated, self.rollback_lag = False, 0  # what vLLM's rollback leaves
            self.check_error()
            return
        self.terminated, self.rollback_lag = False, 0  # what vLLM's rollback leaves
        if back < len(walked):  # the walk's first tokens stay: kept tokens now
            stay = walked[:len(walked) - back]
            if self.ll_matcher.consume_tokens(stay):
                masks.behind.append(stay)
            else:  # the walk took them: cannot happen
                masks.lost()
        elif walked:
            masks.last_walk = walk, walked  # the next kept tokens may continue it
        self.check_error()
    return rollback


def _reset_hook(reset_all):
    """`reset`: from the pristine matcher, then vLLM's own `reset_all`."""
    def reset(self):
        masks = self.__dict__.get(_MASKS) or _masks(self)
        if masks.pristine is not None:
            self.ll_matcher = masks.pristine_reset()
        reset_all(self)  # vLLM's (a matcher reset just now is reset again: a no-op)
    return reset


_HOOKED = ("fill_bitmask", "accept_tokens", "rollback", "reset")
_MASKS = "_agentspec_masks"


class _Masks:
    """One grammar's matchers besides `ll_matcher` (which never rolls back). `pristine`: the matcher
    vLLM built, which never computes a mask, behind `ll_matcher`'s kept tokens by the chunks in
    `behind` (consumed only when a rollback past a walk needs it); during a walk, `kept`: the matcher
    at the kept tokens, while `ll_matcher` is its copy that consumed `walked`; `last_walk`: the walk
    copy and its tokens from the walk's rollback to the next kept tokens."""

    __slots__ = ("pristine", "behind", "kept", "walked", "walking", "last_walk")

    def __init__(self, pristine):
        self.pristine, self.behind = pristine, []
        self.kept = self.last_walk = None
        self.walked: list[int] = []
        self.walking = False

    def continue_walk(self, grammar, tokens: list[int]) -> bool:
        """The kept tokens continue the last walk (a draft kept whole, then the bonus token): that
        copy becomes the matcher, at the cost of the tokens past the walk."""
        walk, walked = self.last_walk
        self.last_walk = None
        n = len(walked)
        if (grammar.ll_tokenizer.eos_token in tokens or len(tokens) < n or list(tokens[:n]) != walked
                or walk.is_stopped() or (len(tokens) > n and not walk.consume_tokens(list(tokens[n:])))):
            return False  # the kept matcher takes them as vLLM does (a failed walk copy is dropped)
        grammar.ll_matcher = walk
        self.behind.append(list(tokens))
        return True

    def pristine_at(self, back: int):
        """A copy of the pristine matcher at the kept tokens but the last `back`."""
        for chunk in self.behind:
            self.pristine.consume_tokens(chunk)
        self.behind = []
        self.pristine.rollback(back)
        return self.pristine.deep_copy()

    def pristine_reset(self):
        self.behind, self.kept, self.walked, self.walking, self.last_walk = [], None, [], False, None
        self.pristine.reset()
        return self.pristine.deep_copy()

    def lost(self) -> None:
        """The kept matcher refused tokens (an error state, as vLLM's would be): the pristine matcher
        follows it no more; a later rollback past a walk rolls the kept matcher back itself."""
        self.pristine, self.behind = None, []


def _masks(grammar) -> _Masks:
    masks = grammar.__dict__.get(_MASKS)
    if masks is None:  # the matcher vLLM built stays pristine; its copy computes the masks
        masks = grammar.__dict__[_MASKS] = _Masks(grammar.ll_matcher)
        grammar.ll_matcher = grammar.ll_matcher.deep_copy()
    return masks


def patch_slices(backend_cls=None) -> None:
    """Make vLLM's `GuidanceBackend` give its llguidance tokenizer `token_slices` for the markers of
    every registered format (idempotent). A vLLM without the hook keeps llguidance's slices: masks
    stay exact, only slower, so that is logged, not raised."""
    if backend_cls is None:
        from vllm.v1.structured_output.backend_guidance import GuidanceBackend as backend_cls
    build = getattr(backend_cls, "_build_ll_tokenizer", None)
    if build is None:
        log.warning("vLLM %s: GuidanceBackend has no _build_ll_tokenizer; llguidance keeps its own "
                    "token slices (masks in free text walk the vocabulary)", _vllm_version())
        return
    if getattr(build, _PATCHED_SLICES, False):
        return

    @functools.wraps(build)
    def build_ll_tokenizer(tokenizer, vocab_size):
        return with_marker_slices(build(tokenizer, vocab_size))

    setattr(build_ll_tokenizer, _PATCHED_SLICES, True)
    backend_cls._build_ll_tokenizer = staticmethod(build_ll_tokenizer)
    log.info("vLLM's llguidance tokenizer gets token slices for marker-free text")


def with_marker_slices(ll_tokenizer):
    """`ll_tokenizer` with `token_slices` for the markers of every registered format."""
    from agentspec_sdk.structure.formats import format_names, get_format
    from agentspec_sdk.structure.marker_free import token_slices

    markers = [m for name in format_names() for kind in get_format(name).kinds
               for m in (*kind.open, *kind.close)]
    return ll_tokenizer.with_slices(token_slices(markers))


def _vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # pragma: no cover - vLLM absent
        return "?"
