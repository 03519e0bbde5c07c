// The flow (flow.ts) through the functions orval's fetch client generates from the served spec
// (generated/orval/zkgate.ts; orval.config.ts, orval-fetch.ts for the server's URL). Only the
// generated functions and types are used.
//
//     node dist/orval.js http://127.0.0.1:PORT
import { type Answer, type Client, mapped, runFlow, serverUrl, taken } from "./flow.js";
import * as api from "./generated/orval/zkgate.js";
import { useServer } from "./orval-fetch.js";

useServer(serverUrl());

// orval types each answer as a union over its statuses, with the body each carries. This is that
// union as the flow reads it: a success's body, or a problem document for every error status (an
// error whose body the spec gave another type would not type-check here).
type Orval<T> =
    | { status: 200 | 201 | 202; data: T; headers: Headers }
    | { status: 204; data: void; headers: Headers }
    | { status: 400 | 401 | 403 | 404 | 409 | 410 | 412 | 413 | 422 | 429 | 503 | 507; data: api.Problem; headers: Headers };

function answer<T>(r: Orval<T>): Answer<T> {
    const contentType = r.headers.get("content-type") ?? "";
    switch (r.status) {
        case 200:
        case 201:
        case 202:
            return { status: r.status, contentType, body: r.data };
        case 204:
            return { status: r.status, contentType };
        default:
            return { status: r.status, contentType, problem: r.data };
    }
}

const client: Client = {
    createLease: async (ttl, lockDelay) =>
        mapped(answer(await api.createLease(lockDelay === undefined ? { ttl } : { ttl, lock_delay: lockDelay })), (l) => ({
            id: l.id,
            ttlMs: l.ttl_ms,
            lockDelayMs: l.lock_delay_ms,
            holdings: l.holdings,
        })),
    acquireLock: async (lock, lease) =>
        mapped(answer(await api.acquireLock(lock, { lease }, { wait: "0" })), (a) => ({
            ...a,
            lease: a.lease.id,
            fencingToken: a.fencing_token,
        })),
    releaseLock: async (lock, handle) => answer(await api.releaseLock(lock, handle)),
    put: async (queue, item) => answer(await api.put(queue, item)),
    take: async (queue, wait, ack_deadline) =>
        mapped(answer(await api.take(queue, ack_deadline === undefined ? { wait } : { wait, ack_deadline })), taken),
    ack: async (queue, claim) => answer(await api.ack(queue, claim)),
    add: async (counter, change) => answer(await api.addToCounter(counter, change)),
    campaign: async (election, lease, value) => answer(await api.campaign(election, { lease, value }, { wait: "5s" })),
    election: async (election) =>
        mapped(answer(await api.electionState(election)), (e) => ({ leader: e.leader, candidateCount: e.candidate_count })),
    deleteLease: async (id) => answer(await api.deleteLease(id)),
    putKey: async (key, value, lease, guard) =>
        answer(
            await api.putValue(
                key,
                value,
                lease === undefined ? {} : { lease },
                guard === undefined ? {} : { "ZKGATE-Guard": guard },
            ),
        ),
    txnCreate: async (key, marker, text) =>
        answer(
            await api.transaction({
                compare: [{ key, absent: true }],
                then: [{ put: key, text }, { put: marker, text }, { get: key }],
                else: [{ get: key }],
            }),
        ),
};

await runFlow("orval", client);
