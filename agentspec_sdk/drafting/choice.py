"""A row's choice of its candidate: its own (`candidates.OwnSource`) or the suffix trees'
(`candidates.TreeSource`), by worth at the row's price, own raised by a bias learned from the choices
the target's tokens proved wrong (`ChoiceBias`); grammar-forced text goes first, and with boundary
"price" own is continued past its segment end by the tree. No draft runs into the turn's end.
"""

from __future__ import annotations

from agentspec_sdk.drafting.budget import sent_length
from agentspec_sdk.drafting.candidates import DraftSetup, OwnSource, TreeSource, tokens_inside
from agentspec_sdk.drafting.pricing import Estimates
from agentspec_sdk.drafting.records import agreement
from agentspec_sdk.drafting.rows import Candidate, RowState

# how far one wrong source choice moves its bias, in expected accepted tokens (`ChoiceBias.judge`);
# offline the five captures move by at most 0.4% between 0.05 and 0.2
CHOICE_STEP = 0.1


class ChoiceBias:
    """What the rows' choices learned (`bias`: (own's segment kind, own's source) -> what the row's
    choice adds to own's worth) and counted (`suffix_chosen`: rows whose draft came from the trees).
    It outlives plans."""

    def __init__(self):
        self.bias: dict[tuple[str, str], float] = {}
        self.suffix_chosen = 0

    def judge(self, contest: tuple, accepted: int, revealed: list[int]) -> None:
        """Learn the row choice's bias for own's (kind, source): one `CHOICE_STEP` toward the
        candidate passed over whenever the tokens the target wrote after the draft (`revealed`)
        show it would have been accepted further than the sent draft (`accepted` tokens).

        One step always reveals which of the two went further (the sent draft's accepted tokens
        plus the target's own next one), though not always by how much. A source's learned
        acceptance cannot settle the choice: it is learned only where that source wins it, i.e.
        where the other was weak (code_agent's lookups ended at 0.73 at b 1 against 0.95 at b 8 on
        the same turns, and lost rows where they were accepted further). Judging the passed-over
        candidate's acceptance instead is biased the other way (judged only as far as the sent
        draft reveals) and drafted more everywhere (docs/drafting.md). At equilibrium the two wrong
        choices, tree for own and own for tree, are equally frequent."""
        key, chose_tree, passed = contest
        if agreement(passed, revealed) <= accepted:
            return
        step = CHOICE_STEP if chose_tree else -CHOICE_STEP  # a larger bias favours own
        self.bias[key] = self.bias.get(key, 0.0) + step


class RowChoice:
    """A row's candidate before sizing (`candidate(st, price, note)`): `own`'s or `tree`'s (None: the
    plan runs without suffix trees), weighed by `estimates` at the row's price and `choices`' bias."""

    def __init__(self, setup: DraftSetup, estimates: Estimates, own: OwnSource, tree: TreeSource | None,
                 choices: ChoiceBias):
        self.setup, self.plan, self.gamma = setup, setup.plan, setup.gamma
        self.estimates, self.own, self.tree, self.choices = estimates, own, tree, choices

    def candidate(self, st: RowState, price: float, note: dict | None = None) -> Candidate | None:
        """The row's draft before sizing at the row's `price`. `note` (explain mode): filled with
        what was weighed.

        A draft ends before its first turn-end token (`<|im_end|>`): accepted, that token saves
        nothing (the target's own next token in the same pass would have ended the turn too), and
        nothing after it can be accepted (the turn is over). A tree's draft priced past a segment
        end (boundary "price") can hold one in its middle, e.g. `</tool_call><|im_end|>…`."""
        st.contest = None
        cand = self.choose(st, price, note)
        end_ids = self.setup.end_ids
        if cand is None or end_ids.isdisjoint(cand.tokens):
            return cand
        n = next(i for i, t in enumerate(cand.tokens) if t in end_ids)
        if not n:
            return None
        conf = cand.confidences[:n] if cand.confidences is not None else None
        return Candidate(cand.tokens[:n], cand.sources[:n], cand.kind, cand.law_class, conf)

    def choose(self, st: RowState, price: float, note: dict | None = None) -> Candidate | None:
        """Own's or the tree's candidate (the rule that chose it in `note["rule"]`)."""
        own, unpaid = self.own.candidate(st, price)  # unpaid: a lookup not worth its price, not tokenized
        explaining = note is not None
        note = {} if note is None else note
        note.update(own=own, tree=None, tree_raw=[], rule="own")
        # own continued past its segment end by the tree (boundary "price" of own's kind)
        priced = own is not None and self.setup.lab.isolation \
            and self.setup.rule(own.kind, st.fmt.name).boundary == "price"
        if self.tree is None:
            return own
        if own is not None and own.source in ("forced", "marker"):  # grammar-forced text goes first
            note["rule"] = "forced-first"
            if priced or explaining:  # what the tree would have offered
                note["tree"] = self.tree.candidate(st, note)
            return self._through(st, own, note) if priced else own
        tree = note["tree"] = self.tree.candidate(st, note)
        if tree is not None and ((own is None and unpaid is None)
                                 or self.tree_wins(st, own, tree, price, unpaid)):
            self.choices.suffix_chosen += 1
            note["rule"] = "tree"
            return tree
        if own is None and unpaid is not None and tree is not None:
            note["rule"] = "unpaid"  # the tree lost to a lookup sent empty: no draft (explain's causes)
        return self._through(st, own, note) if priced and own is not None else own

    def tree_wins(self, st: RowState | None, own: Candidate | None, tree: Candidate, price: float,
                  unpaid: tuple[str, str] | None = None) -> bool:
        """The row's choice between its own candidate and the tree's: by worth at the row's price, the
        tree without its extension (`unextended`), own's worth raised by the bias learned for own's
        (segment kind, source) from earlier choices (`ChoiceBias.judge`). The candidate passed over
        is kept on the row, as the budget would send it, to judge this choice by.

        `own` None with `unpaid` = (kind, "lookup"): own would have been a lookup whose first token
        is not worth the price (`Estimates.lookup_pays`), worth 0 and sent empty: weighed as such, so
        the choice and what it learns are those the built lookup would have given."""
        key = (own.kind, own.source) if own is not None else unpaid
        learn = self.setup.lab.learn_choice
        base = unextended(tree)
        worth = self.estimates.worth
        own_worth = worth(own, price) if own is not None else 0.0
        wins = worth(base, price) > own_worth + (self.choices.bias.get(key, 0.0) if learn else 0.0)
        if st is not None and learn:
            passed = own if wins else base
            if passed is None:  # the unpaid lookup, sent empty
                st.contest = (key, wins, [])
            else:
                n = sent_length(self.estimates.confidences(passed), price, self.gamma)
                st.contest = (key, wins, passed.tokens[:n])
        return wins

    def _through(self, st: RowState, own: Candidate, note: dict) -> Candidate:
        """Own candidate continued past the segment end by the tree (boundary "price"): when the
        tree's draft begins with own's tokens, its further tokens are appended as source "cross"."""
        raw, conf = note.get("tree_raw") or [], note.get("tree_conf") or []
        n = len(own.tokens)
        if len(raw) <= n or raw[:n] != own.tokens:
            return own
        # only through the boundary: where own stops inside its segment, the tree's further tokens
        # are what the source choice weighed and lost, not a crossing
        if tokens_inside(self.setup.token_bytes, st.seg, raw) > n:
            return own
        cross = self.estimates.accounting.acceptance.alpha(own.law_class, "cross", own.kind)
        return Candidate(own.tokens + raw[n:], own.sources + ["cross"] * (len(raw) - n), own.kind,
                         own.law_class, self.estimates.estimates(own) + [c * cross for c in conf[n:]])


def unextended(tree: Candidate) -> Candidate:
    """The tree's draft without its `extend` tokens: what the row's choice between the tree and its
    own candidate weighs. Weighed with them, a longer tree draft won rows in code where own's lookup
    was accepted further (code_agent −0.4 to −0.8% at γ 16 b 8 and b 1, docs/drafting.md); the
    extension only lengthens a draft the tree has won on suffix's own terms."""
    if "extend" not in tree.sources:
        return tree
    n = tree.sources.index("extend")
    conf = tree.confidences[:n] if tree.confidences is not None else None
    return Candidate(tree.tokens[:n], tree.sources[:n], tree.kind, tree.law_class, conf)
