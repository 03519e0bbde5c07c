#!/usr/bin/env bash
# Installs what zkgate needs from Debian's packages, if it is missing.
#   scripts/install-deps.sh run    Java and ZooKeeper (for the embedded ZooKeeper)
#   scripts/install-deps.sh test   that, plus the interoperability peers (Curator, kazoo) and
#                                  the browser for the dashboard test (chromium), and what
#                                  scripts/schemathesis.sh needs (python3-venv, curl), and etcd
#                                  for the comparison bench's smoke run, and jq for the README
#                                  walkthroughs (tests/it/readme.rs)
set -euo pipefail

want=(zookeeper)
command -v java >/dev/null 2>&1 || want+=(default-jre-headless)
if [[ "${1:-run}" == test ]]; then
    want+=(libcurator-recipes-java libcurator-discovery-java libslf4j-java python3-kazoo chromium python3-venv curl jq etcd-server)
fi

missing=()
for pkg in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=()
[[ $(id -u) -ne 0 ]] && sudo=(sudo)
echo "installing: ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
