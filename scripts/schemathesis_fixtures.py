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
A thing that an operation's success uses up (a delete, an ack, a replay, a vote: RENEWED below)
would serve one request, often a negative case the server serves anyway, and leave the rest
404: the hooks make a new one, as this script made the first, after each call answered 2xx.

  scripts/schemathesis_fixtures.py http://127.0.0.1:PORT target/schemathesis.toml
"""

import json
import os
import sys
import uuid
import urllib.error
import urllib.request

# The conditional writes, left out of the coverage phase only (the examples, fuzzing and
# stateful phases still try them, with the current ETag swapped in by the hooks): its cases with
# an optional header give the header a placeholder (`If-Match: 0`, `If-None-Match: 0`) that
# breaks the header's pattern yet count as valid data, so every one is refused (400, or 412 for
# a version nobody has), rightly, and schemathesis 4.32 then warns that the operation refuses
# all valid data.
NO_COVERAGE = [
    "PUT /v1/counters/{name}",
    "DELETE /v1/counters/{name}",
    "PUT /v1/kv/{key}",
    "DELETE /v1/kv/{key}",
]


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


class Maker:
    """Makes real things on the zkgate at `base`, under names of the run `run`."""

    def __init__(self, base, run):
        self.base, self.run = base, run

    def call(self, method, path, body=None, expect=(200, 201, 202, 204)):
        return call(self.base, method, path, body, expect)

    def lease(self):
        return self.call("POST", "/v1/leases", {"ttl": "30m"})["id"]

    def grant(self, kind, name, path="acquire", extra=""):
        """The answer granting (or queueing) a contender on `name` of `kind`, with a lease of its own."""
        url = f"/v1/{kind}/{name}/{path}?wait=0&keep_queued=true{extra}"
        return self.call("POST", url, {"lease": self.lease()})

    def holder(self, kind, name, path="acquire", extra=""):
        """A handle of the resource `name` of `kind`, with a lease of its own."""
        return self.grant(kind, name, path, extra)["handle"]

    def claim(self, queue):
        self.call("POST", f"/v1/queues/{queue}/items", {"fixture": queue})
        # A take that moves an item given back too often to the dead letters may answer 204.
        for _ in range(10):
            taken = self.call("POST", f"/v1/queues/{queue}/take?wait=0&ack_deadline=30m")
            if taken is not None:
                return taken["claim"]
        sys.exit(f"fixture: queue {queue} gave no claim")

    def dead_letter(self, queue):
        """An item of `queue` (a new one) among its dead letters: taken and given back until
        the queue stops delivering it (--queue-max-deliveries, 5 by default)."""
        self.call("POST", f"/v1/queues/{queue}/items", {"fixture": queue})
        for _ in range(100):
            taken = self.call("POST", f"/v1/queues/{queue}/take?wait=0&ack_deadline=30m")
            if taken is None:  # 204: the item went to the dead letters instead
                return self.call("GET", f"/v1/queues/{queue}/dead-letters")[0]["item"]
            self.call("POST", f"/v1/queues/{queue}/claims/{taken['claim']}/nack")
        sys.exit(f"fixture: queue {queue} delivered its item 100 times")

    def kv(self, key):
        request = urllib.request.Request(f"{self.base}/v1/kv/{key}", data=b"v", method="PUT")
        request.add_header("content-type", "text/plain")
        urllib.request.urlopen(request, timeout=30).close()


# Operations whose success uses their thing up (a delete, an ack, a replay, a vote): a request served
# leaves the next ones nothing but 404 (or 410), and a negative case the server serves anyway
# (an unknown header, a query parameter it ignores) uses it up before any positive case is sent.
# For each, how to make one: `(maker, n)` -> its path parameters, `n` counting the ones made.
# The first is bound in the config; scripts/schemathesis_hooks.py makes the next after each
# call answered 2xx and puts it in the following requests' paths.
def _renewed():
    ops = {}

    def lease(m, n):
        return {"id": m.lease()}

    ops["DELETE /v1/leases/{id}"] = lease
    for kind, take in [("locks", "acquire"), ("rwlocks", "read"), ("semaphores", "acquire")]:
        noun = "permits" if kind == "semaphores" else "handles"
        extra = "&permits=8" if kind == "semaphores" else ""

        def handle(m, n, kind=kind, take=take, extra=extra):
            name = f"fx{m.run}-{kind}-delete"
            return {"name": name, "handle": m.holder(kind, name, take, extra)}

        ops[f"DELETE /v1/{kind}/{{name}}/{noun}/{{handle}}"] = handle

    def candidate(m, n):
        name = f"fx{m.run}-elections-delete"
        return {"name": name, "handle": m.holder("elections", name, "campaign")}

    ops["DELETE /v1/elections/{name}/candidates/{handle}"] = candidate
    for verb in ["ack", "nack", "extend"]:

        def settle(m, n, verb=verb):
            name = f"fx{m.run}-{verb}"
            return {"name": name, "claim": m.claim(name)}

        ops[f"POST /v1/queues/{{name}}/claims/{{claim}}/{verb}"] = settle
    for path in ["dead-letters", "dead"]:

        def replay(m, n, path=path):
            # A queue of its own each time: the item replayed is back in its queue, where it
            # would be taken again before a new one.
            name = f"fx{m.run}-replay-{path}-{n}"
            return {"name": name, "item": m.dead_letter(name)}

        ops[f"POST /v1/queues/{{name}}/{path}/{{item}}/replay"] = replay

    def key(m, n):
        m.kv(f"fx{m.run}-key")
        return {"key": f"fx{m.run}-key"}

    ops["DELETE /v1/kv/{key}"] = key

    def counter(m, n):
        m.call("POST", f"/v1/counters/fx{m.run}-counter/add", {"delta": 1})
        return {"name": f"fx{m.run}-counter"}

    ops["DELETE /v1/counters/{name}"] = counter

    def instance(m, n):
        service, instance = f"fx{m.run}-svc", f"fx{m.run}-delete"
        body = {"address": "10.0.0.5", "port": 8080, "lease": m.lease()}
        m.call("PUT", f"/v1/services/{service}/instances/{instance}", body)
        return {"name": service, "id": instance}

    ops["DELETE /v1/services/{name}/instances/{id}"] = instance

    def lock_set(m, n):
        names = [f"fx{m.run}-set-delete-{x}" for x in "ab"]
        return {"set": m.call("POST", "/v1/lock-sets?wait=0", {"locks": names, "lease": m.lease()})["set"]}

    ops["DELETE /v1/lock-sets/{set}"] = lock_set

    def barrier(m, n):
        m.call("PUT", f"/v1/barriers/fx{m.run}-barrier")
        return {"name": f"fx{m.run}-barrier"}

    ops["DELETE /v1/barriers/{name}"] = barrier

    def member(m, n):
        group, member = f"fx{m.run}-group", f"fx{m.run}-delete"
        m.call("PUT", f"/v1/groups/{group}/members/{member}", {"lease": m.lease()})
        return {"group": group, "member": member}

    ops["DELETE /v1/groups/{group}/members/{member}"] = member

    def voter(m, n):
        # A vote is final (another is refused, and so is any once the transaction is decided):
        # a transaction of its own each time, whose "p" has registered and not voted ("q" never
        # votes, so that a commit leaves it undecided).
        txn = f"fx{m.run}-vote-{n}"
        m.call("POST", "/v1/txns", {"id": txn, "participants": ["p", "q"], "deadline": "24h"})
        m.call("PUT", f"/v1/txns/{txn}/participants/p", {"lease": m.lease()})
        return {"id": txn, "participant": "p"}

    ops["POST /v1/txns/{id}/participants/{participant}/vote"] = voter

    def registrant(m, n):
        # A participant registers once (with its lease; another lease is refused, 409): a
        # transaction of its own each time, whose "p" has not registered yet.
        txn = f"fx{m.run}-register-{n}"
        m.call("POST", "/v1/txns", {"id": txn, "participants": ["p"], "deadline": "24h"})
        return {"id": txn, "participant": "p"}

    ops["PUT /v1/txns/{id}/participants/{participant}"] = registrant
    return ops


RENEWED = _renewed()


def main():
    base, out = sys.argv[1], sys.argv[2]
    # Names of this run's own (a run may be tried again on the same instance).
    run = uuid.uuid4().hex[:6]
    m = Maker(base, run)
    lease, holder = m.lease, m.holder

    # (operation, {parameter: value})
    bindings = []

    def bind(operation, **parameters):
        bindings.append((operation, {k.replace("__", "."): v for k, v in parameters.items()}))

    renewed = {}
    for operation, make in RENEWED.items():
        renewed[operation] = make(m, 0)
        bind(operation, **{f"path__{k}": v for k, v in renewed[operation].items()})
    bind("GET /v1/leases/{id}", path__id=lease())
    bind("POST /v1/leases/{id}/keepalive", path__id=lease())
    for kind, take in [("locks", "acquire"), ("rwlocks", "read"), ("semaphores", "acquire")]:
        noun = "permits" if kind == "semaphores" else "handles"
        extra = "&permits=8" if kind == "semaphores" else ""
        name = f"fx{run}-{kind}-get"
        bind(f"GET /v1/{kind}/{{name}}/{noun}/{{handle}}", path__name=name, path__handle=holder(kind, name, take, extra))
    # A fencing check answers 404 `not-held` unless someone holds the thing (leads the
    # election): a holder of its own, and its token (its term).
    for kind, take, token in [("locks", "acquire", "fencing_token"), ("rwlocks", "read", "fencing_token"), ("elections", "campaign", "term")]:
        name = f"fx{run}-{kind}-fencing"
        bind(f"GET /v1/{kind}/{{name}}/fencing/{{token}}", path__name=name, path__token=m.grant(kind, name, take)[token])
    name = f"fx{run}-elections-get"
    bind("GET /v1/elections/{name}/candidates/{handle}", path__name=name, path__handle=holder("elections", name, "campaign"))
    # Bodies get their ids from scripts/schemathesis_hooks.py (in every phase).
    leader = holder("elections", f"fx{run}-lead", "campaign")
    bind("PUT /v1/elections/{name}/leader", path__name=f"fx{run}-lead")
    service, instance = f"fx{run}-svc", f"fx{run}-get"
    body = {"address": "10.0.0.5", "port": 8080, "lease": lease()}
    call(base, "PUT", f"/v1/services/{service}/instances/{instance}", body)
    bind("GET /v1/services/{name}/instances/{id}", path__name=service, path__id=instance)
    bind("GET /v1/services/{name}/pick", path__name=f"fx{run}-svc")
    names = [f"fx{run}-set-get-{n}" for n in "ab"]
    taken = call(base, "POST", "/v1/lock-sets?wait=0", {"locks": names, "lease": lease()})
    bind("GET /v1/lock-sets/{set}", path__set=taken["set"])

    leases = [lease() for _ in range(8)]
    fixtures = {
        "instance": leases[0].split("-")[0],
        "leases": leases,
        "leader": leader,
        "base": base,
        "run": run,
        "renewed": renewed,
    }
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
    bound = dict(bindings)
    for operation in list(bound) + [o for o in NO_COVERAGE if o not in bound]:
        lines += ["[[operations]]", f"include-name = {json.dumps(operation)}"]
        if operation in NO_COVERAGE:
            lines += ["[operations.phases.coverage]", "enabled = false"]
        if bound.get(operation):
            lines.append("[operations.parameters]")
            lines += [f"{json.dumps(parameter)} = {json.dumps(value)}" for parameter, value in bound[operation].items()]
        lines.append("")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"schemathesis fixtures: {len(bindings)} operations bound ({out})")


if __name__ == "__main__":
    main()
