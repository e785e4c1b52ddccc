# throttlegate: `make demo` tries the product, `make test` runs every suite.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all demo test deps test-rust test-python test-node test-c test-soak bench compare fuzz clean

all: test

## The main job: simulate traffic through examples/rules.toml on the embedded backend.
demo:
	$(CARGO) run -q -p throttlegate-cli -- simulate --rules examples/rules.toml

## Everything the tests need: redis-server (Debian package), Python and Node tools (local folders).
deps:
	scripts/deps-redis.sh

## Build the core, the Python and Node packages and the C library; run every suite.
## Each suite starts its own redis-server(s) on free loopback ports and stops them.
test: deps
	$(MAKE) test-rust
	$(MAKE) test-python
	$(MAKE) test-node
	$(MAKE) test-c
	$(MAKE) test-soak
	@echo "make test: every suite passed"

test-rust:
	$(CARGO) test --workspace --exclude throttlegate-python --exclude throttlegate-node
	# The core still packages and builds on its own (lua/ comes in through core/lua).
	$(CARGO) package -p throttlegate --allow-dirty --quiet

test-python:
	scripts/test-python.sh

test-node:
	scripts/test-node.sh

test-c:
	scripts/test-c.sh

## Rust, Python and Node against one Redis at once for 60 s (after test-python and test-node).
test-soak:
	tests/soak/run.sh

## Criterion benchmarks (release builds; start their own redis-server).
bench: deps
	$(CARGO) bench -p throttlegate

## Side by side with the peers on a private Redis; writes benches/compare/RESULTS.md (COMPARE_SECONDS=3 per case;
## COMPARE_ONLY=algos,node-algos,python-algos,burst runs those parts only, into RESULTS-partial.md).
compare: deps
	benches/compare/run.sh

## A million cases of each property test: policy parser and key rendering (core), C entry points.
fuzz:
	PROPTEST_CASES=1000000 $(CARGO) test --release -p throttlegate --test fuzz
	PROPTEST_CASES=1000000 $(CARGO) test --release -p throttlegate-c --test fuzz

clean:
	$(CARGO) clean
	rm -rf .venv node_modules
