import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec_sdk.drafting.budget import (
    TokenRate,
    allocate,
    batch_price,
    fixed,
    predicted_saving,
    row_prices,
    sequence_price,
)
from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law.closed_forms import saving, tau

alphas_st = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=24)


@settings(max_examples=200, deadline=None)
@given(alphas=alphas_st, budget=st.integers(0, 64), gamma_max=st.integers(0, 12),
       price=st.floats(0.0, 0.5))
def test_total_within_budget_and_caps(alphas, budget, gamma_max, price):
    out = allocate(alphas, price, budget, gamma_max)
    assert out.sum() <= budget
    assert np.all((out >= 0) & (out <= gamma_max))


@settings(max_examples=200, deadline=None)
@given(alphas=alphas_st, budget=st.integers(0, 64), price=st.floats(0.001, 0.5))
def test_every_allocated_token_is_worth_its_price(alphas, budget, price):
    out = allocate(alphas, price, budget, 8)
    a = np.asarray(alphas)
    given_rows = out > 0
    assert np.all(a[given_rows] ** out[given_rows] >= price - 1e-12)


@settings(max_examples=200, deadline=None)
@given(alphas=alphas_st, row=st.integers(0, 23), bump=st.floats(0.0, 1.0), budget=st.integers(0, 64))
def test_monotone_in_alpha(alphas, row, bump, budget):
    row %= len(alphas)
    before = allocate(alphas, 0.05, budget, 8)
    raised = list(alphas)
    raised[row] = min(1.0, raised[row] + bump)
    after = allocate(raised, 0.05, budget, 8)
    assert after[row] >= before[row]


def test_budget_goes_to_the_best_rows_first():
    out = allocate([0.95, 0.5, 0.9], 0.05, 6, 8)
    # top six values: .95 .9025 .9 .857 .8145 .81 → four tokens of row 0, two of row 2
    assert out.tolist() == [4, 0, 2]


def test_rows_capped_by_available_draft_length():
    out = allocate([0.99, 0.99], 0.01, None, 8, [3, 0])
    assert out.tolist() == [3, 0]


def test_gate_zeroes_rows_with_negative_saving():
    a = np.array([0.02, 0.9])
    out = fixed(a, 0.1, 4)
    assert out.tolist() == [0, 4]
    assert predicted_saving(a[:1], np.array([4]), 0.1, 0.0)[0] < 0
    assert fixed(a, 0.1, 4, gate=False).tolist() == [4, 4]


@settings(max_examples=200, deadline=None)
@given(alphas=alphas_st, budget=st.integers(0, 64), price=st.floats(0.0, 0.5))
def test_greedy_allocation_never_gives_a_row_negative_predicted_saving(alphas, budget, price):
    out = allocate(alphas, price, budget, 8)
    given_rows = out > 0
    s = predicted_saving(np.asarray(alphas)[given_rows], out[given_rows], price, 0.0)
    assert np.all(s >= -1e-9)


def test_low_alpha_rows_get_nothing_even_with_budget():
    assert allocate([0.01, 0.04], 0.05, 100, 8).tolist() == [0, 0]


def test_per_position_alphas_value_each_token_by_the_product_before_it():
    # forced tokens (0.98) then a weak lookup (0.3): the lookup's 2nd token is worth 0.98^3 * 0.3^2
    row = [0.98, 0.98, 0.98, 0.3, 0.3, 0.3]
    assert allocate(np.array([row]), 0.05, None, 8, [6]).tolist() == [5]
    assert allocate(np.array([row]), 0.2, None, 8, [6]).tolist() == [4]
    # positions beyond a row's draft are worth nothing; the cap still applies
    assert allocate(np.array([[0.9, 0.9], [1.0, 1.0]]), 0.01, None, 8, [1, 2]).tolist() == [1, 2]
    # a scalar per row is the per-position case with a constant alpha
    rows = np.array([0.7, 0.9])
    assert (allocate(rows, 0.1, 6, 8).tolist()
            == allocate(np.repeat(rows[:, None], 8, axis=1), 0.1, 6, 8).tolist())


def test_default_plan_has_no_step_cap():
    from agentspec_sdk.drafting.plan import DraftPlan

    assert DraftPlan().effective_step_budget() is None
    assert DraftPlan(step_budget=12).effective_step_budget() == 12


def test_bad_arguments_name_the_problem():
    with pytest.raises(LawInputError, match="max_len_per_row"):
        allocate([0.5, 0.5], 0.05, 4, 8, [1])
    with pytest.raises(LawInputError, match="step_budget"):
        allocate([0.5], 0.05, -1, 8)


def test_default_priors_give_a_structured_draft_the_full_gamma_max():
    from agentspec_sdk.drafting.plan import DraftPlan

    plan = DraftPlan()
    s = plan.prior_acceptance["S"]
    assert allocate([s], plan.delta + plan.d, plan.effective_step_budget(), 8, [40]).tolist() == [8]


def test_batch_price_is_the_single_row_price_at_one_row_and_grows_with_the_batch():
    assert batch_price(0.02, 1) == pytest.approx(0.02)
    assert batch_price(0.02, 8) == pytest.approx(0.1403, abs=1e-3)
    prices = [batch_price(0.05, b) for b in range(1, 65)]
    assert all(a < b for a, b in zip(prices, prices[1:], strict=False)) and prices[-1] < 1.0
    assert batch_price(0.0, 8) == 0.0 and batch_price(1.5, 8) == 1.0


def test_batch_price_with_the_pass_cost_terms():
    # a = 73 ms per pass, b = 6.6 ms per row, c = 3.2 ms per verified token (a CPU step-log fit)
    a, b, c = 0.073, 0.0066, 0.0032
    one = c / (a + b)
    assert batch_price(one, 1, (a, b, c)) == pytest.approx(one)
    assert batch_price(one, 8, (a, b, c)) == pytest.approx(c * 8 / (a + b * 8))  # 0.20, not the r-form's 0.25
    assert batch_price(one, 8) == pytest.approx(0.25, abs=0.01)
    # + the drafter's d
    assert batch_price(one + 0.01, 8, (a, b, c)) == pytest.approx(c * 8 / (a + b * 8) + 0.01)
    assert batch_price(0.05, 8, (0.0, 0.0, 0.01)) == batch_price(0.05, 8)  # unusable terms: the r-form


def test_row_prices_grow_with_each_rows_context():
    """The pass cost model's per-token-of-context term (verified_ctx) as delta_ctx: a row of L tokens
    costs delta + delta_ctx (L - ref) / 1000 for one sequence, then the batch's per-row price."""
    assert row_prices(0.02, 8, [1500, 1500], 0.013, 1500).tolist() == [batch_price(0.02, 8)] * 2
    long, short = row_prices(0.02, 8, [6000, 1000], 0.013, 1500)
    assert long == pytest.approx(batch_price(0.02 + 0.013 * 4.5, 8))
    assert short == pytest.approx(batch_price(0.02 - 0.013 * 0.5, 8))
    assert row_prices(0.02, 1, [6000], 0.0, 1500).tolist() == [0.02]  # delta_ctx 0: every row alike
    assert row_prices(0.001, 1, [0], 0.013, 1500).tolist() == [0.0]  # never below 0
    # with the pass cost terms (a, b, c): the context part is e = delta_ctx (a + b) seconds per 1k
    a, b, c = 0.073, 0.0066, 0.0032
    got = row_prices(c / (a + b), 8, [3500], 0.013, 1500, (a, b, c))[0]
    assert got == pytest.approx(c * 8 / (a + b * 8) + 0.013 * 2.0 * (a + b) * 8 / (a + b * 8))


def test_allocate_prices_each_row_by_its_own_price():
    # equal confidence, the long row pays more per token: a shorter draft
    alphas = np.full((2, 8), 0.8)
    prices = row_prices(0.02, 8, [6000, 1000], 0.013, 1500)
    sizes = allocate(alphas, prices, None, 8).tolist()
    assert sizes[0] < sizes[1]
    assert sizes == [int(np.sum(0.8 ** np.arange(1, 9) >= p)) for p in prices]
    with pytest.raises(LawInputError, match="prices"):
        allocate(alphas, [0.1, 0.1, 0.1], None, 8)


def test_a_long_context_row_gets_a_shorter_draft_than_a_short_one_at_equal_confidence():
    """The drafter's sizing: two rows, the same candidate and confidences, contexts of 6k and 1k
    tokens (counted in tokens drafted, not timed)."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.drafting.rows import Candidate

    tok = AutoTokenizer.from_pretrained(resolve_model())
    drafter = StructureDrafter(DraftPlan(learn_delta=False), tok)
    cand = Candidate(list(range(100, 108)), ["suffix"] * 8, "reasoning", "R", [0.7] * 8)
    long, short = drafter.sizer.size([cand, cand], [6000, 1000])
    assert len(long) < len(short)
    flat = StructureDrafter(DraftPlan(learn_delta=False, delta_ctx=0.0), tok)  # every row alike
    sizes = [len(d) for d in flat.sizer.size([cand, cand], [6000, 1000])]
    assert sizes[0] == sizes[1] > len(long)


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("price", [0.0, 0.05, 0.25, 0.9])
def test_sequence_price_inverts_batch_price(rows, price):
    assert batch_price(sequence_price(price, rows), rows) == pytest.approx(price)
    assert sequence_price(batch_price(0.04, rows), rows) == pytest.approx(0.04)
    with pytest.raises(LawInputError, match=r"per-row price must be in \[0, 1\), got 1.0"):
        sequence_price(1.0, rows)


def test_a_step_of_short_rows_is_priced_at_the_prior_not_below_it():
    """Loss cause (arm A, prose rows of 0.3k tokens, 2026-12-05): with the prior held at a fixed
    1.5k-token reference, eight short rows were priced at 0.03 a draft token, against the 0.16-0.25 the
    pass cost, and drafted 46% more than suffix for 7% fewer passes (0.84x its decode tok/s). Until
    delta is learned the prior now holds at the step's own mean context: equal rows pay the prior
    whatever their length, and a row still pays for its context against the rows beside it."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.drafting.rows import Candidate

    tok = AutoTokenizer.from_pretrained(resolve_model())
    cand = Candidate(list(range(100, 116)), ["suffix"] * 16, "prose", "F", [0.9] * 16)
    drafter = StructureDrafter(DraftPlan(learn_delta=False, gamma_max=16), tok)
    short = [len(d) for d in drafter.sizer.size([cand] * 8, [300] * 8)]
    usual = [len(d) for d in drafter.sizer.size([cand] * 8, [1500] * 8)]
    assert short == usual
    assert drafter.sizer.prices(8, [300] * 8) == pytest.approx([batch_price(DraftPlan().delta, 8)] * 8)
    fixed = StructureDrafter(DraftPlan(learn_delta=False, gamma_max=16, ctx_ref=1500), tok)
    old_ref, step_ref = fixed.sizer, drafter.sizer
    assert all(p < q for p, q in zip(old_ref.prices(8, [300] * 8), step_ref.prices(8, [300] * 8),
                                     strict=True))
    assert [len(d) for d in old_ref.size([cand] * 8, [300] * 8)] > short  # the old reference: longer drafts
    mixed = drafter.sizer.prices(8, [300] * 4 + [2700] * 4)
    assert mixed[0] < batch_price(DraftPlan().delta, 8) < mixed[-1]


def test_the_step_reference_counts_every_row_of_the_pass():
    """The prior holds at the mean context of every row vLLM put in the step, a row being prefilled
    (no draft) included; the row choice and the sizing charge a row the same price."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.drafting.rows import RowInput

    tok = AutoTokenizer.from_pretrained(resolve_model())
    drafter = StructureDrafter(DraftPlan(learn_delta=False), tok)
    short = np.array(tok.encode("The weather in Oslo is mild today. " * 60), dtype=np.int64)[:300]
    prefill = RowInput(np.zeros(2700, dtype=np.int64), draftable=False)
    drafter.propose([RowInput(short), prefill])
    assert drafter.sizer.step_ctx == 1500.0
    row_price = drafter.sizer.step_prices[0]  # what the row's choice was charged
    assert row_price == pytest.approx(drafter.sizer.prices(2, [300, 2700])[0])
    assert row_price < batch_price(DraftPlan().delta, 2)  # shorter than the pass's mean row


def test_sent_value_counts_only_what_the_budget_sends():
    from agentspec_sdk.drafting.budget import sent_value

    assert sent_value([0.9, 0.2, 0.9], 0.3, 8) == pytest.approx(0.9)  # 0.18 < 0.3: the rest is not sent
    assert sent_value([0.9, 0.9, 0.9], 0.0, 2) == pytest.approx(0.9 + 0.81)  # at most gamma_max
    assert sent_value([0.2], 0.3, 8) == 0.0


def _law_optimum(alpha: float, delta: float, gamma_max: int) -> tuple[int, float]:
    """The draft length that maximises the law's saving s = 1 - (1 + γδ) / (τ + 1) for one row of
    constant acceptance alpha, and its tokens per unit of pass cost (1 + τ) / (1 + γδ)."""
    best = max(range(gamma_max + 1), key=lambda g: float(saving(g, tau(g, 1.0 - alpha), delta, 0.0)))
    t = float(tau(best, 1.0 - alpha))
    return best, (1.0 + t) / (1.0 + best * delta)


@pytest.mark.parametrize("alpha", [0.6, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("delta", [0.02, 0.05, 0.1, 0.2])
def test_the_rate_rule_sends_the_laws_optimal_draft_and_the_value_rule_more(alpha, delta):
    """A token worth its price (value >= δ) is not worth sending when every pass already yields
    `rate` tokens per unit of cost: at the price δ · rate the budget sends exactly the γ that
    maximises the law's saving; at δ alone it sends more wherever the optimum is below γ_max."""
    best, rate = _law_optimum(alpha, delta, 16)
    assert allocate([alpha], delta * rate, None, 16)[0] == best
    assert allocate([alpha], delta, None, 16)[0] >= best
    if best < 16:
        assert allocate([alpha], delta, None, 16)[0] > best


def test_the_learned_token_rate_settles_at_the_laws_optimum():
    """The drafter's loop: size at δ · rate, then observe what the draft yielded; the rate it learns
    from that brings the draft to the law's optimum (here from the value rule's 13 to 8)."""
    alpha, delta = 0.8, 0.05
    rate = TokenRate(decay=0.9, min_steps=4)
    for _ in range(200):
        gamma = int(allocate([alpha], delta * rate.value(), None, 16)[0])
        rate.observe(100, round(100 * float(tau(gamma, 1.0 - alpha))), 100 * gamma * delta)  # 100 rows
    best, _ = _law_optimum(alpha, delta, 16)
    assert gamma == best == 8
    assert rate.value() == pytest.approx((1 + float(tau(8, 0.2))) / (1 + 8 * delta), rel=0.02)


def test_token_rate_counts_tokens_per_priced_row_share():
    rate = TokenRate(decay=1.0, min_steps=2)
    rate.observe(2, 6, 1.0)
    assert rate.value() == 1.0  # not learned yet: every token at its price
    rate.observe(2, 6, 1.0)
    rate.observe(0, 5, 1.0)  # a step without rows is no pass
    assert rate.value() == pytest.approx(16 / 6)
    with pytest.raises(LawInputError, match="decay"):
        TokenRate(decay=0.0)


def test_sent_length_and_value_are_the_prefix_sums_numpy_computes():
    """The budget's per-candidate sums run in Python floats (numpy's call cost was most of their
    time); they are the cumulative products numpy gives, and a NaN estimate is not paid for."""
    from agentspec_sdk.drafting.budget import sent_length, sent_value

    rng = np.random.default_rng(3)
    for _ in range(500):
        conf = list(rng.uniform(0.0, 1.0, rng.integers(0, 12)))
        price, gamma = float(rng.uniform(0.0, 0.6)), int(rng.integers(0, 16))
        values = np.cumprod(np.asarray(conf, dtype=float)[:gamma])
        paid = values >= price
        n = int(values.size) if paid.all() else int(np.argmin(paid))
        assert sent_length(conf, price, gamma) == n
        assert sent_value(conf, price, gamma) == pytest.approx(float(values[:n].sum()), abs=1e-12)
    assert sent_length([0.9, float("nan"), 0.9], 0.1, 8) == 1
