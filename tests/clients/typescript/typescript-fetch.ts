// The flow (flow.ts) through the client openapi-generator's `typescript-fetch` generates from the
// served spec (generated/typescript-fetch/). Only the generated API classes, models and their
// JSON mappers are used. Its `*Raw` methods give the HTTP status; an error status is thrown as its
// `ResponseError`, whose body is read with the generated `ProblemFromJSON`.
//
//     node dist/typescript-fetch.js http://127.0.0.1:PORT
import { type Answer, type Client, mapped, runFlow, serverUrl } from "./flow.js";
import {
    Configuration,
    CountersApi,
    ElectionsApi,
    KvApi,
    LeasesApi,
    LocksApi,
    ProblemFromJSON,
    QueuesApi,
    ResponseError,
    type ApiResponse,
} from "./generated/typescript-fetch/index.js";

const configuration = new Configuration({ basePath: serverUrl() });
const leases = new LeasesApi(configuration);
const locks = new LocksApi(configuration);
const queues = new QueuesApi(configuration);
const counters = new CountersApi(configuration);
const elections = new ElectionsApi(configuration);
const kv = new KvApi(configuration);

async function answer<T>(call: Promise<ApiResponse<T>>): Promise<Answer<T>> {
    try {
        const got = await call;
        const status = got.raw.status;
        const contentType = got.raw.headers.get("content-type") ?? "";
        return status === 204 ? { status, contentType } : { status, contentType, body: await got.value() };
    } catch (e) {
        if (!(e instanceof ResponseError)) throw e;
        const response = e.response;
        return {
            status: response.status,
            contentType: response.headers.get("content-type") ?? "",
            problem: ProblemFromJSON(await response.json()),
        };
    }
}

const client: Client = {
    createLease: async (ttl, lockDelay) =>
        answer(leases.createLeaseRaw({ createLease: lockDelay === undefined ? { ttl } : { ttl, lockDelay } })),
    acquireLock: async (lock, lease) =>
        mapped(await answer(locks.acquireLockRaw({ name: lock, wait: "0", acquireBody: { lease } })), (a) => ({
            ...a,
            lease: a.lease.id,
        })),
    releaseLock: async (lock, handle) => answer(locks.releaseLockRaw({ name: lock, handle })),
    put: async (queue, item) => answer(queues.putRaw({ name: queue, body: item })),
    take: async (queue, wait, ackDeadline) =>
        mapped(
            await answer(queues.takeRaw(ackDeadline === undefined ? { name: queue, wait } : { name: queue, wait, ackDeadline })),
            (t) => ("items" in t ? { batch: true as const } : { batch: false as const, ...t }),
        ),
    ack: async (queue, claim) => answer(queues.ackRaw({ name: queue, claim })),
    add: async (counter, addBody) => answer(counters.addToCounterRaw({ name: counter, addBody })),
    campaign: async (election, lease, value) =>
        answer(elections.campaignRaw({ name: election, wait: "5s", campaignBody: { lease, value } })),
    election: async (election) => answer(elections.electionStateRaw({ name: election })),
    deleteLease: async (id) => answer(leases.deleteLeaseRaw({ id })),
    putKey: async (key, value, lease, guard) => answer(kv.putValueRaw({ key, lease, zKGATEGuard: guard, body: value })),
    txnCreate: async (key, marker, text) =>
        answer(
            kv.transactionRaw({
                txnRequest: {
                    compare: [{ key, absent: true }],
                    then: [{ put: key, text }, { put: marker, text }, { get: key }],
                    _else: [{ get: key }],
                },
            }),
        ),
};

await runFlow("typescript-fetch", client);
