# The two commands of the README: `make demo` (the main job) and `make test`. Both set up .venv first.
.PHONY: setup demo test lint
VENV := .venv/bin
# lint-imports checks this source tree (agentspec_sdk here, agentspec_langgraph under integrations/).
LINT_IMPORTS := PYTHONPATH=$(CURDIR):$(CURDIR)/integrations/langgraph $(VENV)/lint-imports --no-cache

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/agentspec demo

test: setup
	$(VENV)/ruff check .
	$(LINT_IMPORTS)
	$(VENV)/python -m pytest -q

lint: setup
	$(VENV)/ruff check .
	$(LINT_IMPORTS)
