"""schemathesis hooks for zkgate (loaded by the config scripts/schemathesis_fixtures.py writes).

A request body that names a lease (`"lease": "<instance>-<32 hex>"`) or a leader's handle can
only be served with one zkgate issued; an id schemathesis makes up has the right form but names
an instance that does not exist (410). schemathesis hands the config's values to bodies only
while fuzzing, so its example and coverage phases would send made-up ids alone. Before each
call, a well-formed id of another instance in a body's `lease` (or the `handle` of a leader's
proclamation) is swapped for a real one made by the fixture script, and a batch's claims for
claims of that instance; anything malformed is sent as generated, so that what must be refused
still is.
"""

import itertools
import json
import os
import re

import schemathesis

ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{32}")

with open(os.environ.get("ZKGATE_SCHEMATHESIS_FIXTURES", "target/schemathesis-fixtures.json"), encoding="utf-8") as f:
    FIXTURES = json.load(f)
LEASES = itertools.cycle(FIXTURES["leases"])


def foreign(value):
    return isinstance(value, str) and ID.fullmatch(value) and not value.startswith(FIXTURES["instance"] + "-")


@schemathesis.hook
def before_call(context, case, **kwargs):
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
