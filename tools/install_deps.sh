#!/usr/bin/env bash
# Installs the Debian packages reel builds against, when any is missing. Called by the Makefile
# (through the build/.deps stamp), so a fresh machine needs nothing but `make`.
set -euo pipefail
packages=(g++ make libeigen3-dev googletest libgtest-dev libbenchmark-dev gnuplot-nox zlib1g-dev dataset-fashion-mnist fortunes openmpi-bin libopenmpi-dev nlohmann-json3-dev libdnnl-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install_deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
