#!/usr/bin/env bash
# Runs zkgate's whole test suite on a fresh machine: installs what is missing (ZooKeeper,
# Curator, kazoo from Debian; cargo-nextest from crates.io), checks formatting and lints, then
# runs every test against real ZooKeeper servers that the tests start on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
cargo nextest run --profile ci "$@"
