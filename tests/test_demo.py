"""`agentspec demo --quick` end to end on the real engine (a subprocess: vLLM needs its own process)."""

import json
import os
import re
import subprocess
import sys

import pytest

from agentspec_sdk import law


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-m", "agentspec_sdk.replay.cli", "demo", "--quick", "--out", str(out),
           "--capture", str(out / "capture")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "report.json").read_text()), proc.stdout, proc.stderr


@pytest.mark.engine
def test_demo_writes_report_table_and_plots(demo_report):
    out, rep, stdout, _ = demo_report
    assert rep["schema"] == "agentspec-report/1" and rep["partial"] is False
    assert {p.name for p in out.iterdir()} >= {"report.json", "report.md", "tau_by_class.png",
                                               "saving_vs_schema_share.png"}
    assert "| D | structure |" in stdout and "Verdicts" in stdout
    assert set(rep["speedup"]["D"]) == {"off", "structure", "suffix"}
    assert rep["speedup"]["D"]["off"]["decode"] == pytest.approx(1.0)
    assert [v["name"] for v in rep["verdicts"]] == ["P1", "R1", "R2", "R3", "R4", "R5"]
    verdicts = {v["name"]: v for v in rep["verdicts"]}
    # the prose slice (arm A) gives F-class rounds: P1 and R1 decide, with numbers
    for name in ("P1", "R1"):
        assert verdicts[name]["status"] in ("pass", "rejected"), verdicts[name]["text"]
        assert verdicts[name]["numbers"]["classes"]["F"]["rounds"] >= 20
    assert {c["name"].split("/")[1] for c in verdicts["R5"]["numbers"]["checks"]} >= {"structure", "suffix"}
    assert {r["arm"] for r in rep["runs"]} == {"A", "D", "D-react", "D-code"}  # arm D once per agent format
    assert "| D-react | structure |" in stdout and "| D-code | structure |" in stdout
    be = rep["breakeven"]
    assert (be["w_s_star_exact"] is not None or be["w_s_star_exact_reason"]) and "w_s_star_approx" in be
    md = (out / "report.md").read_text()
    assert "## Predicted vs measured decode speedup" in md
    assert md.rstrip().splitlines()[-1].startswith("- arm ")  # ends with the operator's decisions
    for key in ("platform", "versions", "model", "seed"):
        assert key in rep["meta"]


@pytest.mark.engine
def test_demo_captures_the_off_runs_turns(demo_report):
    """`--capture DIR` (docs/capture.md): every turn of the off run, none of the other modes' and not
    the warm-up; each agent's turns under its episode, in the format its arm replays."""
    from agentspec_sdk.backends.capture import read_capture

    out, rep, _, _ = demo_report
    cap = read_capture([out / "capture"])
    off = [r for r in rep["runs"] if r["mode"] == "off"]
    assert len(cap.turns) == sum(r["turns"] for r in off) > 0 and cap.notes == []
    assert rep["meta"]["capture"] == str(out / "capture")
    assert {t.format for t in cap.turns} == {"tool_calls", "react", "code_agent", "prose"}
    assert "warmup" not in {t.episode for t in cap.turns} and all(t.episode for t in cap.turns)
    assert all(t.temperature == 0.0 and t.prompt and t.out and t.finish_reason for t in cap.turns)
    assert all(t.grammar is None or t.grammar.kind == "lark" for t in cap.turns)


@pytest.mark.engine
def test_demo_keeps_vllms_output_in_its_log_and_shows_the_bar_and_the_result(demo_report):
    out, _, stdout, stderr = demo_report
    # the terminal: the progress bar on stderr (tqdm's updates, separated by carriage returns) ...
    updates = [s for s in re.split(r"[\r\n]+", stderr) if s.strip()]
    assert updates and updates[-1].startswith("demo: 100%"), stderr[-2000:]
    assert [s for s in updates if not s.startswith("demo:")] == [], stderr[-4000:]
    # ... and the result on stdout, which names the log
    assert stdout.startswith("# AgentSpec report") and f"vLLM's log: {out / 'vllm.log'}" in stdout
    # vLLM's own lines went to the log: its logging, and its engine-core processes' weight loader
    log = (out / "vllm.log").read_text()
    for line in ("INFO", "Loading safetensors checkpoint shards"):
        assert line in log and line not in stdout + stderr, line


@pytest.mark.engine
def test_demo_interleaves_the_modes_and_keeps_the_pass_logs(demo_report):
    from agentspec_sdk.replay.passes import read_logs

    out, rep, _, _ = demo_report
    steps, passes = read_logs(out / "passes.jsonl")
    assert {mode for _, mode in passes} == {"off", "structure", "suffix"}
    # every engine replays arm D before any engine starts on the next arm: the modes compared on an
    # arm run minutes apart, not a whole plan apart
    arms = rep["meta"]["arms"]
    first, second = arms[0], arms[1]
    end_first = max(p["t"] for (key, _), ps in passes.items() if key[0] == first for p in ps)
    start_second = min(p["t"] for (key, _), ps in passes.items() if key[0] == second for p in ps)
    assert end_first < start_second
    # what each pass computed comes from vLLM's scheduler, for every mode (stock drafters too)
    for (key, mode), ps in passes.items():
        assert all("prefill_tokens" in p and "spec_drafted" in p for p in ps), (key, mode)
        assert {p["no_spec"] for p in ps} == {int(mode == "off")}, (key, mode)
        run = next(r for r in rep["runs"] if r["arm"] == key[0] and r["mode"] == mode)
        # the drafts vLLM verified in the run's passes are the run's drafts less those the request's
        # grammar trimmed before verification (suffix's drafts on arm D: 100 of 137 verified)
        verified = sum(p["spec_drafted"] for p in ps)
        assert (verified == 0) if mode == "off" else (0 < verified <= run["drafted"]), \
            (key, mode, verified, run["drafted"])
    # the three engines were live together: one group, every run tagged with it (peer tok/s within it)
    assert len(rep["meta"]["engine_groups"]) == 1
    assert {r.get("engine_group") for r in rep["runs"]} == {0}
    # target passes as the engine counted them: off writes one token a pass
    for run in rep["runs"]:
        if run["mode"] == "off":
            assert run["passes"] == run["output_tokens"] == run["passes_from_tokens"], run["arm"]


@pytest.mark.engine
def test_demo_report_is_internally_consistent(demo_report):
    _, rep, _, _ = demo_report
    for run in rep["runs"]:
        assert run["turns"] > 0 and run["errors"] == 0
        assert 0 <= run["accepted"] <= run["drafted"]
        classes = run["by_class"].values()
        for field in ("tokens", "drafted", "accepted", "rounds"):
            total = run["output_tokens"] if field == "tokens" else run[field]
            assert sum(c[field] for c in classes) == total, (run["mode"], field)
        for c in classes:
            assert c["accepted"] <= c["drafted"]
        if run["mode"] == "off":
            assert run["drafted"] == 0
    structure = next(r for r in rep["runs"] if r["mode"] == "structure")
    assert structure["drafted"] > 0 and structure["by_class"]["S"]["tokens"] > 0
    assert structure["w"]["S"] == pytest.approx(structure["by_class"]["S"]["tokens"]
                                                / structure["output_tokens"])


@pytest.mark.engine
def test_demo_measures_suffix_as_a_peer_with_per_class_rows(demo_report):
    _, rep, stdout, _ = demo_report
    runs = {r["mode"]: r for r in rep["runs"] if r["arm"] == "D"}
    suffix, structure, off = runs["suffix"], runs["structure"], runs["off"]
    assert suffix["drafted"] > 0 and suffix["accepted"] > 0
    # vLLM's drafter observed in-process: its drafts settle per law class, none left unclassified
    assert set(suffix["by_class"]) <= {"S", "R", "F"}
    assert sum(c["drafted"] for c in suffix["by_class"].values()) == suffix["drafted"]
    assert suffix["by_class"]["S"]["drafted"] > 0
    for r in (off, suffix, structure):
        # accepted tokens the stop check dropped (beyond the output) saved no pass
        assert r["output_tokens"] - r["accepted"] <= r["passes"] <= r["output_tokens"]
        assert r["cost"] >= r["passes"] and r["oracle_cost"] <= r["cost"] + 1e-9
    assert off["passes"] == off["output_tokens"] and off["cost"] == off["passes"]
    for r in (off, suffix, structure):  # the engine's pass log splits decode time (passes.steady_decode)
        assert r["steady_tok_s"] > 0 and 0.0 <= r["prefill_wait_share"] <= 1.0
    # the drafter's price as the run ended: the learned delta, and the rate budget_rule "rate" would use
    assert structure["drafter_delta"] > 0 and structure["drafter_token_rate"] >= 1.0
    [peer] = [p for p in rep["peers"] if p["arm"] == "D"]
    assert peer["best_stock_by_cost"] == "suffix" and peer["cost_vs_best_stock"] > 0
    assert "Target passes and cost" in stdout


@pytest.mark.engine
def test_demo_law_prediction_recomputes(demo_report):
    _, rep, _, _ = demo_report
    fit, lw = rep["law_fit"], rep["law"]
    assert lw["kappa"] == fit["kappa"] and lw["rho_s"] == fit["rho"]["S"]
    structure = next(r for r in rep["runs"] if r["mode"] == "structure")
    pred = structure["predicted"]
    # a run is predicted at its own acceptance: kappa and rho fitted on that run's rounds
    assert 0 < pred["kappa"] and set(pred["rho"]) == set("SRF")
    params = law.LawParams(pred["kappa"], pred["delta"], pred["d"])
    w = {c: structure["w"][c] or 0.0 for c in "SRF"}
    mix = law.ClassMix(w, pred["rho"])
    t = float(law.tau(pred["gamma"], law.eps_bar(params, mix)))
    assert pred["tau"] == pytest.approx(t)
    assert pred["saving_round"] == pytest.approx(
        float(law.saving(pred["gamma"], t, pred["delta"], pred["d"])))
    check = pred["check"]  # the pass cost model's saving: 1 - t_spec / (t_off (1 + f tau))
    f = check["draft_share"]
    rounds_tau = pred.get("tau_rounds", t)  # the check uses each class's tau at its own drafted length
    assert pred["saving"] == pytest.approx(1 - check["t_spec_s"] / (check["t_off_s"] * (1 + f * rounds_tau)))
    if fit["method"].startswith("rho = exp(-H)"):  # kappa fitted from the target's entropies (the default)
        assert rep["meta"]["entropy_positions"]["F"] > 0  # the prose slice's turns were scored
        assert fit["kappa_fit"]["ci_low"] <= fit["kappa"] <= fit["kappa_fit"]["ci_high"]
    else:  # without entropies rho of a class is its per-position acceptance from the records
        s = fit["acceptance"]["S"]
        assert s["accepted"] <= s["drafted"] and fit["rho"]["S"] == pytest.approx(max(s["alpha"], 1e-3))
    assert rep["lossless"]["compared"] > 0


@pytest.mark.engine
def test_ctrl_c_leaves_a_valid_partial_report(tmp_path):
    import signal
    import time

    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "agentspec_sdk.replay.cli", "demo", "--quick", "--out", str(out),
           "--capture", str(out / "capture")]
    # Ctrl-C as at a terminal: a test run started as a background job inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler (the demo would rightly run to its end)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 600
        while not (out / "report.json").exists():  # written after the first round (every engine, arm D)
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no report after 600 s"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    rep = json.loads((out / "report.json").read_text())
    assert rep["partial"] is True and rep["runs"][0]["mode"] == "off" and rep["runs"][0]["turns"] > 0
    assert "PARTIAL" in (out / "report.md").read_text()
    assert f"vLLM's log in {out / 'vllm.log'}" in proc.stderr.read()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


ENGINE_LOG_SCRIPT = r'''
import logging, multiprocessing, os, subprocess, sys, warnings
from pathlib import Path

from agentspec_sdk.replay.engine_log import engine_log


def child():  # an engine-core process: spawned, it inherits descriptors 1 and 2
    print("spawned stdout", flush=True)
    warnings.warn("spawned FutureWarning", FutureWarning)


if __name__ == "__main__":
    log = logging.getLogger("engine")  # as vLLM's handler: created at import, on the sys.stdout object
    log.addHandler(logging.StreamHandler(sys.stdout))
    with engine_log(Path(sys.argv[1])) as terminal:
        print("python stdout")
        warnings.warn("in-process FutureWarning", FutureWarning)
        log.warning("logging on sys.stdout")
        os.write(2, b"C-level stderr\n")  # torch's C++ warnings (NUMA binding)
        subprocess.run([sys.executable, "-c", "import os; os.write(1, b'subprocess stdout\\n')"],
                       check=True)
        proc = multiprocessing.get_context("spawn").Process(target=child)
        proc.start()
        proc.join()
        terminal.write("progress bar\n")
    print("after, on stdout")
    print("after, on stderr", file=sys.stderr)
'''


def test_engine_log_takes_every_process_output_and_leaves_the_terminal_the_bar(tmp_path):
    """The redirection itself, in a process of its own (pytest's capture replaces sys.stdout)."""
    script, log = tmp_path / "run.py", tmp_path / "out" / "vllm.log"
    script.write_text(ENGINE_LOG_SCRIPT)
    log.parent.mkdir()
    log.write_text("a stale log of an earlier run\n")
    proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "after, on stdout\n"
    assert proc.stderr == "progress bar\nafter, on stderr\n"
    text = log.read_text()
    for line in ("python stdout", "in-process FutureWarning", "logging on sys.stdout", "C-level stderr",
                 "subprocess stdout", "spawned stdout", "spawned FutureWarning"):
        assert line in text, line
    assert "stale" not in text and "progress bar" not in text and "after" not in text
