#!/usr/bin/env bash
# Run HERE (Debian 12 amd64, internet to Debian's mirrors and PyPI), as root, in the repo root:
#   bash scripts/device/prepare.sh
# Fills .devkit/ (git-ignored) with what weft needs to build and run on the GPU machine, which has
# no network: Debian 12 .debs of OpenMPI, OpenBLAS (OpenMP build), jansson, libyaml, PCRE2 and
# pkgconf with their runtime library closure, a manifest, and NCCL's header. On the device,
# scripts/device/setup.sh unpacks only what that system lacks, into a private prefix.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=.devkit
NCCL_VERSION=2.28.9 # the nvidia-nccl-cu13 that torch 2.11.0 pins (the device's torch)

. /etc/os-release
if [ "${ID:-}" != debian ] || [ "${VERSION_ID:-}" != 12 ] || [ "$(dpkg --print-architecture)" != amd64 ]; then
  echo "prepare.sh: needs Debian 12 amd64 (the .debs must match what setup.sh expects)" >&2
  exit 1
fi

# Component -> the packages that provide it (headers, .pc files, tools, the library itself).
declare -A CORE=(
  [mpi]="libopenmpi3 openmpi-bin openmpi-common libopenmpi-dev"
  [blas]="libopenblas0-openmp libopenblas-openmp-dev"
  [jansson]="libjansson4 libjansson-dev"
  [yaml]="libyaml-0-2 libyaml-dev"
  [pcre2]="libpcre2-8-0 libpcre2-dev"
  [pkgconf]="pkgconf pkgconf-bin libpkgconf3"
)
# Runtime dependencies not followed: what every Linux system has, package machinery, and
# optional plugins (hwloc's, ibverbs providers: dlopen'ed, absent is fine) and ssh (only for
# remote launch). The -dev packages' own dependencies are never followed: their headers do not
# include other packages' headers.
SKIP=" libc6 libgcc-s1 libstdc++6 zlib1g gcc-12-base debconf cdebconf dpkg adduser passwd tar
  install-info perl-base libcrypt1 libselinux1 libzstd1 liblzma5 libbz2-1.0 libcap2 libtinfo6
  libssl3 openssh-client libhwloc-plugins ibverbs-providers libc-dev libc6-dev "
dev_pkg() { case "$1" in *-dev) return 0 ;; esac; return 1; }

# Breadth-first over Depends/Pre-Depends of the runtime packages: an alternative group is
# satisfied by a skipped member, else its first real package is taken.
declare -A SEEN=()
queue=()
for c in "${!CORE[@]}"; do for p in ${CORE[$c]}; do queue+=("$p"); SEEN[$p]=1; done; done
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}; queue=("${queue[@]:1}")
  dev_pkg "$p" && continue
  # One line per alternative group: "a|b|c".
  groups=$(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" | awk '
    /^ [ |](Pre)?Depends:/ { alt = ($1 ~ /^\|/); sub(/^ [ |](Pre)?Depends: /, "");
                             g = g (g == "" ? "" : "|") $0; if (!alt) { print g; g = "" } }')
  while IFS= read -r g; do
    [ -n "$g" ] || continue
    pick=""
    IFS='|' read -ra alts <<<"$g"
    for a in "${alts[@]}"; do
      a=${a%%:any}
      if [[ "$SKIP" == *" $a "* ]]; then pick=""; break; fi
      if [ -z "$pick" ] && [[ "$a" != \<* ]]; then pick=$a; fi
    done
    if [ -n "$pick" ] && [ -z "${SEEN[$pick]:-}" ] && [[ "$SKIP" != *" $pick "* ]]; then
      SEEN[$pick]=1; queue+=("$pick")
    fi
  done <<<"$groups"
done

rm -rf "$KIT/debs" && mkdir -p "$KIT/debs" "$KIT/nccl/include"
echo "downloading ${#SEEN[@]} packages"
(cd "$KIT/debs" && apt-get -o APT::Sandbox::User=root download -q "${!SEEN[@]}" >/dev/null)

# manifest.tsv: package, role (a component, or "lib" for the closure), .deb file, the shared
# libraries it holds, as paths lib*.so.N under / (comma-separated, "-" for none). setup.sh reads only this.
role_of() { for c in "${!CORE[@]}"; do [[ " ${CORE[$c]} " == *" $1 "* ]] && { echo "$c"; return; }; done; echo lib; }
{
  for deb in "$KIT"/debs/*.deb; do
    p=$(dpkg-deb -f "$deb" Package)
    sonames=-
    if ! dev_pkg "$p"; then # files and links named lib*.so.N, skipping dlopen'ed plugins
      sonames=$(dpkg-deb -c "$deb" | awk '{ print ($(NF-1) == "->") ? $(NF-2) : $NF }' |
                grep -E '/lib[^/]*\.so\.[0-9]+$' | grep -v '/mca_\|/hwloc/\|/pmix/\|/ucx/\|/rsocket/' |
                sed 's|^\./||' | sort -u | paste -sd, -) || true
    fi
    printf '%s\t%s\t%s\t%s\n' "$p" "$(role_of "$p")" "$(basename "$deb")" "${sonames:--}"
  done
} >"$KIT/manifest.tsv"

# NCCL's header, for a device whose torch wheel and CUDA toolkit lack one (the 190 MiB library is
# not carried: the device's torch has libnccl.so.2).
if [ ! -s "$KIT/nccl/include/nccl.h" ] || ! grep -q "NCCL_VERSION_CODE $(echo $NCCL_VERSION | awk -F. '{printf "%d%02d%02d", $1, $2, $3}')" "$KIT/nccl/include/nccl.h"; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_18_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-nccl-cu13==$NCCL_VERSION"
  unzip -p "$tmp"/nvidia_nccl_cu13-*.whl nvidia/nccl/include/nccl.h >"$KIT/nccl/include/nccl.h"
  rm -rf "$tmp"
fi

grep -qx '/.devkit/' .gitignore 2>/dev/null || echo '/.devkit/' >>.gitignore
column -t -s $'\t' "$KIT/manifest.tsv" | cut -c1-150
echo "kit: $(ls "$KIT"/debs | wc -l) .debs + nccl.h ($NCCL_VERSION); total $(du -sh "$KIT" | cut -f1)"
echo "on the device: carry .devkit and run  bash scripts/device/session.sh all"
