#!/usr/bin/env bash
# The API's contract, each on a zkgate of its own: the API against its spec (schemathesis,
# PyPI: no 5xx, every answer as documented), then the spec as generators take it (two
# validators, then a Python and a TypeScript client generated from it, each driven through a
# real flow; PyPI, npm). scripts/test.sh runs it beside the tests, on the binary it built
# (`ZKGATE_BIN`; without it, each builds zkgate first).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
scripts/schemathesis.sh --seed 20261122
echo "contract.sh: $((SECONDS - started)) s for schemathesis" >&2
started=$SECONDS
scripts/clients.sh
echo "contract.sh: $((SECONDS - started)) s for the generated clients" >&2
