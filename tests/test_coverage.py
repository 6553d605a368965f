"""`agentspec coverage`: counts per dataset on a small real sample (compile, llguidance, xgrammar)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentspec_sdk.structure.cli import coverage_report


def shared_data() -> Path:
    env = os.environ.get("AGENTSPEC_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


BENCH = shared_data() / "jsonschemabench"
pytestmark = pytest.mark.skipif(not BENCH.is_dir(), reason=f"JSONSchemaBench not found at {BENCH}")


@pytest.fixture(scope="module")
def checker():
    transformers = pytest.importorskip("transformers")
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.structure.grammar_checks import GrammarChecker

    return GrammarChecker(transformers.AutoTokenizer.from_pretrained(str(resolve_model())))


@pytest.fixture
def sample(tmp_path):
    """Two real Glaive schemas, one real GitHub schema, and one the compiler must refuse."""
    glaive = sorted((BENCH / "Glaiveai2K").glob("*.json"))[:2]
    github = sorted((BENCH / "Github_easy").glob("*.json"))[:1]
    for folder, files in (("Glaiveai2K", glaive), ("Github_easy", github)):
        (tmp_path / folder).mkdir()
        for f in files:
            shutil.copy(f, tmp_path / folder / f.name)
    unsupported = {"type": "array", "contains": {"type": "integer"}}
    (tmp_path / "Github_easy" / "zz_unsupported.json").write_text(json.dumps(unsupported))
    return tmp_path


def test_coverage_counts_on_a_sample(sample, checker):
    datasets, reasons = coverage_report(sample, checker)
    assert datasets["Glaiveai2K"] == {"total": 2, "compiled": 2, "llguidance_ok": 2, "xgrammar_ok": 2}
    assert datasets["Github_easy"]["total"] == 2
    assert datasets["Github_easy"]["compiled"] == 1
    assert any("contains" in reason for reason in reasons)


def test_coverage_command_prints_the_json_contract(sample):
    from agentspec_sdk.cli import app

    result = CliRunner().invoke(app, ["coverage", str(sample), "--json", "--limit", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert set(report) == {"datasets"}
    assert set(report["datasets"]) == {"Glaiveai2K", "Github_easy"}
    for counts in report["datasets"].values():
        assert set(counts) == {"total", "compiled", "llguidance_ok", "xgrammar_ok"}
        assert counts["total"] == 1


def test_coverage_rejects_a_folder_without_datasets(tmp_path, checker):
    import typer

    with pytest.raises(typer.BadParameter):
        coverage_report(tmp_path, checker)
