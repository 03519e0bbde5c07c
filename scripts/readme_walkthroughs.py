#!/usr/bin/env python3
"""Runs the README's walkthroughs as a newcomer pastes them, so that they stay true.

Each section (`##` or `###`) with `sh` blocks runs on a zkgate of its own, fresh (embedded
ZooKeeper, a free port; or, with `--zookeeper`, a root of its own on that server), so that no
walkthrough leans on what an earlier one left behind. Its
blocks run in order in one bash, with `Z` set to that zkgate and `127.0.0.1:7070` in the text
replaced by its address, under `set -eo pipefail`: a command that fails fails the section.
A line whose comment starts with a literal (`# "Lock not acquired"`, `# 2`, `# true`,
`# 409: still up`, `# {"depth":0}`) must print exactly that literal. An event stream
(`curl -sN`) is read for a few seconds, then cut: it is meant to run until interrupted.

A block that cannot run here (it starts the server itself, needs Docker, a second instance,
a config file, a program of your own, or streams until interrupted) is preceded in the README
by `<!-- not run: why -->`, which the reader does not see and this script honours.

A section that fails while its zkgate logged a lost ZooKeeper connection (the test machine's
ZooKeeper stalled past the session's read timeout: every request meanwhile answers 503) runs
once more on a fresh zkgate; a second failure is reported as any other.

  scripts/readme_walkthroughs.py --zkgate target/debug/zkgate [--only 'Semaphores'] [--zookeeper host:port]
"""

import argparse
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
LITERAL = re.compile(
    r'^(?P<cmd>[^#].*?\S)\s+#\s+(?P<exp>"[^"]*"|-?\d+(?:\.\d+)?|true|false|null|\{.*\}|\[.*\])(?:\s*$|:)'
)
SECTION_TIMEOUT = 120
STREAM = re.compile(r"\bcurl -(s?)N ")
STREAM_SECONDS = 3


def sections(readme):
    """[(title, [(line number, block text)], [skipped (title, why)])] in README order."""
    out = []
    title, blocks, skipped = None, [], []
    lines = readme.splitlines()
    i = 0
    pending_skip = None
    while i < len(lines):
        line = lines[i]
        heading = re.match(r"^(##|###) (.+)$", line)
        if heading:
            if title and (blocks or skipped):
                out.append((title, blocks, skipped))
            title, blocks, skipped, pending_skip = heading.group(2), [], [], None
        elif SKIP.search(line):
            pending_skip = SKIP.search(line).group(1)
        elif line.strip() == "```sh":
            start = i + 1
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            if pending_skip:
                skipped.append(pending_skip)
            else:
                blocks.append((start + 1, body))
            pending_skip = None
        elif line.strip():
            pending_skip = None if not line.startswith("<!--") else pending_skip
        i += 1
    if title and (blocks or skipped):
        out.append((title, blocks, skipped))
    return out


def script(title, blocks, address):
    """The bash that runs a section's blocks, with the literal checks."""
    out = [
        "set -eo pipefail",
        "__failed=0",
        '__expect() { if [[ "$1" != "$2" ]]; then echo "README line $3 ($4): expected $2, got ${1:-nothing}" >&2; __failed=1; fi; }',
    ]
    for start, body in blocks:
        continued = False
        for offset, line in enumerate(body):
            number = start + offset
            line = line.replace("127.0.0.1:7070", address)
            match = None if continued else LITERAL.match(line)
            if match and not match.group("cmd").rstrip().endswith("&"):
                out.append(f"__got=$({match.group('cmd')})")
                out.append(f"__expect \"$__got\" {shlex.quote(match.group('exp'))} {number} {shlex.quote(title)}")
            elif STREAM.search(line) and not continued:
                # curl's exit status 28 is its --max-time running out: the stream was fine.
                line = STREAM.sub(lambda m: f"curl -{m.group(1)}N --max-time {STREAM_SECONDS} ", line)
                out.append(f"{{ {line.rstrip()}; }} || [[ $? == 28 ]]")
            else:
                out.append(line)
            continued = line.rstrip().endswith("\\")
    out.append("wait")
    out.append("exit $__failed")
    return "\n".join(out) + "\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(zkgate, log, zookeeper):
    port = free_port()
    server = ["--zookeeper", zookeeper] if zookeeper else []
    process = subprocess.Popen(
        [zkgate, "serve", "--listen", f"127.0.0.1:{port}", *server],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"zkgate exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return process, url
        except OSError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError("zkgate did not get ready in 90 s")


def stop(process):
    try:
        os.killpg(process.pid, 15)
        process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, 9)


# What zkgate logs when its ZooKeeper connection drops.
CONNECTION_LOST = "ZooKeeper connection lost"


def run_section(zkgate, title, blocks, zookeeper, root):
    """Runs one section's blocks on a fresh zkgate (under the root `readme-<root>` of
    `zookeeper`, if given): its exit status, output, time and zkgate's log."""
    with tempfile.TemporaryDirectory() as work, open(os.path.join(work, "zkgate.log"), "w+") as log:
        chroot = f"{zookeeper}/readme-{root}" if zookeeper else None
        process, url = start(zkgate, log, chroot)
        try:
            env = dict(os.environ, Z=url, ZKGATE_URL=url, HOME=work)
            env["PATH"] = os.path.dirname(zkgate) + os.pathsep + env["PATH"]
            began = time.monotonic()
            try:
                run = subprocess.run(
                    ["bash", "-c", script(title, blocks, url.removeprefix("http://"))],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=SECTION_TIMEOUT,
                )
                code, output = run.returncode, run.stdout + run.stderr
            except subprocess.TimeoutExpired as e:
                code = "timeout"
                output = (e.stdout or b"").decode() + (e.stderr or b"").decode()
            took = time.monotonic() - began
        finally:
            stop(process)
        log.seek(0)
        return code, output, took, log.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zkgate", required=True, help="the zkgate binary")
    parser.add_argument("--readme", default=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    parser.add_argument("--only", help="run only the sections whose title contains this")
    parser.add_argument(
        "--zookeeper",
        help="a ZooKeeper to run every section on (each under a chroot of its own) instead of an "
        "embedded one per section (`zkgate serve` starting its own is tested on its own)",
    )
    args = parser.parse_args()
    zkgate = os.path.abspath(args.zkgate)
    for tool in ("curl", "jq"):
        if not shutil.which(tool):
            sys.exit(f"the walkthroughs need {tool} (scripts/install-deps.sh test installs it)")
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()
    failures, ran = [], 0
    for title, blocks, skipped in sections(readme):
        for why in skipped:
            print(f"- {title}: a block not run ({why})")
        if not blocks or (args.only and args.only not in title):
            continue
        ran += 1
        code, output, took, log = run_section(zkgate, title, blocks, args.zookeeper, f"{ran}")
        if code != 0 and CONNECTION_LOST in log:
            # The test machine's ZooKeeper stalled past the session's read timeout and every
            # connection of this zkgate dropped (503s for a moment): the environment's fault,
            # not the walkthrough's. Once more, on a fresh zkgate under a fresh root.
            print(f"- {title}: zkgate lost its ZooKeeper connection (exit {code}); running it again")
            code, output, took, log = run_section(zkgate, title, blocks, args.zookeeper, f"{ran}-again")
        if code == 0:
            print(f"ok {title} ({took:.1f} s)")
        else:
            failures.append(title)
            print(f"FAILED {title} (exit {code}, {took:.1f} s)\n{output}\n--- zkgate's log (end):\n{log[-3000:]}")
    print(f"{ran} walkthroughs run, {len(failures)} failed" + (f": {', '.join(failures)}" if failures else ""))
    sys.exit(1 if failures or not ran else 0)


if __name__ == "__main__":
    main()
