#!/usr/bin/env bash
# Runs zkgate's whole test suite on a fresh machine: installs what is missing (ZooKeeper,
# Curator, kazoo, chromium, etcd from Debian; cargo-nextest from crates.io; playwright-core,
# openapi-typescript, openapi-fetch and orval from npm; schemathesis, the spec's validators and
# the Python and typescript-fetch client generators from PyPI),
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
# One build of everything (the tests, the binary, the examples, the benches), linted as it
# compiles: zkgate's own crates go through clippy's driver with warnings denied
# (scripts/clippy-rustc), so nothing is compiled twice. Every cargo command below shares it.
export RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/clippy-rustc"
step cargo build --all-targets --quiet
# One ZooKeeper server for the run, shared by every test that can share one (each under a
# root of its own: tests/it/common); the tests that need a server to themselves start their
# own. It stops when the tests are done, or with this script.
exec 3< <(exec cargo run --quiet --example test_zookeeper)
shared_zookeeper=$!
contract=
stop() {
    kill "$shared_zookeeper" 2>/dev/null || true
    [[ -z $contract ]] || kill -- "-$contract" 2>/dev/null || true
    echo "test.sh: $SECONDS s in all" >&2
}
trap stop EXIT
step read -r -u 3 ZKGATE_TEST_ZOOKEEPER || { echo "the shared ZooKeeper did not start" >&2; exit 1; }
export ZKGATE_TEST_ZOOKEEPER
# Beside the tests: the API's contract (schemathesis, then the generated clients; see
# scripts/contract.sh), in a process group of its own so that a failed run stops it whole. It
# waits on its own zkgate far more than it computes; its output follows the tests'.
setsid env -u ZKGATE_TEST_ZOOKEEPER ZKGATE_BIN=target/debug/zkgate scripts/contract.sh >target/contract.log 2>&1 &
contract=$!
step cargo nextest run --profile ci "$@"
kill "$shared_zookeeper"
unset ZKGATE_TEST_ZOOKEEPER
contract_status=0
wait "$contract" || contract_status=$?
contract=
cat target/contract.log
[[ $contract_status -eq 0 ]] || { echo "schemathesis or the generated clients failed (above)" >&2; exit "$contract_status"; }
# The comparison bench, tiny and unoptimised, so that it cannot rot: it checks every answer of
# zkgate, kazoo and etcd, never a speed (BENCHMARKS.md has the real runs).
ZKGATE_BENCH_QUICK=1 step cargo bench --profile dev --bench compare
# The idempotency store's bench, 20 s with a small bound: it fails if the store passes it.
ZKGATE_BENCH_QUICK=1 step cargo bench --profile dev --bench idempotency
# The guard's bench, 100 puts of each kind: it fails on a put that is not answered 2xx.
ZKGATE_BENCH_QUICK=1 step cargo bench --profile dev --bench guards
