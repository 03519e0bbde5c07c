// The flow (flow.ts) through openapi-fetch, typed by what openapi-typescript generates from the
// served spec into generated/zkgate.d.ts. Only the generated paths and types are used: no
// hand-made HTTP call, no cast of an answer.
//
//     node dist/openapi-fetch.js http://127.0.0.1:PORT
import createClient from "openapi-fetch";
import { type Answer, type Client, mapped, runFlow, serverUrl, taken } from "./flow.js";
import type { components, paths } from "./generated/zkgate.js";

type Spec = components["schemas"];

const api = createClient<paths>({ baseUrl: serverUrl() });

// openapi-fetch's answer, as the flow reads it.
function answer<T>(got: { data?: T; error?: Spec["Problem"]; response: Response }): Answer<T> {
    return {
        status: got.response.status,
        contentType: got.response.headers.get("content-type") ?? "",
        body: got.data,
        problem: got.error,
    };
}

const client: Client = {
    createLease: async (ttl, lockDelay) =>
        mapped(
            answer(await api.POST("/v1/leases", { body: lockDelay === undefined ? { ttl } : { ttl, lock_delay: lockDelay } })),
            (l) => ({
                id: l.id,
                ttlMs: l.ttl_ms,
                lockDelayMs: l.lock_delay_ms,
                holdings: l.holdings,
            }),
        ),
    acquireLock: async (lock, lease) =>
        mapped(
            answer(
                await api.POST("/v1/locks/{name}/acquire", {
                    params: { path: { name: lock }, query: { wait: "0" } },
                    body: { lease },
                }),
            ),
            (a) => ({ ...a, lease: a.lease.id, fencingToken: a.fencing_token }),
        ),
    releaseLock: async (lock, handle) =>
        answer(await api.DELETE("/v1/locks/{name}/handles/{handle}", { params: { path: { name: lock, handle } } })),
    put: async (queue, item) =>
        answer(await api.POST("/v1/queues/{name}/items", { params: { path: { name: queue } }, body: item })),
    take: async (queue, wait, ack_deadline) =>
        mapped(
            answer(
                await api.POST("/v1/queues/{name}/take", {
                    params: { path: { name: queue }, query: ack_deadline === undefined ? { wait } : { wait, ack_deadline } },
                }),
            ),
            taken,
        ),
    ack: async (queue, claim) =>
        answer(await api.POST("/v1/queues/{name}/claims/{claim}/ack", { params: { path: { name: queue, claim } } })),
    add: async (counter, change) =>
        answer(await api.POST("/v1/counters/{name}/add", { params: { path: { name: counter } }, body: change })),
    campaign: async (election, lease, value) =>
        answer(
            await api.POST("/v1/elections/{name}/campaign", {
                params: { path: { name: election }, query: { wait: "5s" } },
                body: { lease, value },
            }),
        ),
    election: async (election) =>
        mapped(answer(await api.GET("/v1/elections/{name}", { params: { path: { name: election } } })), (e) => ({
            leader: e.leader,
            candidateCount: e.candidate_count,
        })),
    deleteLease: async (id) => answer(await api.DELETE("/v1/leases/{id}", { params: { path: { id } } })),
    putKey: async (key, value, lease, guard) =>
        answer(
            await api.PUT("/v1/kv/{key}", {
                params: {
                    path: { key },
                    query: lease === undefined ? {} : { lease },
                    header: guard === undefined ? {} : { "ZKGATE-Guard": guard },
                },
                body: value,
            }),
        ),
    txnCreate: async (key, marker, text) =>
        answer(
            await api.POST("/v1/kv-txn", {
                body: {
                    compare: [{ key, absent: true }],
                    then: [{ put: key, text }, { put: marker, text }, { get: key }],
                    else: [{ get: key }],
                },
            }),
        ),
};

await runFlow("openapi-fetch", client);
