"""kazoo's recipes on the same ZooKeeper, driven like zkgate's workloads; prints one JSON object.

  python3 kazoo_bench.py HOSTS cycles N
  python3 kazoo_bench.py HOSTS contended CLIENTS LOCKS SECONDS
  python3 kazoo_bench.py HOSTS queue_put PRODUCERS SECONDS
  python3 kazoo_bench.py HOSTS queue_take CONSUMERS ITEMS
  python3 kazoo_bench.py HOSTS failover ROUNDS

Each client is its own KazooClient (its own session), in its own thread, as separate services
would be.
"""

import json
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
    }[workload](*args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
