// A small JSON client for zkgate's HTTP API, shared by the browser scripts.
// With a token, requests carry `Authorization: Bearer <token>`.
export function client(base, token) {
  return async function api(method, path, body) {
    const headers = body ? { "content-type": "application/json" } : {};
    if (token) headers.authorization = "Bearer " + token;
    const response = await fetch(base + path, {
      method,
      headers,
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await response.text();
    return { status: response.status, json: text ? JSON.parse(text) : null };
  };
}
