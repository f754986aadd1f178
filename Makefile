# Shortcuts for dev.py, which does the work with nothing but Python and pip.
PY ?= python3

.PHONY: setup demo test bench clean

setup demo test bench:
	$(PY) dev.py $@

clean:
	rm -rf .venv .pytest_cache
