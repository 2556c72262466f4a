# One entry point for everything. `make test` works from a fresh clone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-unit test-real test-ui test-agents test-scale docs lint install smoke demo bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts scripts/wheel-smoke scripts/structure-facts scripts/auto-vs-cheapest scripts/overhead-ab
	$(BIN)/ruff format --check src tests scripts scripts/wheel-smoke scripts/structure-facts scripts/auto-vs-cheapest scripts/overhead-ab
	$(BIN)/mypy src

# The suite runs on every core (pytest-xdist): each test starts its own proxy on a free port
# with its own data dir, so tests share nothing. On 2 cores: about 4 min, against 7+ in one.
# --dist worksteal: a worker that runs out takes half of another's queue. xdist's default
# (load) hands out long runs of tests in collection order, so one worker could be left with
# a whole slow module (test_e2e_window_translated) while the other sat idle: 125 s of a
# 910 s run on a loaded machine, about 14% of the wall time.
test: lint
	$(BIN)/pytest -n auto --dist worksteal tests

# The unit tier: every test module of the main suite but the end-to-end ones (tests/e2e: a real
# proxy over HTTP, the soak), the CLI-process ones (tests/cli) and the benchmarks' (tests/bench).
# .ci/run runs it on CPython 3.10 and 3.13 under pyenv (unless one is the default), each in its
# own venv: make test-unit PY=python3.X VENV=.venvs/3.X
UNIT_TESTS = $(filter-out tests/e2e/% tests/cli/% tests/bench/% tests/real/% tests/scale/% \
	tests/ui/% tests/agents/%, $(wildcard tests/test_*.py tests/*/test_*.py tests/*/*/test_*.py))

test-unit: $(STAMP)
	$(BIN)/pytest $(UNIT_TESTS)

# The packaged proxy: build the wheel and the sdist (offline), install the wheel into a clean
# venv per interpreter in SMOKE_PYTHONS (default: this venv's) and smoke it: --version, the demo,
# one proxied turn against tests/fakeprovider.py, no benchmark or test dependency installed.
smoke: $(STAMP)
	$(BIN)/python scripts/wheel-smoke $(foreach p,$(SMOKE_PYTHONS),--python $(p))

# The real tier: the proxy in front of llama.cpp + SmolLM2-135M (scripts/real-upstream builds
# and caches it in ~/.cache/skillstate/llama; SKILLSTATE_REAL_UPSTREAM=URL uses a running one).
# norecursedirs is overridden only to drop "real" from the main run's exclusions.
test-real: $(STAMP)
	[ -n "$$SKILLSTATE_REAL_UPSTREAM" ] || $(BIN)/python scripts/real-upstream build >/dev/null
	$(BIN)/pytest -c pyproject.toml tests/real -o "norecursedirs=.* *.egg-info build dist .venv" \
		-m real --durations=5

# The scale tier: the PostgreSQL store and Redis coordination against real servers (Debian's
# postgresql and redis-server, started by the tier on loopback in temp dirs), and several
# proxy replicas sharing them.
test-scale: $(STAMP)
	$(BIN)/pytest -c pyproject.toml tests/scale -o "norecursedirs=.* *.egg-info build dist .venv" \
		--durations=5

# The browser tier: the dashboard (/ui) and the docs site in Debian's chromium via Playwright
# (apt-get install chromium; Playwright's own browser download is never used). Screenshots go to
# each test's tmp dir, and to $$SKILLSTATE_UI_SHOTS when set.
test-ui: $(STAMP)
	$(BIN)/pip install -q -e '.[ui-test,docs]'
	$(BIN)/pytest -c pyproject.toml tests/ui -o "norecursedirs=.* *.egg-info build dist .venv" \
		--durations=5

# The agents tier: Claude Code, Codex CLI and the OpenAI Agents SDK, real and pinned, driven
# through the proxy against tests/fakeprovider.py. The tier installs them itself into
# ~/.cache/skillstate/agents ($$SKILLSTATE_AGENTS_CACHE): the npm packages with npm install
# --prefix, openai-agents into its own venv there (it pins websockets<17). Skipped, with the
# reason, only when node or npm is absent.
test-agents: $(STAMP)
	$(BIN)/pytest -c pyproject.toml tests/agents -o "norecursedirs=.* *.egg-info build dist .venv" \
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
	rm -rf $(VENV) .venvs build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
