#!/usr/bin/env bash
# The served spec as its users meet it: zkgate with an embedded ZooKeeper on a free port, its
# GET /openapi.json checked by two independent validators (openapi-spec-validator, and
# openapi-generator's `validate --recommend`), then four clients generated from it, unmodified,
# each driving the same real flow (two leases, a lock and its fencing tokens, a queue item put,
# taken and acknowledged, a counter, an election):
#   - Python: openapi-python-client (installed into the venv), tests/clients/python_flow.py;
#   - TypeScript, each type-checked strictly by tsc against what its generator wrote, then run
#     through tests/clients/typescript/flow.ts by a small adapter of its own:
#       openapi-typescript's types called through openapi-fetch (openapi-fetch.ts),
#       orval's fetch client (orval.ts, orval.config.ts),
#       openapi-generator's typescript-fetch (typescript-fetch.ts).
#   scripts/clients.sh                          builds target/debug/zkgate first
#   ZKGATE_BIN=path/to/zkgate scripts/clients.sh   uses that binary, builds nothing
# Everything comes pinned from PyPI (a venv under ~/.cache/zkgate) and npm (tests/clients/typescript's
# package-lock.json); openapi-generator is a jar that runs on the Java that zkgate's embedded
# ZooKeeper needs anyway. orval is pinned at 7.13.2: its later releases need Node 22.18, the
# machine has 20. Generated code goes to target/clients/ and tests/clients/typescript/generated/
# (ignored by git); nothing generated is edited.
#
# What fails the run: an error from either validator; any warning from openapi-generator's
# validation; any openapi-python-client warning except "Unsupported content type text/plain"
# (that generator has no text/plain request bodies at all: the spec is right there); any
# warning or error from openapi-typescript or orval; a generator's failure; a type error; a
# failed flow step. Every stage runs even when an earlier one failed (except what needs its
# output), and the run ends with a list of what failed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The venv outlives the clone (like cargo's registry): a clean clone does not install it again.
venv=${XDG_CACHE_HOME:-$HOME/.cache}/zkgate/clients-venv
out=target/clients
ts=tests/clients/typescript
pins=('openapi-spec-validator==0.9.0' 'openapi-generator-cli==7.26.0' 'openapi-python-client==0.29.1')
if [[ ! -x $venv/bin/python || "$(cat "$venv/pins" 2>/dev/null)" != "${pins[*]}" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}"
    echo "${pins[*]}" >"$venv/pins"
fi
command -v node >/dev/null && command -v npm >/dev/null || { echo "clients.sh needs node (20+) and npm" >&2; exit 1; }
scripts/install-deps.sh test
binary=${ZKGATE_BIN:-target/debug/zkgate}
[[ -n ${ZKGATE_BIN:-} ]] || cargo build --quiet
rm -rf "$out" "$ts/generated" "$ts/dist"
mkdir -p "$out" "$ts/generated"
source scripts/background-zkgate.sh
start_zkgate "$binary" target/clients-zkgate.log
url=$ZKGATE_URL
curl -sSf "$url/openapi.json" -o "$out/openapi.json"

failures=()
fail() {
    echo "clients.sh: FAILED: $1" >&2
    failures+=("$1")
}
section() { printf '\n=== %s\n' "$1"; }
# Runs a tool with its output in $out/LOG, then shows that output; a failure is recorded as
# NAME and returns 1 (the caller decides what may still run).
logged() {
    local name=$1 log=$out/$2 status
    shift 2
    set +e
    "$@" >"$log" 2>&1
    status=$?
    set -e
    cat "$log"
    [[ $status -eq 0 ]] || { fail "$name (exit $status)"; return 1; }
}

section "openapi-spec-validator (every validation error)"
"$venv/bin/openapi-spec-validator" --validation-errors all "$out/openapi.json" || fail "openapi-spec-validator"

section "openapi-generator validate --recommend"
# The jar prints its findings on stderr and exits 1 on errors; warnings (recommendations) leave
# it at 0, so they are read from its output.
logged "openapi-generator validate: errors" openapi-generator-validate.log \
    "$venv/bin/openapi-generator-cli" validate --recommend -i "$out/openapi.json" || true
grep -q '^Warnings:' "$out/openapi-generator-validate.log" && fail "openapi-generator validate: warnings"

section "openapi-python-client generate"
# ruff (a dependency of the generator, in the venv) formats what it writes: it must be on PATH.
python_ok=true
logged "openapi-python-client generate" python-generate.log env PATH="$PWD/$venv/bin:$PATH" \
    "$venv/bin/openapi-python-client" generate --path "$out/openapi.json" --output-path "$out/python" --overwrite ||
    python_ok=false
# Its warnings are blocks that start "WARNING parsing METHOD PATH within TAG." and give the reason
# on the next non-empty line (or "Unable to ..." blocks for schemas).
"$venv/bin/python" - "$out/python-generate.log" <<'EOF' || fail "openapi-python-client: warnings"
import re, sys
text = open(sys.argv[1]).read()
allowed = {"Unsupported content type text/plain"}
bad = []
for block in re.split(r"\n(?=WARNING |Unable to |Cannot )", text)[1:]:
    lines = [line for line in block.splitlines() if line.strip()]
    head, reason = lines[0], (lines[1] if len(lines) > 1 else "")
    if reason.strip() in allowed:
        print(f"known generator limitation: {head} {reason}")
    else:
        bad.append(f"{head} {reason}")
for b in bad:
    print(f"warning: {b}")
sys.exit(1 if bad else 0)
EOF
if $python_ok; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$out/python"
    section "Python flow"
    "$venv/bin/python" tests/clients/python_flow.py "$url" || fail "Python flow"
fi

npm ci --prefix "$ts" --no-audit --no-fund --silent
cp "$out/openapi.json" "$ts/generated/openapi.json"
# Three TypeScript clients, each generated from the served spec, type-checked (tsconfig.<client>.json)
# and run through the same flow (flow.ts) by its own adapter (<client>.ts).
generated=()

section "openapi-typescript (types for openapi-fetch)"
logged openapi-typescript typescript-generate.log \
    "$ts/node_modules/.bin/openapi-typescript" "$ts/generated/openapi.json" -o "$ts/generated/zkgate.d.ts" &&
    generated+=(openapi-fetch)
# It lints the spec with Redocly's rules first and prints what it finds before its own lines.
grep -Eiv '^(✨ openapi-typescript|🚀 )' "$out/typescript-generate.log" | grep -Eqi 'warn|error' &&
    fail "openapi-typescript: warnings"

section "orval (fetch client)"
logged orval orval-generate.log bash -c "cd '$ts' && node_modules/.bin/orval --config ./orval.config.ts" &&
    generated+=(orval)
grep -Eqi 'warn|error' "$out/orval-generate.log" && fail "orval: warnings"

section "openapi-generator typescript-fetch"
# Its log is INFO lines and a few WARNs that are not about the spec's correctness (3.1 support
# "in beta", names it renames in its own output because they are TypeScript words), so only its
# exit status counts; the type check and the flow judge what it wrote.
logged "openapi-generator typescript-fetch" typescript-fetch-generate.log env JAVA_OPTS=-Dlog.level=warn \
    "$venv/bin/openapi-generator-cli" generate -g typescript-fetch -i "$ts/generated/openapi.json" \
    -o "$ts/generated/typescript-fetch" --additional-properties=supportsES6=true,importFileExtension=.js &&
    generated+=(typescript-fetch)

for client in "${generated[@]}"; do
    section "tsc (strict) and the flow: $client"
    if "$ts/node_modules/.bin/tsc" -p "$ts/tsconfig.$client.json"; then
        node "$ts/dist/$client.js" "$url" || fail "$client flow"
    else
        fail "tsc: $client.ts does not type-check against what its generator wrote"
    fi
done

echo
if [[ ${#failures[@]} -gt 0 ]]; then
    printf 'clients.sh: %d failed:\n' "${#failures[@]}" >&2
    printf '  - %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "clients.sh: both validators clean, all four generated clients ran the flow"
