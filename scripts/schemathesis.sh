#!/usr/bin/env bash
# Fuzzes the running API against its own OpenAPI spec with schemathesis (from PyPI, in a venv under
# ~/.cache/zkgate): zkgate with an embedded ZooKeeper on a free port, every operation, checks that
# no answer is a 5xx and that every status, content type and body is the one the spec documents.
#   scripts/schemathesis.sh [--seed N] [--max-examples N] [other schemathesis options]
#   ZKGATE_BIN=path/to/zkgate scripts/schemathesis.sh ...   uses that binary, builds nothing
# scripts/test.sh runs it with a fixed seed, so that CI is repeatable; run it without one to
# explore new inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
# The venv outlives the clone (like cargo's registry), one per pinned version.
venv=${XDG_CACHE_HOME:-$HOME/.cache}/zkgate/schemathesis-4.32.5
if [[ ! -x $venv/bin/schemathesis ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'schemathesis==4.32.5'
fi
scripts/install-deps.sh test
# A `cargo build` of its own would not reuse scripts/test.sh's build of every target: without
# the tests' dev-dependencies the features of a few shared crates differ, so about forty crates
# and zkgate would be compiled again (80 s on 2 CPUs, holding the tests up on cargo's lock).
binary=${ZKGATE_BIN:-target/debug/zkgate}
[[ -n ${ZKGATE_BIN:-} ]] || cargo build --quiet
source scripts/background-zkgate.sh
# Short waits: generated long polls must not hold the run up.
start_zkgate "$binary" target/schemathesis-zkgate.log --max-wait 1s
url=$ZKGATE_URL
# Event streams never end by themselves (a generated request would wait out the timeout), and
# the WebSocket endpoints answer a plain request with 400 whatever it holds: tests/it/sse.rs,
# tests/it/websocket*.rs and tests/it/fuzz.rs try them instead.
for attempt in 1 2 3; do
    # Real leases, handles, claims... for the operations that act on them, and the config that
    # binds them (with `warnings.fail-on` for operations that refuse almost everything generated).
    python3 scripts/schemathesis_fixtures.py "$url" target/schemathesis.toml
    set +e
    "$venv/bin/schemathesis" --config-file target/schemathesis.toml run "$url/openapi.json" --url "$url" \
        --exclude-path-regex '/events$|/ws$|/observe$' \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --request-timeout 10 --max-examples 15 --no-color "$@" 2>&1 | tee target/schemathesis.log
    status=${PIPESTATUS[0]}
    set -e
    [[ $status -eq 0 ]] && exit 0
    # A run that failed on a warning alone goes again (twice at most), with fresh fixtures:
    # whether an operation served any of its few generated cases can hang on timing (a
    # participant still inside from an earlier case answers 409), and the seed's draws shift
    # with every parameter the spec gains (the guard header moved which borderline operation
    # fell short). A failed check never goes again.
    grep -q "Warnings fail the run" target/schemathesis.log || exit "$status"
    grep -Eq '([0-9]+) generated, \1 passed' target/schemathesis.log || exit "$status"
    echo "schemathesis: only a warning failed the run (attempt $attempt); once more with fresh fixtures" >&2
done
exit "$status"
