#!/usr/bin/env bash
# The kernel arithmetic (models/kernels/ops.h, quant.h, quant8.h: GGUF block unpacking and products, exact and with int8
# activations) built as every variant, AArch64 NEON included (cross-compiled, run under qemu-user), on the same inputs:
# every output must be bit-identical. The AArch64 builds need g++-aarch64-linux-gnu and qemu-user (Debian packages) and
# are skipped without them; prints one line per variant.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k="$here/../src/verispec/models/kernels"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
flags=(-O3 -std=c++17 -ffp-contract=off -fno-fast-math -I "$k")
g++ "${flags[@]}" -DVERISPEC_SCALAR "$here/kernel_harness.cpp" -o "$tmp/scalar" && "$tmp/scalar" > "$tmp/scalar.txt"
g++ "${flags[@]}" -DVERISPEC_AVX2 -mavx2 -mfma -mf16c "$here/kernel_harness.cpp" -o "$tmp/avx2"
g++ "${flags[@]}" -DVERISPEC_AVX512 -mavx512f -mavx512bw -mavx2 -mfma -mf16c "$here/kernel_harness.cpp" -o "$tmp/avx512"
g++ "${flags[@]}" -DVERISPEC_AVX512 -mavx512f -mavx512bw -mavx512vnni -mavx2 -mfma -mf16c "$here/kernel_harness.cpp" -o "$tmp/avx512-vnni"
g++ "${flags[@]}" -DVERISPEC_AVX512 -mavx512f -mavx512bw -mavx512vnni -mamx-tile -mamx-int8 -mavx2 -mfma -mf16c "$here/kernel_harness.cpp" -o "$tmp/avx512-amx"
arm=0
if command -v aarch64-linux-gnu-g++ > /dev/null && command -v qemu-aarch64 > /dev/null; then
  arm=1
  aarch64-linux-gnu-g++ "${flags[@]}" -static -DVERISPEC_NEON "$here/kernel_harness.cpp" -o "$tmp/neon"
  aarch64-linux-gnu-g++ "${flags[@]}" -static -DVERISPEC_SCALAR "$here/kernel_harness.cpp" -o "$tmp/scalar-arm"
fi
status=0
for v in avx2 avx512 avx512-vnni avx512-amx neon scalar-arm; do
  case $v in
    avx2) grep -qw avx2 /proc/cpuinfo || { echo "$v: skipped (CPU lacks it)"; continue; } ;;
    avx512) grep -qw avx512bw /proc/cpuinfo || { echo "$v: skipped (CPU lacks it)"; continue; } ;;
    avx512-vnni) grep -qw avx512_vnni /proc/cpuinfo || { echo "$v: skipped (CPU lacks it)"; continue; } ;;
    avx512-amx) grep -qw amx_int8 /proc/cpuinfo || { echo "$v: skipped (CPU lacks it)"; continue; } ;;
    neon|scalar-arm) [[ $arm == 1 ]] || { echo "$v: skipped (no aarch64-linux-gnu-g++ or qemu-aarch64)"; continue; } ;;
  esac
  if [[ $v == neon || $v == scalar-arm ]]; then qemu-aarch64 "$tmp/$v" > "$tmp/$v.txt"; else "$tmp/$v" > "$tmp/$v.txt"; fi
  if cmp -s "$tmp/scalar.txt" "$tmp/$v.txt"; then echo "$v: $(wc -l < "$tmp/$v.txt") values bit-identical to scalar"
  else echo "$v: DIFFERS from scalar ($(diff "$tmp/scalar.txt" "$tmp/$v.txt" | grep -c '^<') values)"; status=1; fi
done
exit $status
