"""The skip policy of tests/conftest.py, run on a probe folder by a real pytest: a skip naming a missing
extra is allowed, one naming an installed or unknown extra fails, any other skip fails under
AGENTSPEC_STRICT_SKIPS=1 (the CI) and is only reported otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

PROBE = '''
import pytest

def test_missing_extra():
    pytest.importorskip("no_such_module_26", reason="extra: probe (no_such_module_26 not installed)")

def test_installed_extra():
    pytest.skip("extra: dev (pretending hypothesis is missing)")

def test_unknown_extra():
    pytest.skip("extra: nonsense")

@pytest.mark.skipif(True, reason="data not found")
def test_plain_skip():
    pass

def test_runs():
    assert True
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "tests").mkdir()
    shutil.copy(HERE / "conftest.py", tmp_path / "tests" / "conftest.py")
    # the project's extras, and one whose distribution is never installed
    pyproject = (HERE.parent / "pyproject.toml").read_text()
    extras = "[project.optional-dependencies]\n"
    assert extras in pyproject
    pyproject = pyproject.replace(extras, extras + 'probe = ["agentspec-no-such-distribution-26"]\n')
    (tmp_path / "pyproject.toml").write_text(pyproject)
    (tmp_path / "tests" / "test_probe.py").write_text(PROBE)
    return tmp_path


def run(folder: Path, strict: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTSPEC_STRICT_SKIPS"}
    if strict:
        env["AGENTSPEC_STRICT_SKIPS"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                          "tests/test_probe.py"], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=120).stdout
    outcomes = {}
    for line in out.splitlines():  # "-rA" summary lines: "PASSED tests/test_probe.py::test_runs", ...
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::" in rest:
            outcomes[rest.split("::")[1].split(" ")[0]] = word
        elif word == "SKIPPED" and rest.startswith("["):  # "SKIPPED [1] tests/test_probe.py:4: reason"
            outcomes.setdefault("skipped: " + rest.split(": ", 1)[1], word)
    return {"_output": out, **outcomes}


def test_skips_allowed_only_for_a_missing_extra(probe):
    relaxed = run(probe, strict=False)
    assert relaxed.get("test_runs") == "PASSED", relaxed["_output"]
    assert relaxed.get("test_installed_extra") == "FAILED", relaxed["_output"]
    assert relaxed.get("test_unknown_extra") == "FAILED", relaxed["_output"]
    assert "the extra 'dev' is installed" in relaxed["_output"]
    assert relaxed.get("test_missing_extra") is None and relaxed.get("test_plain_skip") is None
    assert "skipped: extra: probe (no_such_module_26 not installed)" in relaxed, relaxed["_output"]
    assert "skipped: data not found" in relaxed, relaxed["_output"]

    strict = run(probe, strict=True)
    assert strict.get("test_plain_skip") in ("FAILED", "ERROR"), strict["_output"]
    assert "a skip must name a missing extra" in strict["_output"]
    assert "skipped: extra: probe (no_such_module_26 not installed)" in strict, strict["_output"]
    assert strict.get("test_installed_extra") == "FAILED" and strict.get("test_runs") == "PASSED"
