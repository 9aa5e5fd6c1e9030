# The two commands of the README. Each one installs what it needs first.
.PHONY: setup demo test test-heavy lint check-install docs

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

# the user guide (mkdocs.yml) into build/site; --strict: a broken link, a missing anchor,
# a page outside the navigation or a public name without a docstring fails it. The
# variable silences Material's end-of-life notice (docs/contributing.md, "The documentation").
docs: setup
	NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet

lint:
	ruff check zephon_core zephon_vl benchmarks tests scripts
	lint-imports

# the built wheel outside this checkout: a fresh venv beside torch 2.14.1, then the demo, a
# text loop and the [titan] extra (docs/api-policy.md; minutes, ~6 GB of disk while it runs)
check-install: setup
	bash scripts/check_install.sh
