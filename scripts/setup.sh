#!/usr/bin/env bash
# Installs the Debian 12 packages carls-c needs, when they are missing (sudo when not root).
# Usage: scripts/setup.sh
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libzmq3-dev libczmq-dev libprotobuf-c-dev protobuf-c-compiler
  libfaiss-dev libsqlite3-dev libopenblas-dev libcmocka-dev zlib1g-dev
  libmicrohttpd-dev libhiredis-dev
  slurm-wlm munge
  sqlite3 redis-server gnuplot-nox
  dataset-fashion-mnist
  bible-kjv-text bible-kjv fasttext wordnet-base
  dict-gcide
  python3-cffi python3-numpy python3-torch python3-pytest python3-pip python3-venv
  prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# No package may start its daemon here (slurmd, slurmctld, munged, redis-server): the tests start their own
# (scripts/slurm/up.sh), and a daemon that fails to start in a container would fail the install. Where the
# machine has no policy-rc.d, one that denies every start is in place for the install and removed after it.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod 0755 /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
