// The flow every generated TypeScript client drives (scripts/clients.sh), the same steps as
// tests/clients/python_flow.py: two leases; a lock taken with the first (handle, fencing token
// > 0); the second lease is refused at once (409, a problem document); release, then the second
// lease takes it with a greater token; a write guarded by a lock (`ZKGATE-Guard`) that lands,
// then is refused once the lock is released; a queue item put, taken (claimed) and acknowledged; a
// counter added to, and refused past its bound; a campaign that leads, read back as the
// election's leader; a key bound to the lease, refused to a plain write; a transaction that
// writes two keys at once, then finds its compare fails; the leases deleted, and the key gone
// with them.
//
// Each client is a `Client`: one small adapter per generator (openapi-fetch.ts, orval.ts,
// typescript-fetch.ts) that calls only what its generator wrote from the served spec and hands
// back what came over the wire. The adapters are type-checked strictly against their generated
// code, so a spec change a generator cannot follow fails that client's type check; the flow then
// checks the answers themselves. What a generator cannot express because of the spec is a defect
// of the spec, to be fixed where the spec is made (src/), not worked around in an adapter.
//
// Names carry a random suffix, so runs never collide. A failed step is reported, the steps that
// do not depend on it still run, and the exit status is 1 if any failed.
import { randomUUID } from "node:crypto";
import { isDeepStrictEqual } from "node:util";

/** One answer as the client saw it: its status, content type, and the body its generator parsed. */
export interface Answer<T> {
    status: number;
    contentType: string;
    /** The success body, as the generated code typed it (absent for 204 and for errors). */
    body?: T | undefined;
    /** The error body, a problem document as the generated code typed it. */
    problem?: Problem | undefined;
}

/** The same answer with its success body turned into the flow's shape. */
export function mapped<T, U>(answer: Answer<T>, map: (body: Exclude<T, void | undefined | null>) => U): Answer<U> {
    const body = answer.body;
    const present = (b: T | undefined): b is Exclude<T, void | undefined | null> => b !== undefined && b !== null;
    return { ...answer, body: present(body) ? map(body) : undefined };
}

export interface Problem {
    type: string;
    title: string;
    status: number;
    detail: string;
}

export interface Lease {
    id: string;
    ttlMs: number;
    lockDelayMs?: number | null | undefined;
    holdings: unknown[];
}

export interface Acquisition {
    acquired: boolean;
    lock: string;
    lease: string;
    fencingToken?: number | null | undefined;
    handle: string;
}

export interface Stored {
    item?: string | null | undefined;
    duplicate: boolean;
}

/** What a take answered: one item, or a batch (which this flow never asks for). */
export type Taken =
    | { batch: true }
    | { batch: false; item: string; body?: unknown; contentType: string; deliveries: number; claim?: string | null | undefined };

/** A take's answer as the generators that keep the wire's names type it: the flow's `Taken`. */
export function taken(
    answer:
        | { items: unknown[] }
        | { item: string; body?: unknown; content_type: string; deliveries: number; claim?: string | null },
): Taken {
    if ("items" in answer) return { batch: true };
    const { item, body, content_type, deliveries, claim } = answer;
    return { batch: false, item, body, contentType: content_type, deliveries, claim };
}

export interface Added {
    previous: number;
    value: number;
}

export interface Candidacy {
    leader: boolean;
    term?: number | null | undefined;
    node?: string | null | undefined;
}

export interface Election {
    leader?: { lease?: string | null | undefined; node: string; term: number; value?: unknown } | null | undefined;
    candidateCount: number;
}

/** A transaction's answer. */
export interface TxnAnswer {
    succeeded: boolean;
    repeated: boolean;
    results: { put?: string | null | undefined; get?: string | null | undefined; text?: string | null | undefined }[];
}

/** A kv write's answer. */
export interface Written {
    key: string;
    created: boolean;
    lease?: string | null | undefined;
}

export interface Change {
    delta: number;
    min?: number;
    max?: number;
}

/** The operations the flow needs, each one call of the generated client. */
export interface Client {
    /** With a lock-delay when `lockDelay` is given. */
    createLease(ttl: string, lockDelay?: string): Promise<Answer<Lease>>;
    /** Acquire without waiting (`wait=0`). */
    acquireLock(lock: string, lease: string): Promise<Answer<Acquisition>>;
    releaseLock(lock: string, handle: string): Promise<Answer<void>>;
    put(queue: string, item: Record<string, unknown>): Promise<Answer<Stored>>;
    take(queue: string, wait: string, ackDeadline?: string): Promise<Answer<Taken>>;
    ack(queue: string, claim: string): Promise<Answer<void>>;
    add(counter: string, change: Change): Promise<Answer<Added>>;
    /** Campaign, waiting up to 5 s to lead. */
    campaign(election: string, lease: string, value: Record<string, unknown>): Promise<Answer<Candidacy>>;
    election(election: string): Promise<Answer<Election>>;
    deleteLease(id: string): Promise<Answer<void>>;
    /** `PUT /v1/kv/{key}` with a JSON value, bound to `lease` when one is given, guarded by
     * `guard` (`ZKGATE-Guard`) when one is given. */
    putKey(key: string, value: Record<string, unknown>, lease?: string, guard?: string): Promise<Answer<Written>>;
    /** `POST /v1/kv-txn`: if `key` is absent, put `key` and `marker` (text), and get `key`. */
    txnCreate(key: string, marker: string, text: string): Promise<Answer<TxnAnswer>>;
}

class StepFailed extends Error {}

function check(condition: boolean, message: string): asserts condition {
    if (!condition) throw new StepFailed(message);
}

function describe(answer: Answer<unknown>): string {
    return `${answer.status} ${answer.contentType}: ${JSON.stringify(answer.problem ?? answer.body)}`;
}

// The answer has this status and a body.
function ok<T>(what: string, status: number, answer: Answer<T>): NonNullable<T> {
    check(answer.status === status, `${what}: expected ${status}, got ${describe(answer)}`);
    const body = answer.body;
    check(body !== undefined && body !== null, `${what}: no body`);
    return body;
}

// The answer has this status and no body.
function noContent(what: string, status: number, answer: Answer<unknown>): void {
    check(answer.status === status, `${what}: expected ${status}, got ${describe(answer)}`);
}

// The answer is this error status, and its body is a problem document.
function problem(what: string, status: number, answer: Answer<unknown>): Problem {
    check(answer.status === status, `${what}: expected ${status}, got ${describe(answer)}`);
    check(answer.contentType.startsWith("application/problem+json"), `${what}: content type ${answer.contentType}`);
    const p = answer.problem;
    check(p !== undefined, `${what}: no problem body`);
    check(p.status === status, `${what}: problem status ${p.status}`);
    check(p.title.length > 0 && p.detail.length > 0, `${what}: empty title or detail: ${JSON.stringify(p)}`);
    return p;
}

/** Runs the flow through `client`, prints one line per step, and exits 1 if any step failed. */
export async function runFlow(name: string, client: Client): Promise<never> {
    const run = randomUUID().slice(0, 8);
    const passed: string[] = [];
    const failed: string[] = [];

    async function step(title: string, needs: string[], body: () => Promise<void>): Promise<void> {
        const missing = needs.filter((n) => !passed.includes(n));
        if (missing.length > 0) {
            console.log(`SKIP ${title}: needs ${missing.join(", ")}`);
            failed.push(title);
            return;
        }
        try {
            await body();
        } catch (e) {
            console.log(`FAIL ${title}: ${e instanceof StepFailed ? e.message : ((e as Error).stack ?? e)}`);
            failed.push(title);
            return;
        }
        console.log(`ok   ${title}`);
        passed.push(title);
    }

    let lease = "";
    let other = "";
    const lock = `flow-lock-${run}`;
    let handle = "";
    let token = 0;

    await step("create two leases", [], async () => {
        const ids: string[] = [];
        for (let i = 0; i < 2; i++) {
            // The second asks for a lock-delay, which its view says.
            const delay = i === 1 ? "5s" : undefined;
            const created = ok("POST /v1/leases", 201, await client.createLease("20s", delay));
            check(created.ttlMs === 20_000, `ttl_ms ${created.ttlMs}`);
            const delayMs = created.lockDelayMs ?? null;
            check(delayMs === (i === 1 ? 5_000 : null), `lock_delay_ms ${delayMs}`);
            check(created.holdings.length === 0, `a new lease holds ${JSON.stringify(created.holdings)}`);
            ids.push(created.id);
        }
        [lease, other] = ids as [string, string];
    });

    await step("acquire a lock with the lease", ["create two leases"], async () => {
        const got = ok("POST /v1/locks/{name}/acquire", 200, await client.acquireLock(lock, lease));
        check(got.acquired, `acquired ${got.acquired}`);
        check(got.lock === lock, `lock ${got.lock}`);
        check(got.lease === lease, `held with lease ${got.lease}, not ours`);
        check(typeof got.fencingToken === "number" && got.fencingToken > 0, `fencing token ${got.fencingToken}`);
        check(got.handle.length > 0, "no handle");
        handle = got.handle;
        token = got.fencingToken;
    });

    await step("a second lease is refused at once (409 problem)", ["acquire a lock with the lease"], async () => {
        const p = problem("second POST /v1/locks/{name}/acquire", 409, await client.acquireLock(lock, other));
        check(p.type === "urn:zkgate:problem:lock-not-acquired", `problem type ${p.type}`);
    });

    await step(
        "release the lock; the other lease takes it, with a greater token",
        ["acquire a lock with the lease"],
        async () => {
            noContent("DELETE /v1/locks/{name}/handles/{handle}", 204, await client.releaseLock(lock, handle));
            const got = ok("POST /v1/locks/{name}/acquire after the release", 200, await client.acquireLock(lock, other));
            check(got.acquired && got.lease === other, `not granted to the other lease: ${JSON.stringify(got)}`);
            check(
                typeof got.fencingToken === "number" && got.fencingToken > token,
                `token ${got.fencingToken} not above ${token}`,
            );
            noContent("DELETE /v1/locks/{name}/handles/{handle} (other lease)", 204, await client.releaseLock(lock, got.handle));
        },
    );

    await step("a write guarded by a lock lands while it is held, not once it is released", ["create two leases"], async () => {
        const guarded = `${lock}-guarded`;
        const got = ok("POST /v1/locks/{name}/acquire (guard)", 200, await client.acquireLock(guarded, lease));
        const guard = `lock/${guarded}; handle=${got.handle}`;
        const key = `flow/guarded-${run}`;
        const written = ok("PUT /v1/kv/{key} guarded", 201, await client.putKey(key, { v: 1 }, undefined, guard));
        check(written.created, `written ${JSON.stringify(written)}`);
        noContent("DELETE /v1/locks/{name}/handles/{handle} (guard)", 204, await client.releaseLock(guarded, got.handle));
        const refused = problem("PUT /v1/kv/{key} with a released guard", 409, await client.putKey(key, { v: 2 }, undefined, guard));
        check(refused.type === "urn:zkgate:problem:guard-lost", `problem type ${refused.type}`);
    });

    const queue = `flow-queue-${run}`;
    const itemBody = { to: "ada@example.com", run };
    let item = "";
    let claim = "";

    await step("put an item on a queue", [], async () => {
        const stored = ok("POST /v1/queues/{name}/items", 201, await client.put(queue, itemBody));
        check(stored.duplicate === false, "a first put is reported a duplicate");
        check(typeof stored.item === "string" && stored.item.length > 0, `item ${stored.item}`);
        item = stored.item;
    });

    await step("take (claim) it", ["put an item on a queue"], async () => {
        const taken = ok("POST /v1/queues/{name}/take", 200, await client.take(queue, "5s", "30s"));
        check(!taken.batch, `one take answered a batch: ${JSON.stringify(taken)}`);
        check(taken.item === item, `took ${taken.item}, not ${item}`);
        check(isDeepStrictEqual(taken.body, itemBody), `body ${JSON.stringify(taken.body)}`);
        check(taken.contentType.startsWith("application/json"), `content type ${taken.contentType}`);
        check(taken.deliveries === 1, `deliveries ${taken.deliveries}`);
        check(typeof taken.claim === "string" && taken.claim.length > 0, `claim ${taken.claim}`);
        claim = taken.claim;
    });

    await step("ack it; the queue is then empty", ["take (claim) it"], async () => {
        noContent("POST /v1/queues/{name}/claims/{claim}/ack", 204, await client.ack(queue, claim));
        noContent("POST /v1/queues/{name}/take on the empty queue", 204, await client.take(queue, "0"));
    });

    const counter = `flow-counter-${run}`;

    await step("add to a counter", [], async () => {
        const first = ok("POST /v1/counters/{name}/add", 200, await client.add(counter, { delta: 5 }));
        check(first.previous === 0 && first.value === 5, `previous ${first.previous}, value ${first.value}`);
        const second = ok("second POST /v1/counters/{name}/add", 200, await client.add(counter, { delta: -2, min: 0 }));
        check(second.previous === 5 && second.value === 3, `previous ${second.previous}, value ${second.value}`);
        const refused = problem("POST /v1/counters/{name}/add past max", 409, await client.add(counter, { delta: 1, max: 3 }));
        check(refused.type === "urn:zkgate:problem:out-of-bounds", `problem type ${refused.type}`);
    });

    const election = `flow-election-${run}`;

    await step("campaign, and read the leader back", ["create two leases"], async () => {
        const value = { host: "flow", port: 8080 };
        const won = ok("POST /v1/elections/{name}/campaign", 200, await client.campaign(election, lease, value));
        check(won.leader, `leader ${won.leader}`);
        check(typeof won.term === "number" && won.term > 0, `term ${won.term}`);
        const read = ok("GET /v1/elections/{name}", 200, await client.election(election));
        const leader = read.leader;
        check(leader !== undefined && leader !== null, `no leader: ${JSON.stringify(read)}`);
        check(leader.lease === lease, `leader's lease ${leader.lease}, not ours`);
        check(leader.node === won.node, `leader node ${leader.node}, ours ${won.node}`);
        check(leader.term === won.term, `leader term ${leader.term}, ours ${won.term}`);
        check(isDeepStrictEqual(leader.value, value), `leader value ${JSON.stringify(leader.value)}`);
        check(read.candidateCount === 1, `${read.candidateCount} candidates`);
    });

    const key = `flow/worker-${run}`;

    await step("bind a key to the lease", ["create two leases"], async () => {
        const bound = ok("PUT /v1/kv/{key}?lease=", 201, await client.putKey(key, { addr: "10.0.0.7:8080" }, lease));
        check(bound.created && bound.lease === lease, `written ${JSON.stringify(bound)}`);
        const refused = problem("PUT /v1/kv/{key} over the bound key", 409, await client.putKey(key, { addr: "other" }));
        check(refused.type === "urn:zkgate:problem:key-bound", `problem type ${refused.type}`);
    });

    await step("a transaction writes two keys at once, then only once", [], async () => {
        const first = ok("POST /v1/kv-txn", 200, await client.txnCreate(`${key}-txn`, `${key}-marker`, "first"));
        check(first.succeeded && !first.repeated, `answer ${JSON.stringify(first)}`);
        check(first.results.length === 3 && first.results[2]?.text === "first", `results ${JSON.stringify(first.results)}`);
        const again = ok("POST /v1/kv-txn again", 200, await client.txnCreate(`${key}-txn`, `${key}-marker`, "second"));
        check(!again.succeeded && again.results[0]?.get === `${key}-txn`, `answer ${JSON.stringify(again)}`);
    });

    await step("delete the leases", ["create two leases"], async () => {
        for (const id of [lease, other]) {
            noContent("DELETE /v1/leases/{id}", 204, await client.deleteLease(id));
        }
    });

    await step("the bound key ended with its lease", ["bind a key to the lease", "delete the leases"], async () => {
        const again = ok("PUT /v1/kv/{key} after the lease's end", 201, await client.putKey(key, { addr: "plain" }));
        check(again.created && (again.lease ?? null) === null, `written ${JSON.stringify(again)}`);
    });

    console.log(`${name}: ${passed.length} passed, ${failed.length} failed`);
    process.exit(failed.length > 0 ? 1 : 0);
}

/** The server's URL, the one argument of every client's flow. */
export function serverUrl(): string {
    const url = process.argv[2];
    if (!url) {
        console.error("usage: node dist/<client>.js ZKGATE_URL");
        process.exit(2);
    }
    return url;
}
