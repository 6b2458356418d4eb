#!/usr/bin/env bash
# Installs what weft needs from Debian 12's packages, only what is missing. Needs root for apt-get.
set -euo pipefail
packages=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libjansson-dev
          libyaml-dev libpcre2-dev libopenmpi-dev openmpi-bin gnuplot-nox python3 python3-torch
          python3-numpy clang libclang-rt-14-dev) # clang: the fuzz targets (make fuzz)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "weft: error: missing packages (${missing[*]}); run this script as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Tests compare against Hugging Face `tokenizers` (the BPE test) and `transformers` (greedy
# generation, the CPU generation benchmark) from PyPI, for the Python that has Debian's torch 1.13:
# transformers 4.45.2 is the last to run on it, and it wants tokenizers below 0.21.
if ! /usr/bin/python3 -c "import transformers, tokenizers" 2>/dev/null; then
  dpkg-query -W -f='${Status}' python3-pip 2>/dev/null | grep -q "install ok installed" ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip
  /usr/bin/python3 -m pip install -q --break-system-packages "tokenizers==0.20.3" \
    "transformers==4.45.2"
fi
