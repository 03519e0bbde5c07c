#!/usr/bin/env bash
# Takes the README's dashboard screenshot: runs zkgate (embedded ZooKeeper) on a free port,
# puts it under a realistic load for 40 s (tests/browser/showcase.mjs) and saves
# docs/dashboard.png. Needs what the tests need (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
npm ci --prefix tests/browser --no-audit --no-fund --silent
cargo build --release --quiet
source scripts/background-zkgate.sh
start_zkgate target/release/zkgate target/screenshot-zkgate.log
mkdir -p docs
node tests/browser/showcase.mjs "$ZKGATE_URL" docs/dashboard.png "${1:-40}"
