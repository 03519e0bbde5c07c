"""A real flow through the Python client that openapi-python-client generates from the served
spec (scripts/clients.sh generates it into target/clients/python and installs it into its venv).

    python tests/clients/python_flow.py http://127.0.0.1:PORT

Only the generated, typed API is used: no hand-made HTTP call, no edit of generated code. What
the generator cannot express because of the spec is a defect of the spec, to be fixed where the
spec is made (src/), not worked around here: a step it blocks is written as it should work and
fails until then.

Steps: two leases; a lock taken with the first (handle, fencing token > 0); the second lease is
refused at once (409, a parsed Problem); release, then the second lease takes it with a greater
token; a write guarded by a lock (`ZKGATE-Guard`) that lands, then is refused once the lock is
released; a queue item put, taken (claimed) and acknowledged; a counter added to; a campaign that
leads, read back as the election's leader; a key bound to the lease, refused to a plain write,
gone with the lease; a transaction that writes two keys at once, then finds its compare fails
(the steps of tests/clients/typescript/flow.ts).
Names carry a random suffix, so runs never collide. Each step says what it checked; a failed
step is reported, the steps that do not depend on it still run, and the exit status is 1 if any
failed.
"""

from __future__ import annotations

import os
import sys
import traceback
import uuid
from http import HTTPStatus
from typing import Any, Callable

from zkgate_client import AuthenticatedClient, Client
from zkgate_client.api.counters import add_to_counter as counter_add
from zkgate_client.api.elections import campaign, election_state
from zkgate_client.api.kv import put_value, transaction
from zkgate_client.api.leases import create_lease, delete_lease
from zkgate_client.api.locks import acquire_lock, release_lock
from zkgate_client.api.queues import ack, put, take
from zkgate_client.models import (
    Acquisition,
    AcquireBodyWithLease,
    AddBody,
    AddResult,
    CampaignBodyWithLease,
    Candidacy,
    CreateLease,
    Delivery,
    ElectionState,
    LeaderView,
    LeaseView,
    CompareBody,
    Problem,
    StepBody,
    Stored,
    TxnAnswer,
    TxnRequest,
    Written,
)


class StepFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def expect(response: Any, status: HTTPStatus, parsed_type: type | None, what: str) -> Any:
    """The answer has this status and parsed into this generated type (None: no body)."""
    check(
        response.status_code == status,
        f"{what}: expected {int(status)}, got {int(response.status_code)}: {response.content[:500]!r}",
    )
    if parsed_type is not None:
        check(
            isinstance(response.parsed, parsed_type),
            f"{what}: the answer parsed into {type(response.parsed).__name__}, not {parsed_type.__name__}",
        )
    return response.parsed


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} ZKGATE_URL", file=sys.stderr)
        return 2
    # A bearer token is optional in the spec (a zkgate without --auth-config takes none): the
    # plain client, or the authenticated one when a token is given.
    token = os.environ.get("ZKGATE_TOKEN")
    client: Client | AuthenticatedClient = (
        AuthenticatedClient(base_url=sys.argv[1], token=token, raise_on_unexpected_status=True)
        if token
        else Client(base_url=sys.argv[1], raise_on_unexpected_status=True)
    )
    run = uuid.uuid4().hex[:8]
    state: dict[str, Any] = {}
    failed: list[str] = []
    passed: list[str] = []

    def step(name: str, needs: tuple[str, ...] = ()) -> Callable[[Callable[[], None]], None]:
        def run_step(body: Callable[[], None]) -> None:
            missing = [n for n in needs if n not in passed]
            if missing:
                print(f"SKIP {name}: needs {', '.join(missing)}")
                failed.append(name)
                return
            try:
                body()
            except StepFailed as e:
                print(f"FAIL {name}: {e}")
                failed.append(name)
                return
            except Exception:  # a generated client that raises is a failure too, with its trace
                print(f"FAIL {name}: the generated client raised:")
                traceback.print_exc(file=sys.stdout)
                failed.append(name)
                return
            print(f"ok   {name}")
            passed.append(name)

        return run_step

    @step("create two leases")
    def _() -> None:
        for key in ("lease", "other"):
            # The second asks for a lock-delay, which its view says.
            body = CreateLease(ttl="20s", lock_delay="5s") if key == "other" else CreateLease(ttl="20s")
            lease = expect(
                create_lease.sync_detailed(client=client, body=body),
                HTTPStatus.CREATED,
                LeaseView,
                "POST /v1/leases",
            )
            check(lease.ttl_ms == 20_000, f"ttl_ms is {lease.ttl_ms}, not 20000")
            delay = lease.lock_delay_ms if isinstance(lease.lock_delay_ms, int) else None
            check(delay == (5_000 if key == "other" else None), f"lock_delay_ms is {lease.lock_delay_ms!r}")
            check(lease.holdings == [], f"a new lease holds {lease.holdings}")
            state[key] = lease.id

    lock = f"flow-lock-{run}"

    @step("acquire a lock with the lease", needs=("create two leases",))
    def _() -> None:
        got = expect(
            acquire_lock.sync_detailed(lock, client=client, body=AcquireBodyWithLease(lease=state["lease"]), wait="0"),
            HTTPStatus.OK,
            Acquisition,
            "POST /v1/locks/{name}/acquire",
        )
        check(got.acquired is True, f"acquired is {got.acquired}")
        check(got.lock == lock, f"lock is {got.lock!r}")
        check(got.lease.id == state["lease"], f"held with lease {got.lease.id}, not ours")
        check(isinstance(got.fencing_token, int) and got.fencing_token > 0, f"fencing token {got.fencing_token!r}")
        check(bool(got.handle), "no handle")
        state["handle"], state["token"] = got.handle, got.fencing_token

    @step("a second lease is refused at once (409 problem)", needs=("acquire a lock with the lease",))
    def _() -> None:
        problem = expect(
            acquire_lock.sync_detailed(lock, client=client, body=AcquireBodyWithLease(lease=state["other"]), wait="0"),
            HTTPStatus.CONFLICT,
            Problem,
            "second POST /v1/locks/{name}/acquire",
        )
        check(problem.status == 409, f"problem status {problem.status}")
        check(problem.type_ == "urn:zkgate:problem:lock-not-acquired", f"problem type {problem.type_!r}")
        check(bool(problem.title) and bool(problem.detail), f"empty title or detail: {problem!r}")

    @step("release the lock; the other lease takes it, with a greater token", needs=("acquire a lock with the lease",))
    def _() -> None:
        expect(
            release_lock.sync_detailed(lock, state["handle"], client=client),
            HTTPStatus.NO_CONTENT,
            None,
            "DELETE /v1/locks/{name}/handles/{handle}",
        )
        got = expect(
            acquire_lock.sync_detailed(lock, client=client, body=AcquireBodyWithLease(lease=state["other"]), wait="0"),
            HTTPStatus.OK,
            Acquisition,
            "POST /v1/locks/{name}/acquire after the release",
        )
        check(got.acquired is True and got.lease.id == state["other"], f"not granted to the other lease: {got!r}")
        token = got.fencing_token
        check(isinstance(token, int) and token > state["token"], f"token {token!r} not above {state['token']}")
        expect(
            release_lock.sync_detailed(lock, got.handle, client=client),
            HTTPStatus.NO_CONTENT,
            None,
            "DELETE /v1/locks/{name}/handles/{handle} (other lease)",
        )

    @step("a write guarded by a lock lands while it is held, not once it is released", needs=("create two leases",))
    def _() -> None:
        guarded = f"{lock}-guarded"
        got = expect(
            acquire_lock.sync_detailed(guarded, client=client, body=AcquireBodyWithLease(lease=state["lease"]), wait="0"),
            HTTPStatus.OK,
            Acquisition,
            "POST /v1/locks/{name}/acquire (guard)",
        )
        guard = f"lock/{guarded}; handle={got.handle}"
        key = f"flow/guarded-{run}"
        written = expect(
            put_value.sync_detailed(key, client=client, body={"v": 1}, zkgate_guard=guard),
            HTTPStatus.CREATED,
            Written,
            "PUT /v1/kv/{key} guarded",
        )
        check(written.created is True, f"written {written!r}")
        expect(
            release_lock.sync_detailed(guarded, got.handle, client=client),
            HTTPStatus.NO_CONTENT,
            None,
            "DELETE /v1/locks/{name}/handles/{handle} (guard)",
        )
        refused = expect(
            put_value.sync_detailed(key, client=client, body={"v": 2}, zkgate_guard=guard),
            HTTPStatus.CONFLICT,
            Problem,
            "PUT /v1/kv/{key} with a released guard",
        )
        check(refused.type_ == "urn:zkgate:problem:guard-lost", f"problem type {refused.type_}")

    queue = f"flow-queue-{run}"
    item_body = {"to": "ada@example.com", "run": run}

    @step("put an item on a queue")
    def _() -> None:
        stored = expect(
            put.sync_detailed(queue, client=client, body=item_body),
            HTTPStatus.CREATED,
            Stored,
            "POST /v1/queues/{name}/items",
        )
        check(stored.duplicate is False, "a first put is reported a duplicate")
        check(isinstance(stored.item, str) and stored.item != "", f"item {stored.item!r}")
        state["item"] = stored.item

    @step("take (claim) it", needs=("put an item on a queue",))
    def _() -> None:
        delivery = expect(
            take.sync_detailed(queue, client=client, wait="5s", ack_deadline="30s"),
            HTTPStatus.OK,
            Delivery,
            "POST /v1/queues/{name}/take",
        )
        check(delivery.item == state["item"], f"took {delivery.item!r}, not {state['item']!r}")
        check(delivery.body == item_body, f"body {delivery.body!r}")
        check(delivery.content_type.startswith("application/json"), f"content type {delivery.content_type!r}")
        check(delivery.deliveries == 1, f"deliveries {delivery.deliveries}")
        check(isinstance(delivery.claim, str) and delivery.claim != "", f"claim {delivery.claim!r}")
        state["claim"] = delivery.claim

    @step("ack it; the queue is then empty", needs=("take (claim) it",))
    def _() -> None:
        expect(
            ack.sync_detailed(queue, state["claim"], client=client),
            HTTPStatus.NO_CONTENT,
            None,
            "POST /v1/queues/{name}/claims/{claim}/ack",
        )
        expect(
            take.sync_detailed(queue, client=client, wait="0"),
            HTTPStatus.NO_CONTENT,
            None,
            "POST /v1/queues/{name}/take on the empty queue",
        )

    counter = f"flow-counter-{run}"

    @step("add to a counter")
    def _() -> None:
        first = expect(
            counter_add.sync_detailed(counter, client=client, body=AddBody(delta=5)),
            HTTPStatus.OK,
            AddResult,
            "POST /v1/counters/{name}/add",
        )
        check((first.previous, first.value) == (0, 5), f"previous {first.previous}, value {first.value}")
        second = expect(
            counter_add.sync_detailed(counter, client=client, body=AddBody(delta=-2, min_=0)),
            HTTPStatus.OK,
            AddResult,
            "second POST /v1/counters/{name}/add",
        )
        check((second.previous, second.value) == (5, 3), f"previous {second.previous}, value {second.value}")
        refused = expect(
            counter_add.sync_detailed(counter, client=client, body=AddBody(delta=1, max_=3)),
            HTTPStatus.CONFLICT,
            Problem,
            "POST /v1/counters/{name}/add past max",
        )
        check(refused.type_ == "urn:zkgate:problem:out-of-bounds", f"problem type {refused.type_!r}")

    election = f"flow-election-{run}"

    @step("campaign, and read the leader back", needs=("create two leases",))
    def _() -> None:
        value = {"host": "flow", "port": 8080}
        won = expect(
            campaign.sync_detailed(
                election, client=client, body=CampaignBodyWithLease(lease=state["lease"], value=value), wait="5s"
            ),
            HTTPStatus.OK,
            Candidacy,
            "POST /v1/elections/{name}/campaign",
        )
        check(won.leader is True, f"leader is {won.leader}")
        check(isinstance(won.term, int) and won.term > 0, f"term {won.term!r}")
        read = expect(
            election_state.sync_detailed(election, client=client),
            HTTPStatus.OK,
            ElectionState,
            "GET /v1/elections/{name}",
        )
        leader = read.leader
        check(isinstance(leader, LeaderView), f"no leader: {leader!r}")
        assert isinstance(leader, LeaderView)
        check(leader.lease == state["lease"], f"leader's lease {leader.lease!r}, not ours")
        check(leader.node == won.node, f"leader node {leader.node!r}, ours {won.node!r}")
        check(leader.term == won.term, f"leader term {leader.term}, ours {won.term}")
        check(leader.value == value, f"leader value {leader.value!r}")
        check(read.candidate_count == 1, f"{read.candidate_count} candidates")

    key = f"flow/worker-{run}"

    @step("bind a key to the lease", needs=("create two leases",))
    def _() -> None:
        bound = expect(
            put_value.sync_detailed(key, client=client, body={"addr": "10.0.0.7:8080"}, lease=state["lease"]),
            HTTPStatus.CREATED,
            Written,
            "PUT /v1/kv/{key}?lease=",
        )
        check(bound.created is True and bound.lease == state["lease"], f"written {bound!r}")
        refused = expect(
            put_value.sync_detailed(key, client=client, body={"addr": "other"}),
            HTTPStatus.CONFLICT,
            Problem,
            "PUT /v1/kv/{key} over the bound key",
        )
        check(refused.type_ == "urn:zkgate:problem:key-bound", f"problem type {refused.type_}")

    @step("a transaction writes two keys at once, then only once")
    def _() -> None:
        def create(text: str) -> TxnAnswer:
            body = TxnRequest(
                compare=[CompareBody(key=f"{key}-txn", absent=True)],
                then=[
                    StepBody(put=f"{key}-txn", text=text),
                    StepBody(put=f"{key}-marker", text=text),
                    StepBody(get=f"{key}-txn"),
                ],
                else_=[StepBody(get=f"{key}-txn")],
            )
            return expect(transaction.sync_detailed(client=client, body=body), HTTPStatus.OK, TxnAnswer, "POST /v1/kv-txn")

        first = create("first")
        check(first.succeeded is True and first.repeated is False, f"answer {first!r}")
        check(len(first.results) == 3 and first.results[2].text == "first", f"results {first.results!r}")
        again = create("second")
        check(again.succeeded is False and again.results[0].get == f"{key}-txn", f"answer {again!r}")

    @step("delete the leases", needs=("create two leases",))
    def _() -> None:
        for key in ("lease", "other"):
            expect(
                delete_lease.sync_detailed(state[key], client=client),
                HTTPStatus.NO_CONTENT,
                None,
                "DELETE /v1/leases/{id}",
            )

    @step("the bound key ended with its lease", needs=("bind a key to the lease", "delete the leases"))
    def _() -> None:
        again = expect(
            put_value.sync_detailed(key, client=client, body={"addr": "plain"}),
            HTTPStatus.CREATED,
            Written,
            "PUT /v1/kv/{key} after the lease's end",
        )
        check(again.created is True and again.lease is None, f"written {again!r}")

    print(f"python-client: {len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
