"""Rebuild `tests/data/jsonschemabench` from a full copy of JSONSchemaBench's datasets:

    python tests/data/sample_jsonschemabench.py FULL_DIR [--limit 100]

FULL_DIR holds one sub-folder of `*.json` schemas per dataset (guidance-ai/jsonschemabench's `data/`).
Per dataset the same files `agentspec coverage FULL_DIR --limit 100` reads (`coverage.cli.evenly_spaced`:
every k-th file by name), copied byte for byte; the datasets are those already in the sample."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from agentspec_sdk.coverage.cli import evenly_spaced

HERE = Path(__file__).resolve().parent / "jsonschemabench"
DATASETS = ("Glaiveai2K", "Github_trivial", "Github_easy", "Github_medium", "Github_hard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("full", type=Path, help="one sub-folder of *.json schemas per dataset")
    parser.add_argument("--limit", type=int, default=100, help="schemas per dataset (default 100)")
    args = parser.parse_args()
    for name in DATASETS:
        source = args.full / name
        if not source.is_dir():
            raise SystemExit(f"{source} is not a folder: FULL_DIR must hold the dataset {name}")
        target = HERE / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for path in evenly_spaced(sorted(source.glob("*.json")), args.limit):
            shutil.copyfile(path, target / path.name)
        print(f"{name}: {len(list(target.glob('*.json')))} schemas")


if __name__ == "__main__":
    main()
