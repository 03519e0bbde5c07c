#!/usr/bin/env bash
# Runs zkgate's whole test suite on a fresh machine: installs what is missing (ZooKeeper,
# Curator, kazoo, chromium, etcd from Debian; cargo-nextest from crates.io; playwright-core,
# openapi-typescript and openapi-fetch from npm; schemathesis and the spec's validators and
# Python client generator from PyPI),
# checks formatting and lints, then runs every test against real ZooKeeper servers that the
# tests start on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's time goes to stderr, and the whole run's at the end: the suite is to stay within
# 15 minutes on 2 CPUs, compile included (BENCHMARKS.md, "The test suite's time").
step() {
    local started=$SECONDS status=0
    "$@" || status=$?
    echo "test.sh: $((SECONDS - started)) s for: $* (exit status $status)" >&2
    return "$status"
}
trap 'echo "test.sh: $SECONDS s in all" >&2' EXIT
step scripts/install-deps.sh test
cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest
# The dashboard test drives chromium with playwright-core (the version in the lock file).
step npm ci --prefix tests/browser --no-audit --no-fund --silent
cargo fmt --check
step cargo clippy --all-targets --quiet -- -D warnings
# One ZooKeeper server for the run, shared by every test that can share one (each under a
# root of its own: tests/it/common); the tests that need a server to themselves start their
# own. It stops when the tests are done, or with this script.
exec 3< <(exec cargo run --quiet --example test_zookeeper)
shared_zookeeper=$!
trap 'kill "$shared_zookeeper" 2>/dev/null || true; echo "test.sh: $SECONDS s in all" >&2' EXIT
step read -r -u 3 ZKGATE_TEST_ZOOKEEPER || { echo "the shared ZooKeeper did not start" >&2; exit 1; }
export ZKGATE_TEST_ZOOKEEPER
step cargo nextest run --profile ci "$@"
kill "$shared_zookeeper"
unset ZKGATE_TEST_ZOOKEEPER
# The API against its spec: no 5xx, and every answer as documented (schemathesis, PyPI).
step scripts/schemathesis.sh --seed 20261122
# The spec as generators take it: two validators, then a Python and a TypeScript client
# generated from it, each driven through a real flow (PyPI, npm).
ZKGATE_BIN=target/debug/zkgate step scripts/clients.sh
# The comparison bench, tiny and unoptimised, so that it cannot rot: it checks every answer of
# zkgate, kazoo and etcd, never a speed (BENCHMARKS.md has the real runs).
ZKGATE_BENCH_QUICK=1 step cargo bench --profile dev --bench compare
