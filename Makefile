# The two commands of the README. Each one installs what it needs first.
.PHONY: setup demo test test-heavy lint

setup:
	bash scripts/setup.sh

demo: setup
	zephon-vl demo

# ruff and lint-imports (the layer contracts of .importlinter, docs/architecture.md) first
test: setup
	ruff check zephon_core zephon_vl benchmarks tests scripts
	lint-imports
	python3 -m pytest -q -p no:cacheprovider -m "not heavy"

# the tests `make test` leaves out (README.md says which and why)
test-heavy: setup
	python3 -m pytest -q -p no:cacheprovider -m heavy

lint:
	ruff check zephon_core zephon_vl benchmarks tests scripts
	lint-imports
