#!/usr/bin/env bash
# Installs the Debian 12 packages carls-c needs, when they are missing (sudo when not root).
# Usage: scripts/setup.sh
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libzmq3-dev libczmq-dev libprotobuf-c-dev protobuf-c-compiler
  libfaiss-dev libsqlite3-dev libopenblas-dev libcmocka-dev zlib1g-dev
  libmicrohttpd-dev libhiredis-dev
  sqlite3 redis-server gnuplot-nox
  dataset-fashion-mnist
  bible-kjv-text bible-kjv fasttext
  dict-gcide
  prometheus python3-numpy
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
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
