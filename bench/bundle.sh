#!/usr/bin/env bash
# Packs what a built seqpar needs at run time, beyond the C library, into one tarball, so that the
# benchmarks and kernel tests run on an x86-64 Linux machine that has none of the packages (a
# lent machine with another CPU, say, where nothing can be installed): the shared libraries of
# build/seqpar, the tests and the bench tools (OpenBLAS, oneDNN, jansson, Open MPI and theirs) and
# Open MPI's plugin tree and launcher. Not needed by the build, the tests or CI.
#   bench/bundle.sh [BUILD] [OUT]   writes OUT (default bench/bundle/seqpar-runtime.tar.xz)
# On the other machine, from a copy of the repository with BUILD in it:
#   sudo tar -C / --no-overwrite-dir -xJf seqpar-runtime.tar.xz   (files under /opt/seqpar-runtime
#   and Open MPI's own paths /usr/lib/x86_64-linux-gnu/{openmpi,pmix2}, /usr/share/openmpi, /etc/openmpi)
#   . /opt/seqpar-runtime/env.sh    (LD_LIBRARY_PATH, PATH with mpirun, Open MPI's shared-memory transport)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-bench/bundle/seqpar-runtime.tar.xz}
[ -x "$BUILD/seqpar" ] || { echo "bundle: $BUILD/seqpar is missing: run 'make' (and 'make bench-tools') first" >&2; exit 1; }
L=/usr/lib/x86_64-linux-gnu
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
R=$stage/opt/seqpar-runtime
mkdir -p "$R/lib" "$R/bin" "$stage$L" "$stage/usr/share" "$stage/etc"
# every shared library the binaries and Open MPI's plugins load, except the C library's own
bins=("$BUILD/seqpar" "$BUILD"/tests/test_* "$BUILD"/bench/* "$L"/openmpi/lib/openmpi3/*.so "$L"/pmix2/lib/pmix/*.so /usr/bin/orted)
for f in $(ldd "${bins[@]}" 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u); do
    case $(basename "$f") in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | libz.so* | libudev.so*) ;;
    *) cp -L "$f" "$R/lib/" ;;
    esac
done
cp -a "$L/openmpi" "$L/pmix2" "$stage$L/"
cp -a /usr/share/openmpi "$stage/usr/share/"
cp -a /etc/openmpi "$stage/etc/"
cp -L /usr/bin/orted /usr/bin/orterun "$R/bin/"
ln -s orterun "$R/bin/mpirun"
cat >"$R/env.sh" <<'ENV'
# seqpar's carried runtime (bench/bundle.sh): source this file
export LD_LIBRARY_PATH=/opt/seqpar-runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/opt/seqpar-runtime/bin:$PATH
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mtl='^ofi,psm,psm2' OMPI_MCA_osc='^ucx'
ENV
mkdir -p "$(dirname "$OUT")"
tar -C "$stage" -cJf "$OUT" .
echo "bundle: $OUT ($(du -h "$OUT" | cut -f1)); libraries: $(ls "$R/lib" | wc -l)"
