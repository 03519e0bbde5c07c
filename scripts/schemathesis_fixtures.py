#!/usr/bin/env python3
"""Makes what schemathesis cannot invent, and writes the config that hands it over.

Many operations act on things zkgate issued: a lease, a lock's handle, a queue's claim, an
election's leader. An id schemathesis makes up has the right form but names nothing (410: no
such instance), so every generated request would be refused and the run would reach none of
those operations' logic. This script makes real ones on the zkgate at URL, one per operation
(so that one operation's deletes cannot take another's), and writes a schemathesis config that
gives them to those operations' path parameters; every other parameter is generated as usual.
(A dictionary with a probability would mix in generated ids too, but schemathesis uses
dictionaries only while fuzzing: the example and coverage phases would see no real id at all.)
Ids in request bodies (a `lease`, a leader's `handle`) are swapped in by
scripts/schemathesis_hooks.py, from the leases listed in schemathesis-fixtures.json beside OUT.

  scripts/schemathesis_fixtures.py http://127.0.0.1:PORT target/schemathesis.toml
"""

import json
import os
import sys
import uuid
import urllib.error
import urllib.request

def call(base, method, path, body=None, expect=(200, 201, 202, 204)):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, text = answer.status, answer.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    if status not in expect:
        sys.exit(f"fixture {method} {path}: {status} {text[:300]!r}")
    return json.loads(text) if text else None


def main():
    base, out = sys.argv[1], sys.argv[2]
    # Names of this run's own (a run may be tried again on the same instance).
    run = uuid.uuid4().hex[:6]

    def lease():
        return call(base, "POST", "/v1/leases", {"ttl": "30m"})["id"]

    def holder(kind, name, path="acquire", extra=""):
        """A handle of the resource `name` of `kind`, with a lease of its own."""
        url = f"/v1/{kind}/{name}/{path}?wait=0&keep_queued=true{extra}"
        return call(base, "POST", url, {"lease": lease()})["handle"]

    def claim(queue):
        call(base, "POST", f"/v1/queues/{queue}/items", {"fixture": queue})
        return call(base, "POST", f"/v1/queues/{queue}/take?wait=0&ack_deadline=30m")["claim"]

    # (operation, {parameter: value})
    bindings = []

    def bind(operation, **parameters):
        bindings.append((operation, {k.replace("__", "."): v for k, v in parameters.items()}))

    bind("GET /v1/leases/{id}", path__id=lease())
    bind("POST /v1/leases/{id}/keepalive", path__id=lease())
    bind("DELETE /v1/leases/{id}", path__id=lease())
    for kind, take in [("locks", "acquire"), ("rwlocks", "read"), ("semaphores", "acquire")]:
        noun = "permits" if kind == "semaphores" else "handles"
        extra = "&permits=8" if kind == "semaphores" else ""
        for method in ["GET", "DELETE"]:
            name = f"fx{run}-{kind}-{method.lower()}"
            bind(f"{method} /v1/{kind}/{{name}}/{noun}/{{handle}}", path__name=name, path__handle=holder(kind, name, take, extra))
    for method in ["GET", "DELETE"]:
        name = f"fx{run}-elections-{method.lower()}"
        bind(f"{method} /v1/elections/{{name}}/candidates/{{handle}}", path__name=name, path__handle=holder("elections", name, "campaign"))
    # Bodies get their ids from scripts/schemathesis_hooks.py (in every phase).
    leader = holder("elections", f"fx{run}-lead", "campaign")
    bind("PUT /v1/elections/{name}/leader", path__name=f"fx{run}-lead")
    for verb in ["ack", "nack"]:
        bind(f"POST /v1/queues/{{name}}/claims/{{claim}}/{verb}", path__name=f"fx{run}-{verb}", path__claim=claim(f"fx{run}-{verb}"))
    call(base, "POST", "/v1/txns", {"id": f"fx{run}-txn", "participants": ["p"], "deadline": "24h"})
    bind("PUT /v1/txns/{id}/participants/{participant}", path__id=f"fx{run}-txn", path__participant="p")
    request = urllib.request.Request(f"{base}/v1/kv/fx{run}-key", data=b"v", method="PUT")
    request.add_header("content-type", "text/plain")
    urllib.request.urlopen(request, timeout=30).close()
    bind("DELETE /v1/kv/{key}", path__key=f"fx{run}-key")
    call(base, "POST", f"/v1/counters/fx{run}-counter/add", {"delta": 1})
    bind("DELETE /v1/counters/{name}", path__name=f"fx{run}-counter")
    for method in ["GET", "DELETE"]:
        service, instance = f"fx{run}-svc", f"fx{run}-{method.lower()}"
        body = {"address": "10.0.0.5", "port": 8080, "lease": lease()}
        call(base, "PUT", f"/v1/services/{service}/instances/{instance}", body)
        bind(f"{method} /v1/services/{{name}}/instances/{{id}}", path__name=service, path__id=instance)
    bind("GET /v1/services/{name}/pick", path__name=f"fx{run}-svc")
    for method in ["GET", "DELETE"]:
        names = [f"fx{run}-set-{method.lower()}-{n}" for n in "ab"]
        taken = call(base, "POST", "/v1/lock-sets?wait=0", {"locks": names, "lease": lease()})
        bind(f"{method} /v1/lock-sets/{{set}}", path__set=taken["set"])

    leases = [lease() for _ in range(8)]
    fixtures = {"instance": leases[0].split("-")[0], "leases": leases, "leader": leader}
    with open(os.path.join(os.path.dirname(out), "schemathesis-fixtures.json"), "w", encoding="utf-8") as f:
        json.dump(fixtures, f)
    lines = [
        "# Written by scripts/schemathesis_fixtures.py for one run: real ids for the operations",
        "# that act on things zkgate issued.",
        'hooks = "scripts/schemathesis_hooks.py"',
        "[warnings]",
        '# A run in which an operation refuses almost everything generated fails.',
        'fail-on = ["validation_mismatch"]',
        "",
    ]
    for operation, parameters in bindings:
        lines += ["[[operations]]", f"include-name = {json.dumps(operation)}"]
        lines.append("[operations.parameters]")
        lines += [f"{json.dumps(parameter)} = {json.dumps(value)}" for parameter, value in parameters.items()]
        lines.append("")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"schemathesis fixtures: {len(bindings)} operations bound ({out})")


if __name__ == "__main__":
    main()
