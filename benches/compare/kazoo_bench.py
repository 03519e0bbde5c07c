"""kazoo's recipes on the same ZooKeeper, driven like zkgate's workloads; prints one JSON object.

  python3 kazoo_bench.py HOSTS cycles N
  python3 kazoo_bench.py HOSTS contended CLIENTS LOCKS SECONDS
  python3 kazoo_bench.py HOSTS queue_put PRODUCERS SECONDS
  python3 kazoo_bench.py HOSTS queue_take CONSUMERS ITEMS
  python3 kazoo_bench.py HOSTS failover ROUNDS
  python3 kazoo_bench.py HOSTS lock_load CLIENTS RATE SECONDS
  python3 kazoo_bench.py HOSTS take_load CONSUMERS RATE SECONDS

Each client is its own KazooClient (its own session), in its own thread, as separate services
would be.
"""

import json
import queue as jobs
import sys
import threading
import time
import uuid

from kazoo.client import KazooClient
from kazoo.recipe.election import Election
from kazoo.recipe.lock import Lock
from kazoo.recipe.queue import LockingQueue, Queue

HOSTS = sys.argv[1]
ROOT = "/kazoo-bench-" + uuid.uuid4().hex[:8]


def client():
    zk = KazooClient(hosts=HOSTS, timeout=10.0)
    zk.start(timeout=30)
    return zk


def run_threads(count, target):
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def cycles(n):
    zk = client()
    lock = Lock(zk, ROOT + "/uncontended")
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        lock.acquire()
        lock.release()
        samples.append((time.perf_counter() - start) * 1e6)
    zk.stop()
    return {"samples_us": samples}


def contended(clients, locks, seconds):
    clients_zk = [client() for _ in range(clients)]
    granted = [0] * clients
    deadline = time.monotonic() + seconds

    def work(i):
        lock = Lock(clients_zk[i], "%s/c%d-%d" % (ROOT, locks, i % locks))
        while time.monotonic() < deadline:
            lock.acquire()
            lock.release()
            if time.monotonic() < deadline:
                granted[i] += 1

    run_threads(clients, work)
    for zk in clients_zk:
        zk.stop()
    return {"rate": sum(granted) / seconds}


def queue_put(producers, seconds):
    clients_zk = [client() for _ in range(producers)]
    put = [0] * producers
    deadline = time.monotonic() + seconds

    def work(i):
        queue = LockingQueue(clients_zk[i], ROOT + "/put")
        while time.monotonic() < deadline:
            queue.put(b'{"n": %d}' % i)
            put[i] += 1

    run_threads(producers, work)
    for zk in clients_zk:
        zk.stop()
    return {"rate": sum(put) / seconds}


def queue_take(consumers, items):
    filler = client()
    queue = LockingQueue(filler, ROOT + "/take")
    queue.put_all([b'{"n": %d}' % n for n in range(items)])
    clients_zk = [client() for _ in range(consumers)]
    taken = [0] * consumers

    def work(i):
        queue = LockingQueue(clients_zk[i], ROOT + "/take")
        while True:
            # At least once: get() holds the item until consume() removes it.
            item = queue.get(timeout=0.5)
            if item is None:
                if len(queue) == 0:
                    return
                continue
            queue.consume()
            taken[i] += 1

    start = time.monotonic()
    run_threads(consumers, work)
    elapsed = time.monotonic() - start
    for zk in clients_zk + [filler]:
        zk.stop()
    return {"rate": sum(taken) / elapsed, "taken": sum(taken)}


def open_loop(workers, rate, seconds, setup, op):
    """Operations due at `rate` a second for `seconds`, handed to `workers` threads (each with
    `setup(i)`'s state) as they come due; each latency counted from when it was due, so that
    falling behind is charged (no coordinated omission). `op(state, n)` runs operation `n` and
    returns when its measured step was answered (time.perf_counter)."""
    states = [setup(i) for i in range(workers)]
    due_jobs = jobs.Queue()
    samples = []
    lock = threading.Lock()

    def work(i):
        while True:
            job = due_jobs.get()
            if job is None:
                return
            n, due = job
            answered = op(states[i], n)
            with lock:
                samples.append((answered - due) * 1e6)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    count = max(1, int(rate * seconds))
    start = time.perf_counter() + 0.01
    for n in range(count):
        due = start + n / rate
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        due_jobs.put((n, due))
    for _ in threads:
        due_jobs.put(None)
    for t in threads:
        t.join()
    return states, samples


LOAD_LOCKS = 1024


def lock_load(clients, rate, seconds):
    def setup(i):
        zk = client()
        # Each lock once before the measuring (its parent node made), as the Rust side does.
        for n in range(i, LOAD_LOCKS, clients):
            op(zk, n)
        return zk

    def op(zk, n):
        lock = Lock(zk, "%s/load-%d" % (ROOT, n % LOAD_LOCKS))
        lock.acquire()
        granted = time.perf_counter()
        lock.release()
        return granted

    states, samples = open_loop(clients, rate, seconds, setup, op)
    for zk in states:
        zk.stop()
    return {"samples_us": samples}


def take_load(consumers, rate, seconds):
    filler = client()
    path = ROOT + "/take-load-%d" % int(rate)
    LockingQueue(filler, path).put_all([b'{"n": %d}' % n for n in range(int(rate * seconds) + 1)])

    def setup(i):
        return LockingQueue(client(), path)

    def op(queue, n):
        item = queue.get(timeout=30)
        taken = time.perf_counter()
        assert item is not None, "the queue was filled for every take"
        queue.consume()
        return taken

    states, samples = open_loop(consumers, rate, seconds, setup, op)
    for queue in states:
        queue.client.stop()
    filler.stop()
    return {"samples_us": samples}


def failover(rounds):
    samples = []
    for r in range(rounds):
        path = "%s/failover-%d" % (ROOT, r)
        a, b = client(), client()
        led = threading.Event()
        a_leads = threading.Event()
        release_a = threading.Event()
        led_at = [0.0]

        def lead_a():
            a_leads.set()
            release_a.wait()

        def lead_b():
            led_at[0] = time.perf_counter()
            led.set()

        election_a = Election(a, path, "a")
        threading.Thread(target=election_a.run, args=(lead_a,), daemon=True).start()
        a_leads.wait()
        election_b = Election(b, path, "b")
        threading.Thread(target=election_b.run, args=(lead_b,), daemon=True).start()
        while len(election_b.contenders()) < 2:
            time.sleep(0.001)
        start = time.perf_counter()
        # The leader's session ends (its process is gone): its node goes with it.
        a.stop()
        led.wait(30)
        samples.append((led_at[0] - start) * 1e6)
        release_a.set()
        b.stop()
    return {"samples_us": samples}


def main():
    workload, args = sys.argv[2], [float(a) if "." in a else int(a) for a in sys.argv[3:]]
    result = {
        "cycles": cycles,
        "contended": contended,
        "queue_put": queue_put,
        "queue_take": queue_take,
        "failover": failover,
        "lock_load": lock_load,
        "take_load": take_load,
    }[workload](*args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
