#!/usr/bin/env bash
# Runs zkgate's whole test suite on a fresh machine: installs what is missing (ZooKeeper,
# Curator, kazoo, chromium, etcd from Debian; cargo-nextest from crates.io; playwright-core from npm),
# checks formatting and lints, then runs every test against real ZooKeeper servers that the
# tests start on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest
# The dashboard test drives chromium with playwright-core (the version in the lock file).
npm ci --prefix tests/browser --no-audit --no-fund --silent
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
cargo nextest run --profile ci "$@"
# The API against its spec: no 5xx, and every answer as documented (schemathesis, PyPI).
scripts/schemathesis.sh --seed 20261122
# The comparison bench, tiny and unoptimised, so that it cannot rot: it checks every answer of
# zkgate, kazoo and etcd, never a speed (BENCHMARKS.md has the real runs).
ZKGATE_BENCH_QUICK=1 cargo bench --profile dev --bench compare
