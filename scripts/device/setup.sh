# Source THERE (the GPU machine, no network), in or outside the repo root:
#   source scripts/device/setup.sh
# For each of weft's build dependencies, uses the system's copy when it works; otherwise unpacks
# the Debian 12 .debs that scripts/device/prepare.sh put in .devkit/ into a private prefix
# ($WEFT_KIT_PREFIX, default /opt/weftkit; never /) and exports what CMake and the runtime need:
# PATH, LD_LIBRARY_PATH (appended: only sonames the system lacks are linked into $K/rt),
# PKG_CONFIG_PATH (the kit's .pc files rewritten to the prefix), OPAL_* for the relocated OpenMPI,
# NCCL_HOME, and WEFT_CMAKE_ARGS (extra cmake -D options, space-separated) for build.sh.
# Prints one line per dependency: system, kit or MISSING. Returns non-zero if one is MISSING.
# Sourced, so no `set -e` here (it would outlive this file in an interactive shell).

weft_setup() {
  local repo kit K man missing=0 c p role deb libs f n
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  kit=$repo/.devkit
  K=${WEFT_KIT_PREFIX:-/opt/weftkit}
  man=$kit/manifest.tsv
  WEFT_CMAKE_ARGS=""
  local -A use_kit=() unpacked=() have=()
  _weft_ld() { case ":${LD_LIBRARY_PATH:-}:" in *":$1:"*) ;; *) export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$1 ;; esac; }
  _weft_say() { printf '  %-9s %-7s %s\n' "$1" "$2" "${3:-}"; }
  _weft_cc() { # _weft_cc SOURCE ARGS...: compiles and links a C program with the system's gcc
    local d; d=$(mktemp -d)
    printf '%s\n' "$1" >"$d/t.c"; shift
    "${CC:-$(command -v cc || echo gcc)}" "$d/t.c" -o "$d/t" "$@" >/dev/null 2>&1; local rc=$?
    rm -rf "$d"; return $rc
  }
  _weft_unpack() { # _weft_unpack PACKAGE: its .deb from the manifest into $K
    [ -n "${unpacked[$1]:-}" ] && return 0
    local deb; deb=$(awk -F'\t' -v p="$1" '$1 == p { print $3 }' "$man")
    [ -n "$deb" ] || { echo "weft setup: $1 is not in $man" >&2; return 1; }
    if [ ! -e "$K/.unpacked/$deb" ]; then # once per prefix
      mkdir -p "$K/.unpacked" || return 1
      if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$kit/debs/$deb" "$K" || return 1
      else (cd "$(mktemp -d)" && ar x "$kit/debs/$deb" && tar -xf data.tar.* -C "$K") || return 1
      fi
      touch "$K/.unpacked/$deb"
    fi
    unpacked[$1]=1
  }

  if ! mkdir -p "$K" 2>/dev/null || [ ! -w "$K" ]; then K=/tmp/weftkit; mkdir -p "$K" || return 1; fi
  echo "weft setup: kit prefix $K"
  # Sourced again: drop the kit's earlier exports first, so that the checks below see the system.
  _weft_strip() { local IFS=: e out=""; for e in $1; do [[ $e == "$K"/* ]] || out=${out:+$out:}$e; done; echo "$out"; }
  PATH=$(_weft_strip "$PATH"); LD_LIBRARY_PATH=$(_weft_strip "${LD_LIBRARY_PATH:-}")
  PKG_CONFIG_PATH=$(_weft_strip "${PKG_CONFIG_PATH:-}")
  for n in $(compgen -e | grep -E '^(OPAL|PMIX)_'); do [[ ${!n} == "$K"/* ]] && unset "$n"; done
  [[ ${NCCL_HOME:-} == "$K"/* ]] && unset NCCL_HOME
  local glibc; glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}') || glibc=""
  if [ -n "$glibc" ] && [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | head -1)" != 2.36 ]; then
    echo "weft setup: WARNING: glibc $glibc is older than Debian 12's 2.36; kit libraries may not load" >&2
  fi

  _weft_apply() { # unpacks the kit components in use_kit and links missing sonames into $K/rt
    [ ${#use_kit[@]} -gt 0 ] || return 0
    [ -s "$man" ] || { echo "weft setup: MISSING .devkit (run scripts/device/prepare.sh here, carry .devkit there)" >&2; return 1; }
    mkdir -p "$K/rt" "$K/bin" "$K/pkgconfig" || return 1
    # Every package of a kit component, then every library of the closure whose soname the
    # system lacks (ldconfig's cache), linked into $K/rt; OpenMPI's own always (one build's set).
    while IFS=$'\t' read -r p role deb libs; do
      [ -n "${use_kit[$role]:-}" ] && { _weft_unpack "$p" || return 1; }
    done <"$man"
    while IFS=$'\t' read -r p role deb libs; do
      [ "$libs" = - ] && continue
      [ "$role" = lib ] || [ -n "${use_kit[$role]:-}" ] || continue
      for f in ${libs//,/ }; do
        n=${f##*/}
        if [ -z "${have[$n]:-}" ] || { [ "$role" = mpi ] && [ -n "${use_kit[mpi]:-}" ]; }; then
          _weft_unpack "$p" || return 1
          ln -sfn "$K/$f" "$K/rt/$n"
        fi
      done
    done <"$man"
    _weft_ld "$K/rt"
    case ":$PATH:" in *":$K/bin:"*) ;; *) export PATH=$K/bin:$PATH ;; esac
  }
  while read -r n; do have[$n]=1; done < <({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | awk '/=>/ {print $1}')

  # Which dependencies the system lacks: pkg-config first, since it answers for three others.
  if ! command -v pkg-config >/dev/null; then
    use_kit[pkgconf]=1; _weft_apply || return 1
    ln -sfn "$K/usr/bin/pkgconf" "$K/bin/pkg-config"
  fi
  pkg-config --exists jansson 2>/dev/null || use_kit[jansson]=1
  pkg-config --exists yaml-0.1 2>/dev/null || use_kit[yaml]=1
  pkg-config --exists libpcre2-8 2>/dev/null || use_kit[pcre2]=1
  # As CMakeLists.txt looks: libopenblas in openblas-openmp/ or the default paths, cblas.h on
  # the default include path.
  if ! _weft_cc '#include <cblas.h>
int main(void) { float a = 1, c = 0; cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1, &a, 1, &a, 1, 0, &c, 1); return c != 1; }' \
       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas; then
    use_kit[blas]=1
  fi
  if ! command -v mpicc >/dev/null || ! mpicc --showme:link >/dev/null 2>&1; then use_kit[mpi]=1; fi
  _weft_apply || return 1

  if [ -n "${use_kit[pkgconf]:-}" ]; then
    pkg-config --version >/dev/null 2>&1 && _weft_say pkg-config kit "$(pkg-config --version)" || { _weft_say pkg-config MISSING; missing=1; }
  else _weft_say pkg-config system "$(command -v pkg-config)"; fi

  local mod
  for c in jansson yaml pcre2; do
    case $c in jansson) mod=jansson ;; yaml) mod=yaml-0.1 ;; pcre2) mod=libpcre2-8 ;; esac
    if [ -n "${use_kit[$c]:-}" ]; then
      sed -E "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=$K/usr#" \
        "$K/usr/lib/x86_64-linux-gnu/pkgconfig/$mod.pc" >"$K/pkgconfig/$mod.pc" || return 1
      case ":${PKG_CONFIG_PATH:-}:" in *":$K/pkgconfig:"*) ;; *) export PKG_CONFIG_PATH=$K/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} ;; esac
      pkg-config --exists "$mod" && _weft_say "$c" kit "$(pkg-config --modversion "$mod")" || { _weft_say "$c" MISSING; missing=1; }
    else _weft_say "$c" system "$(pkg-config --modversion "$mod" 2>/dev/null)"; fi
  done

  if [ -n "${use_kit[blas]:-}" ]; then
    local bl=$K/usr/lib/x86_64-linux-gnu/openblas-openmp bi=$K/usr/include/x86_64-linux-gnu/openblas-openmp
    WEFT_CMAKE_ARGS+=" -DOPENBLAS_LIB=$bl/libopenblas.so -DCMAKE_C_FLAGS=-I$bi"
    [ -e "$bl/libopenblas.so" ] && [ -e "$bi/cblas.h" ] && _weft_say openblas kit "0.3.21 (OpenMP)" || { _weft_say openblas MISSING; missing=1; }
  else _weft_say openblas system; fi

  if [ -n "${use_kit[mpi]:-}" ]; then
    # Debian's OpenMPI relocated: its installdirs follow OPAL_*; sysconfdir keeps Debian's MCA
    # defaults (no UCX/OFI/openib); PMIx (Debian's prefix /usr/lib/<triplet>/pmix2) follows PMIX_*.
    local L=$K/usr/lib/x86_64-linux-gnu
    export OPAL_PREFIX=$K/usr OPAL_EXEC_PREFIX=$K/usr OPAL_BINDIR=$K/usr/bin OPAL_LIBDIR=$L/openmpi/lib \
      OPAL_INCLUDEDIR=$L/openmpi/include OPAL_PKGINCLUDEDIR=$L/openmpi/include/openmpi OPAL_DATADIR=$K/usr/share OPAL_DATAROOTDIR=$K/usr/share \
      OPAL_PKGDATADIR=$K/usr/share/openmpi OPAL_PKGLIBDIR=$L/openmpi/lib/openmpi3 \
      OPAL_SYSCONFDIR=$K/etc/openmpi
    export PMIX_PREFIX=$L/pmix2 PMIX_EXEC_PREFIX=$L/pmix2 PMIX_LIBDIR=$L/pmix2/lib \
      PMIX_DATADIR=$L/pmix2/share PMIX_PKGDATADIR=$L/pmix2/share/pmix PMIX_PKGLIBDIR=$L/pmix2/lib/pmix \
      PMIX_SYSCONFDIR=$L/pmix2/share PMIX_MCA_mca_base_component_path=$L/pmix2/lib/pmix
    # Plugins for fabrics this machine lacks (OFI, PSM) fail to open: not worth a line per process.
    export OMPI_MCA_mca_base_component_show_load_errors=0
    for f in mpicc mpirun mpiexec; do ln -sfn "$K/usr/bin/$f.openmpi" "$K/bin/$f"; done
    ln -sfn "$K/usr/bin/ompi_info" "$K/bin/ompi_info"
    WEFT_CMAKE_ARGS+=" -DMPI_C_COMPILER=$K/bin/mpicc -DMPIEXEC_EXECUTABLE=$K/bin/mpirun"
    mpicc --showme:link >/dev/null 2>&1 && _weft_say mpi kit "OpenMPI 4.1.4 ($(mpicc --showme:link))" || { _weft_say mpi MISSING; missing=1; }
  else _weft_say mpi system "$(command -v mpicc)"; fi
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  # OpenMPI's mpirun refuses to start, even on one node, when neither ssh nor rsh exists.
  command -v ssh >/dev/null || command -v rsh >/dev/null || export OMPI_MCA_plm_rsh_agent=false

  if _weft_cc '#include <omp.h>
int main(void) { return omp_get_max_threads() < 1; }' -fopenmp; then _weft_say openmp system
  else _weft_say openmp MISSING "gcc -fopenmp fails (the kit cannot supply omp.h for this gcc)"; missing=1; fi

  # CUDA and NCCL, unless WEFT_CUDA=OFF. weft's CMake looks for nccl.h in CUDA's include dirs and
  # $NCCL_HOME/include, and for libnccl.so (unversioned) in CUDA's lib dir and $NCCL_HOME/lib.
  if [ "${WEFT_CUDA:-ON}" != OFF ]; then
    local nvcc cu hdr="" lib="" tl nh=${NCCL_HOME:-}
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || nvcc=""
    if [ -n "$nvcc" ]; then _weft_say cuda system "$nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
    else _weft_say cuda MISSING "no nvcc"; missing=1; fi
    cu=$(dirname "$(dirname "${nvcc:-/usr/local/cuda/bin/nvcc}")")
    # CMake leaves CUDA's lib dir out of the binaries' RPATH (an implicit link directory).
    if ! printf '%s\n' "${!have[@]}" | grep -q '^libcublasLt\.so\.'; then
      for f in "$cu"/lib64 "$cu"/targets/x86_64-linux/lib "$cu"/lib; do
        if ls "$f"/libcublasLt.so.* >/dev/null 2>&1; then
          echo "weft setup: CUDA's libraries are not in ld.so.cache: appending $f to LD_LIBRARY_PATH"
          _weft_ld "$f"; break
        fi
      done
    fi
    tl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__ or "") or list(nvidia.nccl.__path__)[0])' 2>/dev/null) || tl=""
    for f in ${nh:+$nh/include/nccl.h} "$cu"/include/nccl.h "$cu"/targets/x86_64-linux/include/nccl.h \
             /usr/include/nccl.h ${tl:+$tl/include/nccl.h} "$kit/nccl/include/nccl.h"; do
      [ -s "$f" ] && { hdr=$(readlink -f "$f"); break; }
    done
    for f in ${nh:+$nh/lib/libnccl.so.2} "$cu"/lib64/libnccl.so.2 "$cu"/targets/x86_64-linux/lib/libnccl.so.2 \
             $(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF}') ${tl:+$tl/lib/libnccl.so.2}; do
      [ -e "$f" ] && { lib=$(readlink -f "$f"); break; }
    done
    if [ -z "$hdr" ] || [ -z "$lib" ]; then
      echo "weft setup: !!!!! NCCL MISSING: nccl.h ${hdr:-not found}, libnccl.so.2 ${lib:-not found}; weft builds without NCCL (one GPU per job) !!!!!" >&2
      _weft_say nccl MISSING
    else
      mkdir -p "$K/nccl/include" "$K/nccl/lib" || return 1
      ln -sfn "$hdr" "$K/nccl/include/nccl.h"
      ln -sfn "$lib" "$K/nccl/lib/libnccl.so.2"; ln -sfn "$lib" "$K/nccl/lib/libnccl.so"
      export NCCL_HOME=$K/nccl
      WEFT_CMAKE_ARGS+=" -DNCCL_INCLUDE_DIR=$K/nccl/include -DNCCL_LIBRARY=$K/nccl/lib/libnccl.so"
      _weft_ld "$K/nccl/lib"
      local hv lv
      hv=$(awk '/#define NCCL_VERSION_CODE/ {print $3}' "$hdr")
      lv=$(python3 -c 'import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int(); l.ncclGetVersion(ctypes.byref(v)); print(v.value)' "$lib" 2>/dev/null) || lv=""
      _weft_say nccl "$( [ "$hdr" = "$(readlink -f "$kit/nccl/include/nccl.h")" ] && echo kit || echo system)" "header $hdr ($hv), library $lib (${lv:-?})"
      [ -n "$lv" ] && [ "$hv" != "$lv" ] && echo "weft setup: note: nccl.h $hv != libnccl $lv (fine if weft uses no newer API)" >&2
    fi
  fi
  export WEFT_CMAKE_ARGS WEFT_KIT_PREFIX=$K
  [ ${#use_kit[@]} -gt 0 ] && echo "weft setup: from the kit: ${!use_kit[*]}; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  return $missing
}
weft_setup
