#!/usr/bin/python3
"""Interop peer for zkgate integration tests: drives a kazoo Lock through a
line protocol on stdin/stdout (same protocol as CuratorLock.java).

    /usr/bin/python3 tests/interop/kazoo_lock.py <connectString> <lockPath>

stdout (one line each, flushed):
    READY                once the client is connected
    ACQUIRED | TIMEOUT   reply to "acquire <millis>"
    RELEASED             reply to "release"
    ERROR <message>      any exception while handling a command
stdin: "acquire <millis>", "release", "quit" (EOF behaves like quit).

Must run under Debian's /usr/bin/python3 (python3-kazoo 2.8.0).

Interop note: this is kazoo's stock Lock, whose znodes are named
"<uuidhex>__lock__<seq>", with extra_lock_patterns=["-lock-"] so that it also
counts zkgate's (Curator-style) "_c_<uuid>-lock-<seq>" nodes as contenders.
zkgate orders every child by its sequence suffix whatever the prefix, so the
two exclude each other. (Curator itself orders by the text after the last
"lock-" and mis-orders kazoo's nodes: Curator and kazoo must not share a lock.)

With ZKGATE_PEER_DIGEST=user:password in the environment the client
authenticates with that digest and creates its znodes with a digest ACL for
it, as a kazoo service sharing locks with `zkgate serve --zookeeper-auth` must.
"""
import logging
import os
import sys

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout, NoNodeError
from kazoo.recipe.lock import Lock
from kazoo.security import make_digest_acl

# Keep the real stdout for protocol lines only; anything else printed goes to
# stderr.
PROTO = sys.stdout
sys.stdout = sys.stderr


def say(line):
    PROTO.write(line + "\n")
    PROTO.flush()


def describe(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return text.replace("\r", " ").replace("\n", " ")


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    if len(sys.argv) != 3:
        say("ERROR usage: kazoo_lock.py <connectString> <lockPath>")
        return 1
    connect_string, lock_path = sys.argv[1], sys.argv[2]

    try:
        digest = os.environ.get("ZKGATE_PEER_DIGEST")
        if digest:
            user, password = digest.split(":", 1)
            client = KazooClient(
                hosts=connect_string, timeout=10.0,
                auth_data=[("digest", digest)],
                default_acl=[make_digest_acl(user, password, all=True)])
        else:
            client = KazooClient(hosts=connect_string, timeout=10.0)
        client.start(timeout=30)
        lock = Lock(client, lock_path, identifier="kazoo",
                    extra_lock_patterns=["-lock-"])
    except Exception as exc:
        say("ERROR " + describe(exc))
        return 1
    say("READY")

    try:
        for raw in sys.stdin:
            parts = raw.split()
            if not parts:
                continue
            cmd = parts[0]
            try:
                if cmd == "acquire":
                    if len(parts) != 2:
                        say("ERROR usage: acquire <millis>")
                        continue
                    timeout = int(parts[1]) / 1000.0
                    # The lock's znode is a container (zkgate and Curator make it one):
                    # ZooKeeper removes it once its last contender goes, so make sure of it
                    # again on every acquire, as Curator does, rather than once; and when it
                    # went between kazoo making sure of it and creating the contender (the
                    # server's check runs every 200 ms in the tests), make sure again.
                    for attempt in range(5):
                        lock.assured_path = False
                        try:
                            ok = lock.acquire(timeout=timeout)
                        except LockTimeout:
                            ok = False
                        except NoNodeError:
                            if attempt == 4:
                                raise
                            continue
                        break
                    say("ACQUIRED" if ok else "TIMEOUT")
                elif cmd == "release":
                    if not lock.is_acquired:
                        say("ERROR lock is not held")
                        continue
                    lock.release()
                    say("RELEASED")
                elif cmd == "quit":
                    break
                else:
                    say("ERROR unknown command: " + cmd)
            except Exception as exc:
                say("ERROR " + describe(exc))
    finally:
        try:
            client.stop()
            client.close()
        except Exception as exc:
            sys.stderr.write("close failed: %s\n" % describe(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
