"""`agentspec law` and `agentspec law plot`: numbers, JSON, errors and real PNG files."""

import itertools
import json
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from agentspec_sdk.law import ClassMix, LawParams, evaluate  # noqa: E402
from agentspec_sdk.law.cli import app as law_app  # noqa: E402
from agentspec_sdk.law.plots import figure_saving_vs_w_s, figure_tau_by_class  # noqa: E402

EXAMPLE = ["--w-s", "0.5", "--w-r", "0.3", "--rho-s", "0.95", "--rho-r", "0.6", "--rho-f", "0.4",
           "--kappa", "0.8", "--delta", "0.05", "--d", "0.02", "--gamma", "8"]
# a regime with a breakeven inside [0, 1]
CROSSING = ["--w-s", "0.3", "--w-r", "0.3", "--rho-s", "0.9", "--rho-r", "0.2", "--rho-f", "0.1",
            "--kappa", "1.0", "--delta", "0.1", "--d", "0.3", "--gamma", "8"]

runner = CliRunner()


def top_level_app():
    from agentspec_sdk.cli import app

    return app


@pytest.fixture(params=["law_app", "agentspec"])
def invoke(request):
    if request.param == "law_app":
        return lambda args: runner.invoke(law_app, args)
    app = top_level_app()
    return lambda args: runner.invoke(app, ["law", *args])


def tau_direct(gamma, eps):
    return sum((1 - eps) ** i for i in range(1, gamma + 1))


def test_json_output_is_one_object_with_the_law_numbers(invoke):
    result = invoke([*EXAMPLE, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("tau", "tau_by_class", "saving", "speedup", "eps_star", "w_s_star_approx",
                "w_s_star_exact", "gamma_opt"):
        assert key in data
    eps = 0.8 * (1 - (0.5 * 0.95 + 0.3 * 0.6 + 0.2 * 0.4))
    assert data["tau"] == pytest.approx(tau_direct(8, eps))
    assert data["tau_by_class"]["F"] == pytest.approx(tau_direct(8, 0.8 * 0.6))
    assert data["saving"] == pytest.approx(1 - (1 + 8 * 0.07) / (tau_direct(8, eps) + 1))
    assert data["eps_star"] == pytest.approx(2 * (1 - 0.07) / 9)
    assert data["w_s_star_exact"] is None  # pays at every share here, and says so
    assert "pays at every" in data["w_s_star_exact_reason"]
    assert data["gamma_opt"] == evaluate(LawParams(0.8, 0.05, 0.02),
                                         ClassMix.from_shares(0.5, 0.3, 0.95, 0.6, 0.4), 8).gamma_opt.gamma


def test_breakevens_in_range_and_text_output(invoke):
    data = json.loads(invoke([*CROSSING, "--json"]).stdout)
    assert 0 < data["w_s_star_exact"] < data["w_s_star_approx"] < 1
    text = invoke(CROSSING)
    assert text.exit_code == 0
    assert f"{data['w_s_star_exact']:.4f}" in text.stdout
    assert "optimal gamma" in text.stdout and "tau_S/tau_R/tau_F" in text.stdout
    assert "leave speculation off" in text.stdout


def test_help_says_rho_n_is_taken_at_the_given_rf_ratio():
    result = runner.invoke(law_app, ["--help"])
    assert result.exit_code == 0
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout).split())
    assert "rho_n = (w_R rho_R + w_F rho_F) / (w_R + w_F) at the given R:F ratio" in text


@pytest.mark.parametrize("change,message", [
    ({"--w-s": "0.8"}, "exceeds 1"),
    ({"--rho-f": "1.5"}, "rho_F"),
    ({"--rho-s": "0"}, "rho_S"),
    ({"--delta": "-0.1"}, "delta"),
    ({"--d": "-0.1"}, "d must"),
    ({"--gamma": "0"}, "gamma"),
    ({"--kappa": "4"}, "kappa"),
])
def test_bad_input_exits_nonzero_with_a_message(invoke, change, message):
    args = list(EXAMPLE)
    for flag, value in change.items():
        args[args.index(flag) + 1] = value
    result = invoke(args)
    assert result.exit_code != 0
    assert "Error:" in result.stderr and message in result.stderr
    assert "Traceback" not in result.output


def test_missing_options_are_named():
    result = runner.invoke(law_app, EXAMPLE[:6])
    assert result.exit_code != 0 and "--kappa" in result.stderr and "--gamma" in result.stderr


# ---------------------------------------------------------------- plots

def assert_real_png(path, min_bytes=15_000):
    assert path.exists() and path.stat().st_size > min_bytes
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
    assert float(img[..., :3].std()) > 0.05  # not a blank canvas
    return img


def test_plot_writes_two_real_pngs(invoke, tmp_path):
    result = invoke(["plot", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    tau_png, saving_png = tmp_path / "tau_by_class.png", tmp_path / "saving_vs_schema_share.png"
    assert str(tau_png) in result.stdout and str(saving_png) in result.stdout
    assert_real_png(tau_png)
    assert_real_png(saving_png)


def test_plot_draws_measured_points(tmp_path):
    report = {
        "law": {"w_s": 0.3, "w_r": 0.3, "rho_s": 0.9, "rho_r": 0.2, "rho_f": 0.1, "kappa": 1.0,
                "delta": 0.1, "d": 0.3, "gamma": 8},
        "measured": [{"arm": "A", "w_s": 0.05, "saving": -0.4, "gamma": 8},
                     {"arm": "B", "w_s": 0.8, "saving": 0.3, "gamma": 8}],
        "tau_by_class": {"S": [{"gamma": 8, "tau": 3.1, "ci": [2.8, 3.4]}], "F": {"gamma": 8, "tau": 0.1}},
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    bare, marked = tmp_path / "bare", tmp_path / "marked"
    law = report["law"]
    args = [x for k, v in law.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    assert runner.invoke(law_app, ["plot", "--out", str(bare), *args]).exit_code == 0
    result = runner.invoke(law_app, ["plot", "--out", str(marked), "--measured", str(path)])
    assert result.exit_code == 0, result.output
    for name in ("tau_by_class.png", "saving_vs_schema_share.png"):
        a, b = assert_real_png(bare / name), assert_real_png(marked / name)
        assert a.shape == b.shape and not np.array_equal(a, b)  # the points are drawn


def test_plot_rejects_a_bad_report(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"measured": [{"w_s": 0.5}]}))
    result = runner.invoke(law_app, ["plot", "--out", str(tmp_path), "--measured", str(bad)])
    assert result.exit_code != 0 and "needs 'w_s' and 'saving'" in result.stderr
    result = runner.invoke(law_app, ["plot", "--measured", str(tmp_path / "none.json")])
    assert result.exit_code != 0 and "does not exist" in result.stderr


def test_figures_have_labelled_axes_and_breakeven_marks():
    params = LawParams(1.0, 0.1, 0.3)
    mix = ClassMix.from_shares(0.3, 0.3, 0.9, 0.2, 0.1)
    fig = figure_tau_by_class(params, mix, 16)
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel()
    assert len([ln for ln in ax.get_lines() if len(ln.get_xdata()) == 16]) == 5  # ceiling, S, R, F, mixed
    fig = figure_saving_vs_w_s(params, mix, (4, 8))
    ax = fig.axes[0]
    assert "schema share" in ax.get_xlabel() and "saving" in ax.get_ylabel()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # below the axes
    assert sum("exact" in t for t in labels) == 2 and any("small-eps" in t for t in labels)


def test_saving_plot_labels_points_by_arm_mode_batch_and_draws_the_cost_model():
    params = LawParams(0.64, 0.2, 0.01)
    mix = ClassMix.from_shares(0.7, 0.3, 0.8, 0.42, 0.14)
    pts = [{"arm": "D", "mode": "structure", "batch": 8, "gamma": 8, "w_s": 0.7, "saving": 0.45,
            "predicted": 0.5},
           {"arm": "D", "mode": "suffix", "batch": 8, "gamma": 8, "w_s": 0.7, "saving": 0.4}]
    fig = figure_saving_vs_w_s(params, mix, (8,), pts, {"gamma": 5, "draft_share": 0.6, "overhead": 0.02})
    ax = fig.axes[0]
    assert {t.get_text() for t in ax.texts} == {"D structure b8", "D suffix b8"}
    curve = [ln for ln in ax.get_lines() if (ln.get_label() or "").startswith("pass cost model")]
    assert len(curve) == 1 and "f=0.60" in curve[0].get_label()
    # the curve is the pass-cost saving at w_S = 0.7
    from agentspec_sdk.law import pass_cost_ratio, tau_vs_w_s

    x, y = curve[0].get_xdata(), curve[0].get_ydata()
    i = int(np.argmin(abs(x - 0.7)))
    t = tau_vs_w_s(params, mix, 5, x[i])
    assert y[i] == pytest.approx(1 - float(pass_cost_ratio(t, 1.0, 1.0 + 0.02 + 0.6 * 5 * 0.21, 0.6)))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "predicted for that run" in labels


def test_titles_round_and_point_labels_do_not_overlap():
    # the demo's fit (quick demo, seed 0): six figures of kappa, delta and d in the titles before
    params = LawParams(0.578246, 0.0232777, 0.00115684)
    mix = ClassMix.from_shares(0.81, 0.19, 0.684, 0.672, 0.091)
    assert figure_tau_by_class(params, mix, 16).axes[0].get_title().endswith("(kappa=0.578)")
    # two modes of an arm at the same point and at nearly the same saving, as the quick demo measured
    pts = [{"arm": a, "mode": m, "batch": 8, "gamma": 8, "w_s": w, "saving": s}
           for a, m, w, s in [("A", "structure", 0.0, 0.35), ("A", "suffix", 0.0, 0.35),
                              ("D-code", "structure", 0.0, 0.79), ("D-code", "suffix", 0.0, 0.81),
                              ("D", "structure", 0.81, 0.52), ("D", "suffix", 0.81, 0.385),
                              ("D-react", "structure", 0.71, 0.715), ("D-react", "suffix", 0.71, 0.61)]]
    fig = figure_saving_vs_w_s(params, mix, (8,), pts, {"gamma": 5, "draft_share": 0.78, "overhead": 0.008})
    ax = fig.axes[0]
    assert ax.get_title().endswith("delta=0.0233, d=0.00116)")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert len(boxes) == 8
    for a, b in itertools.combinations(boxes, 2):
        assert not boxes[a].overlaps(boxes[b]), (a, b)
    # the legend is below the axes, over none of the data
    assert fig.legends[0].get_window_extent(renderer).y1 < ax.get_window_extent(renderer).y0


def test_a_ci_bound_a_rounding_error_past_tau_still_plots():
    # a real bench run (arm B, structure γ 4, every round accepted): τ 4.0, CI upper 3.9999999999999973
    params = LawParams(1.0, 0.1, 0.3)
    mix = ClassMix.from_shares(0.3, 0.3, 0.9, 0.2, 0.1)
    fig = figure_tau_by_class(params, mix, 8, {"S": [{"gamma": 4, "tau": 4.0,
                                                      "ci": [2.9305471645217644, 3.9999999999999973]}]})
    assert fig.axes[0].get_xlabel()
