"""schemathesis hooks for zkgate (loaded by the config scripts/schemathesis_fixtures.py writes).

A request body that names a lease (`"lease": "<instance>-<32 hex>"`) or a leader's handle can
only be served with one zkgate issued; an id schemathesis makes up has the right form but names
an instance that does not exist (410). schemathesis hands the config's values to bodies only
while fuzzing, so its example and coverage phases would send made-up ids alone. Before each
call, a well-formed id of another instance in a body's `lease` (or the `handle` of a leader's
proclamation) is swapped for a real one made by the fixture script, and a batch's claims for
claims of that instance; anything malformed is sent as generated, so that what must be refused
still is.

The operations whose success uses their thing up (a delete, an ack, a replay, a vote: RENEWED in
scripts/schemathesis_fixtures.py) get a new one after each call answered 2xx, made as the
fixture script made the first, and the next requests' paths name it instead of the spent one;
otherwise every request after the first served one (often a negative case the server serves
anyway) would meet 404.

A conditional write (`If-Match` on a counter's or a key's set or delete) can only be served with
the resource's current version, which schemathesis cannot know: a well-formed ETag it made up
is swapped for the one the resource has now (read just before), so that the write is tried
where it succeeds; `*` and malformed values are sent as generated.

An `Idempotency-Key` belongs to the one request first sent with it: schemathesis draws few
distinct keys and sends them with ever other bodies, which the server rightly refuses (422).
A well-formed key gets the call's number appended, so that each request has a key of its own;
a malformed one is sent as generated.

A `ZKGATE-Guard` names a holding by its handle, which schemathesis can only make up: a write
guarded by a handle that holds nothing is refused (409 `guard-lost`) by design, and a malformed
guard (most of what the coverage phase makes of the header) is refused (400) before anything
else, so that every operation that takes one would mostly refuse what is generated. The header
is left out of every call: guards are tried by tests/it/guards.rs (malformed ones too) and by
invariant 5 of tests/it/invariants.rs (every writing operation, with real holdings).
"""

import importlib.util
import itertools
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

import schemathesis

ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{32}")
ETAG = re.compile(r'(W/)?"[0-9]{1,18}"')
KEY = re.compile(r"[!-~]{1,240}")
CALLS = itertools.count(1)
# The conditional writes, and where their resource is read.
CONDITIONAL = {
    "PUT /v1/counters/{name}": ("/v1/counters/{}", "name"),
    "DELETE /v1/counters/{name}": ("/v1/counters/{}", "name"),
    "PUT /v1/kv/{key}": ("/v1/kv/{}", "key"),
    "DELETE /v1/kv/{key}": ("/v1/kv/{}", "key"),
}

with open(os.environ.get("ZKGATE_SCHEMATHESIS_FIXTURES", "target/schemathesis-fixtures.json"), encoding="utf-8") as f:
    FIXTURES = json.load(f)
LEASES = itertools.cycle(FIXTURES["leases"])

_spec = importlib.util.spec_from_file_location(
    "zkgate_schemathesis_fixtures", os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemathesis_fixtures.py")
)
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)
MAKER = fixtures.Maker(FIXTURES["base"], FIXTURES["run"])
# Per renewed operation: the path parameters of its live thing, and every value issued for it
# (a path that names one of ours, spent or not, gets the live one; any other is left alone).
CURRENT = {operation: dict(parameters) for operation, parameters in FIXTURES["renewed"].items()}
ISSUED = {operation: {(k, v) for k, v in parameters.items()} for operation, parameters in CURRENT.items()}
MADE = itertools.count(1)


def foreign(value):
    return isinstance(value, str) and ID.fullmatch(value) and not value.startswith(FIXTURES["instance"] + "-")


def current_etag(label, path_parameters):
    """The ETag the resource of conditional write `label` has now, if it exists."""
    template, name = CONDITIONAL[label]
    value = path_parameters.get(name)
    if not isinstance(value, str):
        return None
    url = FIXTURES["base"] + template.format(urllib.parse.quote(value, safe="/" if name == "key" else ""))
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.headers.get("etag")
    except (urllib.error.URLError, OSError, ValueError):
        return None


@schemathesis.hook
def before_call(context, case, **kwargs):
    label = case.operation.label
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and KEY.fullmatch(key):
        case.headers["Idempotency-Key"] = f"{key}-{next(CALLS)}"
    if case.headers and "ZKGATE-Guard" in case.headers:
        del case.headers["ZKGATE-Guard"]
    if label in CONDITIONAL and case.headers and ETAG.fullmatch(case.headers.get("If-Match") or ""):
        etag = current_etag(label, case.path_parameters or {})
        if etag:
            case.headers["If-Match"] = etag
    if label in CURRENT and case.path_parameters:
        for name, value in CURRENT[label].items():
            if (name, case.path_parameters.get(name)) in ISSUED[label]:
                case.path_parameters[name] = value
    body = case.body
    if not isinstance(body, dict):
        return
    if foreign(body.get("lease")):
        body["lease"] = next(LEASES)
    if case.operation.label == "PUT /v1/elections/{name}/leader" and foreign(body.get("handle")):
        body["handle"] = FIXTURES["leader"]
    # A batch of claims is served by the instance of its first claim and refuses claims of
    # another: made-up claims become (unheld) claims of this instance, answered one by one.
    if case.operation.label == "POST /v1/queues/{name}/claims/ack" and isinstance(body.get("claims"), list):
        body["claims"] = [
            FIXTURES["instance"] + claim[8:] if foreign(claim) else claim for claim in body["claims"]
        ]


@schemathesis.hook
def after_call(context, case, response):
    label = case.operation.label
    if label not in CURRENT or not 200 <= response.status_code < 300:
        return
    if any(case.path_parameters.get(name) != value for name, value in CURRENT[label].items()):
        return  # served something else (a link's value in the stateful phase): ours is still live
    try:
        made = fixtures.RENEWED[label](MAKER, next(MADE))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the spent one stays, and its 404s will say so
        print(f"schemathesis hooks: no new fixture for {label}: {e}", file=sys.stderr)
        return
    CURRENT[label] = made
    ISSUED[label].update(made.items())
