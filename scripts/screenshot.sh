#!/usr/bin/env bash
# Takes the README's dashboard screenshot: runs zkgate (embedded ZooKeeper) on a free port,
# puts it under a realistic load for 40 s (tests/browser/showcase.mjs) and saves
# docs/dashboard.png. Needs what the tests need (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
npm ci --prefix tests/browser --no-audit --no-fund --silent
cargo build --release --quiet
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
target/release/zkgate serve --listen "127.0.0.1:$port" >/tmp/zkgate-screenshot.log 2>&1 &
zkgate=$!
trap 'kill $zkgate 2>/dev/null; wait $zkgate 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.5
done
mkdir -p docs
node tests/browser/showcase.mjs "http://127.0.0.1:$port" docs/dashboard.png "${1:-40}"
