"""The proposer's Prometheus metrics, on the server's own `/metrics` beside vLLM's `vllm:*` families.

The proposer runs in vLLM's engine-core process, and `vllm serve` answers `/metrics` from its API-server
process. vLLM 0.32 builds that page with `vllm.v1.metrics.prometheus.get_prometheus_registry()`: when
`PROMETHEUS_MULTIPROC_DIR` is set it is a `prometheus_client.multiprocess.MultiProcessCollector` over
that directory, which merges the metric files of *every* process that writes there. prometheus_client
picks its file-backed value class at import when the variable is set, and the engine core inherits the
variable, so counters created here (in the engine core) land in that directory and on the page.
`ServerSpec` sets the variable to a directory it empties before every start (vLLM asks for that:
stale files from an earlier run would add to the counts). Without the variable (the embedded `Engine`)
the metrics live in the process's default registry, unseen and harmless.

Acceptance is settled, not guessed: a round is counted when the drafter resolves it at the next step
(`records.Accounting.add`: accepted = common prefix of the draft and the tokens the request kept), so
the counters move exactly when the request's tokens do. A draft whose row leaves the batch before it is
verified (the one made at a request's last step) is never counted, as vLLM never counts it either.

Families (counters end in `_total` on the page):

    agentspec:draft_tokens_total{law_class,kind,source}     tokens of settled drafts, per token source
    agentspec:accepted_tokens_total{law_class,kind,source}  of those, accepted by the target
    agentspec:draft_rounds_total{law_class,kind}            settled drafts
    agentspec:budget_withheld_tokens_total{law_class}       candidate tokens the budget kept back
    agentspec:gated_rows_total{law_class}                   rows with a candidate that got no draft
    agentspec:proposer_seconds                              histogram: proposer time per engine step
    agentspec:step_seconds                                  histogram: engine step to step, busy only
    agentspec:proposer_rows_total                           rows seen by the proposer
    agentspec:drafter_errors_total{scope}                   row: one row drafted nothing; batch: a step did
    agentspec:plan_version                                  gauge: the loaded plan's version (bumped per save)
    agentspec:plan_digest                                   gauge: 48 bits of the sha256 of its content

The two plan gauges tell replicas apart that should share one plan file: set when the proposer loads
the plan and at every reload, so a replica started on another plan (or an old copy) shows another
digest on its own /metrics (`plan_identity`, `agentspec serve --status`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

PREFIX = "agentspec:"
SECOND_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0)

_METRICS: ProposerMetrics | None = None


def proposer_metrics() -> ProposerMetrics:
    """The process's one set of metric objects (prometheus_client refuses to register a name twice)."""
    global _METRICS
    if _METRICS is None:
        _METRICS = ProposerMetrics()
    return _METRICS


class ProposerMetrics:
    """Counters and histograms fed by the drafter's accounting (`observer`) and the proposer adapter."""

    def __init__(self, registry: Any = None):
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        labels = ("law_class", "kind", "source")
        self.draft_tokens = Counter("agentspec:draft_tokens", "Draft tokens of settled AgentSpec drafts",
                                    labels, registry=reg)
        self.accepted_tokens = Counter("agentspec:accepted_tokens", "Draft tokens the target accepted",
                                       labels, registry=reg)
        self.rounds = Counter("agentspec:draft_rounds", "Settled AgentSpec drafts", ("law_class", "kind"),
                              registry=reg)
        self.withheld = Counter("agentspec:budget_withheld_tokens",
                                "Candidate draft tokens the budget allocator did not hand to vLLM",
                                ("law_class",), registry=reg)
        self.gated = Counter("agentspec:gated_rows", "Rows whose candidate draft the budget gated to zero",
                             ("law_class",), registry=reg)
        self.proposer_seconds = Histogram("agentspec:proposer_seconds",
                                          "AgentSpec proposer time per engine step",
                                          buckets=SECOND_BUCKETS, registry=reg)
        self.step_seconds = Histogram("agentspec:step_seconds",
                                      "Engine step time (start to start of consecutive proposer calls while "
                                      "a request stays in the batch)", buckets=SECOND_BUCKETS, registry=reg)
        self.rows = Counter("agentspec:proposer_rows", "Batch rows seen by the AgentSpec proposer",
                            registry=reg)
        self.errors = Counter("agentspec:drafter_errors",
                              "Drafter failures (row: one row, batch: a whole step)",
                              ("scope",), registry=reg)
        # several engine-core processes (data parallel) load the same plan: the latest write stands
        self.plan_version = Gauge("agentspec:plan_version", "Version of the draft plan the proposer uses",
                                  registry=reg, multiprocess_mode="mostrecent")
        self.plan_digest = Gauge("agentspec:plan_digest", "First 48 bits of the sha256 of the draft plan's "
                                 "content, version aside", registry=reg, multiprocess_mode="mostrecent")
        # label children cached: .labels() costs a lock and a dict lookup per call
        self._children: dict[tuple, Any] = {}

    def _child(self, metric, *labels):
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- the accounting's observer --------------------------------------------------------------

    def round(self, rnd, sources: list[str] | None) -> None:
        """One settled draft: tokens per source run; a run is accepted up to the first rejection."""
        self._child(self.rounds, rnd.law_class, rnd.kind).inc()
        for source, drafted, accepted in source_split(rnd.drafted, rnd.accepted, rnd.source, sources):
            self._child(self.draft_tokens, rnd.law_class, rnd.kind, source).inc(drafted)
            if accepted:
                self._child(self.accepted_tokens, rnd.law_class, rnd.kind, source).inc(accepted)

    def sized(self, law_class: str, candidate: int, drafted: int) -> None:
        if candidate > drafted:
            self._child(self.withheld, law_class).inc(candidate - drafted)
        if drafted == 0:
            self._child(self.gated, law_class).inc()

    # -- the adapter's step -------------------------------------------------------------------------

    def plan_loaded(self, plan) -> None:
        """The plan the drafter now drafts with (`DraftPlan`)."""
        self.plan_version.set(plan.version)
        self.plan_digest.set(plan.digest())

    def step(self, rows: int, seconds: float, row_errors: int, batch_error: bool,
             interval: float | None) -> None:
        self.proposer_seconds.observe(seconds)
        if interval is not None:
            self.step_seconds.observe(interval)
        if rows:
            self.rows.inc(rows)
        if row_errors:
            self._child(self.errors, "row").inc(row_errors)
        if batch_error:
            self._child(self.errors, "batch").inc()


def source_split(drafted: int, accepted: int, source: str, sources: list[str] | None):
    """(source, drafted, accepted) per run of equal per-token sources; without per-token sources the
    whole draft is the first token's."""
    if not sources or len(sources) != drafted:
        return [(source, drafted, accepted)]
    out = []
    start = 0
    for i in range(1, drafted + 1):
        if i == drafted or sources[i] != sources[start]:
            out.append((sources[start], i - start, max(0, min(i, accepted) - start)))
            start = i
    return out


# -- reading a /metrics page ----------------------------------------------------------------------


def parse_agentspec(text: str) -> dict[str, Any]:
    """The agentspec:* families of a Prometheus text page as flat sums: {(family, labels...): value}.

    Keys: ("draft", cls, kind, src), ("accepted", cls, kind, src), ("rounds", cls, kind),
    ("withheld", cls), ("gated", cls), ("errors", scope), ("rows",), ("proposer_s",), ("steps",),
    ("step_s",), ("busy_steps",). Values of several processes or replicas are summed."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        for s in family.samples:
            key = _key(s.name, s.labels)
            if key is not None:
                out[key] += float(s.value)
    return dict(out)


def _key(name: str, lab: dict) -> tuple | None:
    base = name.removeprefix(PREFIX)
    cls, kind, src = lab.get("law_class", ""), lab.get("kind", ""), lab.get("source", "")
    table = {
        "draft_tokens_total": ("draft", cls, kind, src),
        "accepted_tokens_total": ("accepted", cls, kind, src),
        "draft_rounds_total": ("rounds", cls, kind),
        "budget_withheld_tokens_total": ("withheld", cls),
        "gated_rows_total": ("gated", cls),
        "drafter_errors_total": ("errors", lab.get("scope", "")),
        "proposer_rows_total": ("rows",),
        "proposer_seconds_sum": ("proposer_s",),
        "proposer_seconds_count": ("steps",),
        "step_seconds_sum": ("step_s",),
        "step_seconds_count": ("busy_steps",),
    }
    return table.get(base)


def plan_identity(text: str) -> dict[str, Any] | None:
    """One server's plan from its /metrics page: {"version": int, "digest": 12 hex digits}, or None
    where the page has no plan gauges (not our proposer, or no PROMETHEUS_MULTIPROC_DIR)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (PREFIX + "plan_version", PREFIX + "plan_digest"):
            for sample in family.samples:
                found[family.name.removeprefix(PREFIX)] = int(sample.value)
    if "plan_digest" not in found:
        return None
    return {"version": found.get("plan_version", 0), "digest": f"{found['plan_digest']:012x}"}


def subtract(now: dict, base: dict) -> dict:
    """Counters since `base` (an earlier parse of the same servers)."""
    return {k: v - base.get(k, 0.0) for k, v in now.items()}


def summarize(flat: dict) -> dict[str, Any]:
    """The parsed counters as the `stats()["proposer"]` shape: per class, per kind, per source."""
    by_class: dict[str, dict[str, int]] = {}
    by_kind: dict[str, dict[str, int]] = {}
    by_source: dict[str, dict[str, int]] = {}
    withheld: dict[str, int] = {}
    gated: dict[str, int] = {}
    errors: dict[str, int] = {}
    for key, value in sorted(flat.items()):
        v = int(round(value))
        name = key[0]
        if name in ("draft", "accepted"):
            field = "drafted" if name == "draft" else "accepted"
            _, cls, kind, src = key
            for table, label in ((by_class, cls), (by_kind, f"{cls}/{kind}"), (by_source, f"{cls}/{src}")):
                row = table.setdefault(label, {"rounds": 0, "drafted": 0, "accepted": 0})
                row[field] += v
        elif name == "rounds":
            _, cls, kind = key
            by_class.setdefault(cls, {"rounds": 0, "drafted": 0, "accepted": 0})["rounds"] += v
            by_kind.setdefault(f"{cls}/{kind}", {"rounds": 0, "drafted": 0, "accepted": 0})["rounds"] += v
        elif name == "withheld":
            withheld[key[1]] = withheld.get(key[1], 0) + v
        elif name == "gated":
            gated[key[1]] = gated.get(key[1], 0) + v
        elif name == "errors":
            errors[key[1]] = errors.get(key[1], 0) + v
    for table in (by_class, by_kind, by_source):
        for row in table.values():
            row["alpha"] = row["accepted"] / row["drafted"] if row["drafted"] else 0.0
    for row in by_source.values():
        row.pop("rounds", None)  # rounds are per draft, not per token source
    proposer_s = flat.get(("proposer_s",), 0.0)
    step_s = flat.get(("step_s",), 0.0)
    return {
        "source": "metrics",
        "steps": int(flat.get(("steps",), 0)), "rows": int(flat.get(("rows",), 0)),
        "proposer_s": proposer_s, "step_s": step_s,
        "proposer_share": proposer_s / step_s if step_s else 0.0,
        "errors": sum(errors.values()), "batch_errors": errors.get("batch", 0),
        "withheld": withheld, "gated": gated,
        "by_class": by_class, "by_kind": by_kind, "by_source": by_source,
    }
