# Sourced by scripts that need a zkgate of their own: `start_zkgate BINARY LOG [serve flags...]`
# runs it (embedded ZooKeeper) on a free loopback port in the background, stops it when the
# script exits, waits until it is ready, and sets ZKGATE_URL.
start_zkgate() {
    local binary=$1 log=$2
    shift 2
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$binary" serve --listen "127.0.0.1:$port" "$@" >"$log" 2>&1 &
    ZKGATE_PID=$!
    trap 'kill $ZKGATE_PID 2>/dev/null; wait $ZKGATE_PID 2>/dev/null || true' EXIT
    ZKGATE_URL="http://127.0.0.1:$port"
    for _ in $(seq 1 120); do
        curl -sf "$ZKGATE_URL/readyz" >/dev/null && return 0
        kill -0 "$ZKGATE_PID" 2>/dev/null || { echo "zkgate exited; see $log" >&2; return 1; }
        sleep 0.5
    done
    echo "zkgate did not get ready in 60 s; see $log" >&2
    return 1
}
