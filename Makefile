# One entry point for everything. `make test` works from a fresh clone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-real test-ui docs lint install demo bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy src

test: lint
	$(BIN)/pytest tests

# The real tier: the proxy in front of llama.cpp + SmolLM2-135M (scripts/real-upstream builds
# and caches it in ~/.cache/skillstate/llama; SKILLSTATE_REAL_UPSTREAM=URL uses a running one).
# norecursedirs is overridden only to drop "real" from the main run's exclusions.
test-real: $(STAMP)
	[ -n "$$SKILLSTATE_REAL_UPSTREAM" ] || $(BIN)/python scripts/real-upstream build >/dev/null
	$(BIN)/pytest -c pyproject.toml tests/real -o "norecursedirs=.* *.egg-info build dist .venv" \
		-m real --durations=5

# The browser tier: the dashboard (/ui) and the docs site in Debian's chromium via Playwright
# (apt-get install chromium; Playwright's own browser download is never used). Screenshots go to
# each test's tmp dir, and to $$SKILLSTATE_UI_SHOTS when set.
test-ui: $(STAMP)
	$(BIN)/pip install -q -e '.[ui-test,docs]'
	$(BIN)/pytest -c pyproject.toml tests/ui -o "norecursedirs=.* *.egg-info build dist .venv" \
		--durations=5

# The documentation site (MkDocs Material), built with --strict into ./site.
docs: $(STAMP)
	$(BIN)/pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

demo: $(STAMP)
	$(BIN)/skillstate demo

bench: $(STAMP)
	$(BIN)/skillstate bench conversation --offline --turns 100
	$(BIN)/skillstate bench tools --offline --steps 20
	$(BIN)/skillstate bench overhead

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
