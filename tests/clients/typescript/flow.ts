// A real flow through openapi-fetch, typed by what openapi-typescript generates from the served
// spec (scripts/clients.sh writes generated/zkgate.d.ts, type-checks this file strictly with tsc,
// so a spec change that breaks the flow's types fails, then runs it with node):
//
//     node dist/flow.js http://127.0.0.1:PORT
//
// Only the generated paths and types are used: no hand-made HTTP call, no cast of an answer. What
// the generator cannot express because of the spec is a defect of the spec, to be fixed where the
// spec is made (src/), not worked around here: a step it blocks is written as it should work and
// fails until then.
//
// Steps (the same as tests/clients/python_flow.py): two leases; a lock taken with the first
// (handle, fencing token > 0); the second lease is refused at once (409, a Problem); release, then
// the second lease takes it with a greater token; a queue item put, taken (claimed) and
// acknowledged; a counter added to; a campaign that leads, read back as the election's leader.
// Names carry a random suffix, so runs never collide. A failed step is reported, the steps that
// do not depend on it still run, and the exit status is 1 if any failed.
import { randomUUID } from "node:crypto";
import { isDeepStrictEqual } from "node:util";
import createClient from "openapi-fetch";
import type { components, paths } from "./generated/zkgate.js";

type Problem = components["schemas"]["Problem"];

const url = process.argv[2];
if (!url) {
    console.error("usage: node dist/flow.js ZKGATE_URL");
    process.exit(2);
}
const client = createClient<paths>({ baseUrl: url });

class StepFailed extends Error {}

function check(condition: boolean, message: string): asserts condition {
    if (!condition) throw new StepFailed(message);
}

// The answer has this status, and a body parsed into the spec's type (openapi-fetch's `data`).
function ok<T>(what: string, status: number, answer: { data?: T; error?: unknown; response: Response }): NonNullable<T> {
    check(
        answer.response.status === status,
        `${what}: expected ${status}, got ${answer.response.status}: ${JSON.stringify(answer.error ?? answer.data)}`,
    );
    const data = answer.data;
    check(data !== undefined && data !== null, `${what}: no body`);
    return data;
}

// The answer has this status and no body.
function noContent(what: string, status: number, answer: { error?: unknown; response: Response }): void {
    check(
        answer.response.status === status,
        `${what}: expected ${status}, got ${answer.response.status}: ${JSON.stringify(answer.error)}`,
    );
}

// The answer is this error status, and its body is a problem document of the spec's type.
function problem(what: string, status: number, answer: { error?: Problem; response: Response }): Problem {
    check(answer.response.status === status, `${what}: expected ${status}, got ${answer.response.status}`);
    check(
        (answer.response.headers.get("content-type") ?? "").startsWith("application/problem+json"),
        `${what}: content type ${answer.response.headers.get("content-type")}`,
    );
    const p = answer.error;
    check(p !== undefined, `${what}: no problem body`);
    check(p.status === status, `${what}: problem status ${p.status}`);
    check(p.title.length > 0 && p.detail.length > 0, `${what}: empty title or detail: ${JSON.stringify(p)}`);
    return p;
}

const run = randomUUID().slice(0, 8);
const passed: string[] = [];
const failed: string[] = [];

async function step(name: string, needs: string[], body: () => Promise<void>): Promise<void> {
    const missing = needs.filter((n) => !passed.includes(n));
    if (missing.length > 0) {
        console.log(`SKIP ${name}: needs ${missing.join(", ")}`);
        failed.push(name);
        return;
    }
    try {
        await body();
    } catch (e) {
        console.log(`FAIL ${name}: ${e instanceof StepFailed ? e.message : (e as Error).stack ?? e}`);
        failed.push(name);
        return;
    }
    console.log(`ok   ${name}`);
    passed.push(name);
}

let lease = "";
let other = "";
const lock = `flow-lock-${run}`;
let handle = "";
let token = 0;

await step("create two leases", [], async () => {
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) {
        const created = ok("POST /v1/leases", 201, await client.POST("/v1/leases", { body: { ttl: "20s" } }));
        check(created.ttl_ms === 20_000, `ttl_ms ${created.ttl_ms}`);
        check(created.holdings.length === 0, `a new lease holds ${JSON.stringify(created.holdings)}`);
        ids.push(created.id);
    }
    [lease, other] = ids as [string, string];
});

await step("acquire a lock with the lease", ["create two leases"], async () => {
    const got = ok(
        "POST /v1/locks/{name}/acquire",
        200,
        await client.POST("/v1/locks/{name}/acquire", {
            params: { path: { name: lock }, query: { wait: "0" } },
            body: { lease },
        }),
    );
    check(got.acquired, `acquired ${got.acquired}`);
    check(got.lock === lock, `lock ${got.lock}`);
    check(got.lease.id === lease, `held with lease ${got.lease.id}, not ours`);
    check(typeof got.fencing_token === "number" && got.fencing_token > 0, `fencing token ${got.fencing_token}`);
    check(got.handle.length > 0, "no handle");
    handle = got.handle;
    token = got.fencing_token;
});

await step("a second lease is refused at once (409 problem)", ["acquire a lock with the lease"], async () => {
    const p = problem(
        "second POST /v1/locks/{name}/acquire",
        409,
        await client.POST("/v1/locks/{name}/acquire", {
            params: { path: { name: lock }, query: { wait: "0" } },
            body: { lease: other },
        }),
    );
    check(p.type === "urn:zkgate:problem:lock-not-acquired", `problem type ${p.type}`);
});

await step(
    "release the lock; the other lease takes it, with a greater token",
    ["acquire a lock with the lease"],
    async () => {
        noContent(
            "DELETE /v1/locks/{name}/handles/{handle}",
            204,
            await client.DELETE("/v1/locks/{name}/handles/{handle}", { params: { path: { name: lock, handle } } }),
        );
        const got = ok(
            "POST /v1/locks/{name}/acquire after the release",
            200,
            await client.POST("/v1/locks/{name}/acquire", {
                params: { path: { name: lock }, query: { wait: "0" } },
                body: { lease: other },
            }),
        );
        check(got.acquired && got.lease.id === other, `not granted to the other lease: ${JSON.stringify(got)}`);
        check(typeof got.fencing_token === "number" && got.fencing_token > token, `token ${got.fencing_token} not above ${token}`);
        noContent(
            "DELETE /v1/locks/{name}/handles/{handle} (other lease)",
            204,
            await client.DELETE("/v1/locks/{name}/handles/{handle}", {
                params: { path: { name: lock, handle: got.handle } },
            }),
        );
    },
);

const queue = `flow-queue-${run}`;
const itemBody = { to: "ada@example.com", run };
let item = "";
let claim = "";

await step("put an item on a queue", [], async () => {
    const stored = ok(
        "POST /v1/queues/{name}/items",
        201,
        await client.POST("/v1/queues/{name}/items", { params: { path: { name: queue } }, body: itemBody }),
    );
    check(stored.duplicate === false, "a first put is reported a duplicate");
    check(typeof stored.item === "string" && stored.item.length > 0, `item ${stored.item}`);
    item = stored.item;
});

await step("take (claim) it", ["put an item on a queue"], async () => {
    const taken = ok(
        "POST /v1/queues/{name}/take",
        200,
        await client.POST("/v1/queues/{name}/take", {
            params: { path: { name: queue }, query: { wait: "5s", ack_deadline: "30s" } },
        }),
    );
    check(!("items" in taken), `one take answered a batch: ${JSON.stringify(taken)}`);
    check(taken.item === item, `took ${taken.item}, not ${item}`);
    check(isDeepStrictEqual(taken.body, itemBody), `body ${JSON.stringify(taken.body)}`);
    check(taken.content_type.startsWith("application/json"), `content type ${taken.content_type}`);
    check(taken.deliveries === 1, `deliveries ${taken.deliveries}`);
    check(typeof taken.claim === "string" && taken.claim.length > 0, `claim ${taken.claim}`);
    claim = taken.claim;
});

await step("ack it; the queue is then empty", ["take (claim) it"], async () => {
    noContent(
        "POST /v1/queues/{name}/claims/{claim}/ack",
        204,
        await client.POST("/v1/queues/{name}/claims/{claim}/ack", { params: { path: { name: queue, claim } } }),
    );
    noContent(
        "POST /v1/queues/{name}/take on the empty queue",
        204,
        await client.POST("/v1/queues/{name}/take", { params: { path: { name: queue }, query: { wait: "0" } } }),
    );
});

const counter = `flow-counter-${run}`;

await step("add to a counter", [], async () => {
    const path = { params: { path: { name: counter } } };
    const first = ok("POST /v1/counters/{name}/add", 200, await client.POST("/v1/counters/{name}/add", { ...path, body: { delta: 5 } }));
    check(first.previous === 0 && first.value === 5, `previous ${first.previous}, value ${first.value}`);
    const second = ok(
        "second POST /v1/counters/{name}/add",
        200,
        await client.POST("/v1/counters/{name}/add", { ...path, body: { delta: -2, min: 0 } }),
    );
    check(second.previous === 5 && second.value === 3, `previous ${second.previous}, value ${second.value}`);
    const refused = problem(
        "POST /v1/counters/{name}/add past max",
        409,
        await client.POST("/v1/counters/{name}/add", { ...path, body: { delta: 1, max: 3 } }),
    );
    check(refused.type === "urn:zkgate:problem:out-of-bounds", `problem type ${refused.type}`);
});

const election = `flow-election-${run}`;

await step("campaign, and read the leader back", ["create two leases"], async () => {
    const value = { host: "flow", port: 8080 };
    const won = ok(
        "POST /v1/elections/{name}/campaign",
        200,
        await client.POST("/v1/elections/{name}/campaign", {
            params: { path: { name: election }, query: { wait: "5s" } },
            body: { lease, value },
        }),
    );
    check(won.leader, `leader ${won.leader}`);
    check(typeof won.term === "number" && won.term > 0, `term ${won.term}`);
    const read = ok(
        "GET /v1/elections/{name}",
        200,
        await client.GET("/v1/elections/{name}", { params: { path: { name: election } } }),
    );
    const leader = read.leader;
    check(leader !== undefined && leader !== null, `no leader: ${JSON.stringify(read)}`);
    check(leader.lease === lease, `leader's lease ${leader.lease}, not ours`);
    check(leader.node === won.node, `leader node ${leader.node}, ours ${won.node}`);
    check(leader.term === won.term, `leader term ${leader.term}, ours ${won.term}`);
    check(isDeepStrictEqual(leader.value, value), `leader value ${JSON.stringify(leader.value)}`);
    check(read.candidate_count === 1, `${read.candidate_count} candidates`);
});

await step("delete the leases", ["create two leases"], async () => {
    for (const id of [lease, other]) {
        noContent("DELETE /v1/leases/{id}", 204, await client.DELETE("/v1/leases/{id}", { params: { path: { id } } }));
    }
});

console.log(`typescript-client: ${passed.length} passed, ${failed.length} failed`);
process.exit(failed.length > 0 ? 1 : 0);
