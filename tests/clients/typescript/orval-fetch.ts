// The fetch that orval's generated functions call (orval.config.ts names it): the server's URL
// before the generated path, and the answer in the shape orval's fetch client types it
// (`{ data, status, headers }`, `data` parsed from JSON, absent for 204).
let server = "";

export function useServer(url: string): void {
    server = url;
}

export async function orvalFetch<T>(path: string, init: RequestInit): Promise<T> {
    const response = await fetch(new URL(path, server), init);
    const text = [204, 205, 304].includes(response.status) ? "" : await response.text();
    const answer = { data: text ? JSON.parse(text) : undefined, status: response.status, headers: response.headers };
    // orval's generated function states T (its union of statuses and bodies); the status and
    // headers are the response's own, and the body is what the server sent.
    return answer as T;
}
