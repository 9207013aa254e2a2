#!/usr/bin/env bash
# Installs the Debian packages Locus builds with (Debian 12). Idempotent; skips apt when all are present.
set -euo pipefail
pkgs=(build-essential cmake nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libyaml-cpp-dev
      libgtest-dev libgmock-dev libbenchmark-dev pkg-config)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
