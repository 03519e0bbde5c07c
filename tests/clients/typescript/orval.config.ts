// orval's fetch client from the served spec (scripts/clients.sh copies it to generated/openapi.json).
// orval's fetch functions take paths relative to the server; the mutator (orval-fetch.ts) is
// where orval expects a client to say which server, as its documentation shows for a base URL
// known only at run time.
export default {
    zkgate: {
        input: { target: "./generated/openapi.json" },
        output: {
            target: "./generated/orval/zkgate.ts",
            client: "fetch",
            mode: "single",
            // Header parameters (`ZKGATE-Guard`, `Idempotency-Key`, `If-Match`) as typed arguments.
            headers: true,
            override: { mutator: { path: "./orval-fetch.ts", name: "orvalFetch", extension: ".js" } },
        },
    },
};
