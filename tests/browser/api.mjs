// A small JSON client for zkgate's HTTP API, shared by the browser scripts.
export function client(base) {
  return async function api(method, path, body) {
    const response = await fetch(base + path, {
      method,
      headers: body ? { "content-type": "application/json" } : {},
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await response.text();
    return { status: response.status, json: text ? JSON.parse(text) : null };
  };
}
