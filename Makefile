# Shortcuts for dev.py, which does the work with nothing but Python and pip.
PY ?= python3

.PHONY: setup demo test bench clean browser screenshot

setup demo test bench:
	$(PY) dev.py $@

# Headless Chromium for the report's screenshot check (Debian's package; needs root). Not part of
# set-up: the tests that use it skip without it.
browser:
	apt-get install -y chromium

# The demo's report as the browser renders it: its regime lines printed, report.png beside it.
screenshot:
	$(PY) scripts/report_screenshot.py results/runs/demo/report.html

clean:
	rm -rf .venv .pytest_cache
