"""Render docs/grafana/agentspec.png from a real series of /metrics scrapes (no Grafana involved).

Each panel of agentspec.json is computed here in Python from the scraped counters, as its PromQL
would: rates over a sliding window (`--window`, default 10 s, standing in for $__rate_interval),
ratios of rates, histogram quantiles by linear interpolation inside buckets. The series comes from
the server soak test:

    AGENTSPEC_SCRAPE_SERIES=/tmp/series.json flock /tmp/agentspec-engine.lock \
        .venv/bin/python -m pytest -q -s tests/test_server.py -m server -k soak
    .venv/bin/python docs/grafana/render_dashboard.py /tmp/series.json docs/grafana/agentspec.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agentspec_sdk.backends.inside_vllm.prom_metrics import parse_agentspec
from agentspec_sdk.backends.remote.remote_inspect import parse_prometheus

HERE = Path(__file__).resolve().parent


def buckets(text: str, family: str) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family + "_bucket":
                out[float(s.labels["le"])] += float(s.value)
    return dict(out)


def quantile(q: float, bucket_delta: dict[float, float]) -> float | None:
    """histogram_quantile over bucket increments (cumulative counts by upper bound)."""
    items = sorted(bucket_delta.items())
    if not items or items[-1][1] <= 0:
        return None
    rank = q * items[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in items:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_count) / (count - prev_count)
                                               if count > prev_count else 0)
        prev_le, prev_count = le, count
    return prev_le


def load(path: Path) -> list[dict]:
    series = json.loads(path.read_text())
    return [{"t": s["t"], "ours": parse_agentspec(s["text"]), "vllm": parse_prometheus(s["text"]),
             "prop_b": buckets(s["text"], "agentspec:proposer_seconds"),
             "step_b": buckets(s["text"], "agentspec:step_seconds")} for s in series]


def _sum(flat: dict, name: str, pos: int | None = None, label: str | None = None) -> float:
    return sum(v for k, v in flat.items() if k[0] == name and (pos is None or k[pos] == label))


def render(series_path: Path, out: Path, window: float = 10.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads((HERE / "agentspec.json").read_text())
    titles = {p["id"]: p["title"] for p in dash["panels"]}
    pts = load(series_path)
    t0 = pts[0]["t"]
    classes = sorted({k[1] for p in pts for k in p["ours"] if k[0] == "draft"})
    sources = sorted({k[3] for p in pts for k in p["ours"] if k[0] == "draft"})
    lines: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for i, cur in enumerate(pts):
        j = next((j for j in range(i, -1, -1) if cur["t"] - pts[j]["t"] >= window), None)
        if j is None:
            continue
        old, x = pts[j], cur["t"] - t0
        dt = cur["t"] - old["t"]

        def d(name, pos=None, label=None, _c=cur, _o=old):
            return _sum(_c["ours"], name, pos, label) - _sum(_o["ours"], name, pos, label)

        def add(panel, name, y, _x=x):
            lines[panel][name].append((_x, y))

        for cls in classes:
            drafted = d("draft", 1, cls)
            add(1, cls, d("accepted", 1, cls) / drafted if drafted else None)
        vd = cur["vllm"].get("num_draft_tokens", 0) - old["vllm"].get("num_draft_tokens", 0)
        va = cur["vllm"].get("num_accepted_tokens", 0) - old["vllm"].get("num_accepted_tokens", 0)
        add(1, "vLLM (all, after grammar trim)", va / vd if vd else None)
        for src in sources:
            add(2, f"{src} drafted", d("draft", 3, src) / dt)
            add(2, f"{src} accepted", d("accepted", 3, src) / dt)
        step_s = d("step_s")
        add(3, "proposer / step", d("proposer_s") / step_s if step_s else None)
        pb = {le: c - old["prop_b"].get(le, 0) for le, c in cur["prop_b"].items()}
        sb = {le: c - old["step_b"].get(le, 0) for le, c in cur["step_b"].items()}
        add(4, "p50", quantile(0.5, pb))
        add(4, "p99", quantile(0.99, pb))
        add(4, "step p50", quantile(0.5, sb))
        for cls in classes:
            add(5, f"{cls} withheld tokens/s", d("withheld", 1, cls) / dt)
            add(5, f"{cls} gated rows/s", d("gated", 1, cls) / dt)
        for scope in ("row", "batch"):
            add(6, scope, _sum(cur["ours"], "errors", 1, scope) - _sum(pts[0]["ours"], "errors", 1, scope))

    fig, axes = plt.subplots(3, 2, figsize=(14, 11))
    units = {1: "fraction", 2: "tokens/s", 3: "fraction", 4: "seconds", 5: "per second", 6: "count"}
    for ax, panel in zip(axes.flat, sorted(titles), strict=True):
        for name, xy in lines[panel].items():
            xs = [a for a, b in xy if b is not None]
            ys = [b for _, b in xy if b is not None]
            if xs:
                ax.plot(xs, ys, label=name, lw=1.6)
        ax.set_title(titles[panel], fontsize=11)
        ax.set_xlabel("seconds into the run")
        ax.set_ylabel(units[panel])
        if panel == 4:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if lines[panel]:
            ax.legend(fontsize=7, loc="best")
    span = pts[-1]["t"] - t0
    fig.suptitle(f"{dash['title']} — rendered with matplotlib from {len(pts)} real /metrics scrapes over "
                 f"{span:.0f} s ({window:g} s rate window); not a Grafana screenshot", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("series", type=Path)
    ap.add_argument("out", type=Path, nargs="?", default=HERE / "agentspec.png")
    ap.add_argument("--window", type=float, default=10.0)
    args = ap.parse_args()
    render(args.series, args.out, args.window)
    print(args.out)
