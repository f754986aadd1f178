# One entry point for set-up, the main job and the tests. Everything installs into .venv.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Without a CUDA driver, install the CPU build of torch before the project, so that the
# open "torch>=2.5" requirement is already met and pip does not pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)

.PHONY: setup demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
ifneq ($(HAS_CUDA),1)
	$(BIN)/pip install -q "$(TORCH_CPU)"
endif
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

# The main job on the embedded default (CPU): cost card, measured ceilings, the cpu-demo
# sweep against them, the cost-model fit, and the report (results/runs/demo/report.md and .html).
DEMO := results/runs/demo
demo: setup
	$(BIN)/python -m experiments.card model=cpu-demo device=null
	$(BIN)/python -m experiments.ceilings device=cpu quick=true out_dir=$(DEMO)
	$(BIN)/python -m experiments.sweep model=cpu-demo out_dir=$(DEMO) ceilings=$(DEMO)/ceilings.json
	$(BIN)/python -m experiments.fit results_dir=$(DEMO)
	$(BIN)/python -m experiments.report results_dir=$(DEMO)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m pytest benchmarks -q --benchmark-only

clean:
	rm -rf $(VENV) .pytest_cache
