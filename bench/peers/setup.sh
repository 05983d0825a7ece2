#!/usr/bin/env bash
# Install what bench/run.sh needs besides the project's own venv (.venv, which runs
# vkgate and the bare forwarder). Idempotent; registries only (Debian, PyPI, npm).
# Touches nothing outside the packages and /tmp.
#   bash bench/peers/setup.sh            # nginx, wrk, LiteLLM venv, Portkey
#   SKIP_PORTKEY=1 bash bench/peers/setup.sh
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LITELLM_VENV="${LITELLM_VENV:-/tmp/litellm-venv}"
LITELLM_SPEC="${LITELLM_SPEC:-litellm[proxy]}"     # e.g. 'litellm[proxy]==1.108.7'
PORTKEY_DIR="${PORTKEY_DIR:-/tmp/portkey}"
PORTKEY_VERSION="${PORTKEY_VERSION:-1.15.2}"

# 1. nginx (mock upstream) + wrk (load driver) + curl/ss/pgrep used by the script.
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
  apt-get update -qq
  # Do not let the package start the system nginx on :80. Only add a
  # policy-rc.d if none exists, and only remove the one we added.
  added_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; added_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light wrk curl iproute2 procps || rc=$?
  [[ $added_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d
  [[ ${rc:-0} == 0 ]] || exit "$rc"
fi

# 2. LiteLLM proxy in its own venv (~30 s from PyPI).
if [[ ! -x "$LITELLM_VENV/bin/litellm" ]]; then
  python3 -m venv "$LITELLM_VENV"
  "$LITELLM_VENV/bin/pip" install -q --upgrade pip
  "$LITELLM_VENV/bin/pip" install -q "$LITELLM_SPEC"
fi
"$LITELLM_VENV/bin/python" -c 'import importlib.metadata as m; print("litellm", m.version("litellm"))'

# 3. Portkey gateway from npm, run with node (no npx download at run time).
if [[ "${SKIP_PORTKEY:-0}" != 1 ]] && command -v npm >/dev/null; then
  if [[ ! -f "$PORTKEY_DIR/node_modules/@portkey-ai/gateway/build/start-server.js" ]]; then
    mkdir -p "$PORTKEY_DIR"
    [[ -f "$PORTKEY_DIR/package.json" ]] || \
      printf '{"name":"bench-portkey","private":true}\n' > "$PORTKEY_DIR/package.json"
    # Its postinstall (patch-package) has nothing to patch in the published
    # tarball; npm skips it by default here anyway.
    (cd "$PORTKEY_DIR" && npm install --no-audit --no-fund "@portkey-ai/gateway@$PORTKEY_VERSION")
  fi
  node -p "'portkey gateway ' + require('$PORTKEY_DIR/node_modules/@portkey-ai/gateway/package.json').version"
fi
echo "setup done; now: bash $(dirname "$BENCH_DIR")/run.sh"
