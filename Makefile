# The two commands of the README: `make demo` (the main job) and `make test`. Both set up .venv first.
.PHONY: setup demo test lint
VENV := .venv/bin

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/agentspec demo

test: setup
	$(VENV)/ruff check .
	$(VENV)/python -m pytest -q

lint: setup
	$(VENV)/ruff check .
