#!/usr/bin/env bash
# The kernel arithmetic (models/kernels/ops.h, quant.h: GGUF block unpacking and products) built as every variant, AArch64 NEON included
# (cross-compiled, run under qemu-user), on the same inputs: every output must be bit-identical.
# Needs g++-aarch64-linux-gnu and qemu-user (Debian packages); prints one line per variant.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k="$here/../src/verispec/models/kernels"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
flags=(-O3 -std=c++17 -ffp-contract=off -fno-fast-math -I "$k")
g++ "${flags[@]}" -DVERISPEC_SCALAR "$here/kernel_harness.cpp" -o "$tmp/scalar" && "$tmp/scalar" > "$tmp/scalar.txt"
g++ "${flags[@]}" -DVERISPEC_AVX2 -mavx2 -mfma -mf16c "$here/kernel_harness.cpp" -o "$tmp/avx2"
g++ "${flags[@]}" -DVERISPEC_AVX512 -mavx512f -mavx2 -mfma -mf16c "$here/kernel_harness.cpp" -o "$tmp/avx512"
aarch64-linux-gnu-g++ "${flags[@]}" -static -DVERISPEC_NEON "$here/kernel_harness.cpp" -o "$tmp/neon"
aarch64-linux-gnu-g++ "${flags[@]}" -static -DVERISPEC_SCALAR "$here/kernel_harness.cpp" -o "$tmp/scalar-arm"
status=0
for v in avx2 avx512 neon scalar-arm; do
  case $v in
    avx2) grep -qw avx2 /proc/cpuinfo || { echo "$v: skipped (CPU lacks it)"; continue; } ;;
    avx512) grep -qw avx512f /proc/cpuinfo || { echo "$v: skipped (CPU lacks it)"; continue; } ;;
  esac
  if [[ $v == neon || $v == scalar-arm ]]; then qemu-aarch64 "$tmp/$v" > "$tmp/$v.txt"; else "$tmp/$v" > "$tmp/$v.txt"; fi
  if cmp -s "$tmp/scalar.txt" "$tmp/$v.txt"; then echo "$v: $(wc -l < "$tmp/$v.txt") values bit-identical to scalar"
  else echo "$v: DIFFERS from scalar ($(diff "$tmp/scalar.txt" "$tmp/$v.txt" | grep -c '^<') values)"; status=1; fi
done
exit $status
