#!/usr/bin/env bash
# Runs zkgate with an embedded ZooKeeper on a fresh machine: installs Java and ZooKeeper if
# missing, builds, and serves on http://127.0.0.1:7070 (override with --listen or ZKGATE_LISTEN).
# Extra arguments go to `zkgate serve` (see `cargo run -- serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh run
cargo build --release --quiet
echo "zkgate: the binary is $PWD/target/release/zkgate (export PATH=\"$PWD/target/release:\$PATH\" for \`zkgate lock\`)" >&2
exec target/release/zkgate serve "$@"
