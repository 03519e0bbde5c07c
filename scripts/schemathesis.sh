#!/usr/bin/env bash
# Fuzzes the running API against its own OpenAPI spec with schemathesis (from PyPI, in a venv
# under target/): zkgate with an embedded ZooKeeper on a free port, every operation, checks that
# no answer is a 5xx and that every status, content type and body is the one the spec documents.
#   scripts/schemathesis.sh [--seed N] [--max-examples N] [other schemathesis options]
# scripts/test.sh runs it with a fixed seed, so that CI is repeatable; run it without one to
# explore new inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/schemathesis-venv
if [[ ! -x $venv/bin/schemathesis ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'schemathesis==4.32.5'
fi
scripts/install-deps.sh test
cargo build --quiet
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=target/schemathesis-zkgate.log
# Short waits: generated long polls must not hold the run up.
target/debug/zkgate serve --listen "127.0.0.1:$port" --max-wait 1s >"$log" 2>&1 &
zkgate=$!
trap 'kill $zkgate 2>/dev/null; wait $zkgate 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.5
done
url="http://127.0.0.1:$port"
"$venv/bin/schemathesis" run "$url/openapi.json" --url "$url" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --request-timeout 10 --max-examples 15 --no-color "$@"
