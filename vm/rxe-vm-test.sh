#!/bin/bash
# make rxe-vm-test: build and boot the Soft-RoCE VM, run the verbs plugin's
# device tests, benchmark and certification inside it. Needs root (apt-get).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/kvfence-rxe}
GO=${GO:-go}
t0=$(date +%s)
mkdir -p "$OUT/debs"

# 1. host packages (Debian 12)
PKGS="qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest iproute2 libibverbs-dev kmod cpio gcc"
missing=""
for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"; done
if [ -n "$missing" ]; then
  [ "$(id -u)" = 0 ] || { echo "need root to install: $missing" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
fi

# 2. Debian's kernel package (downloaded, unpacked, not installed)
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
ls "$OUT"/debs/${KPKG}_*.deb >/dev/null 2>&1 || (cd "$OUT/debs" && apt-get download "$KPKG" >/dev/null)
KROOT=$OUT/kroot
[ -d "$KROOT/boot" ] || dpkg-deb -x "$(ls "$OUT"/debs/${KPKG}_*.deb | head -1)" "$KROOT"
KVER=$(ls "$KROOT/lib/modules" | head -1)
t1=$(date +%s)

# 3. Go binaries (cgo against libibverbs: -tags rdma)
B=$OUT/bin; rm -rf "$B"; mkdir -p "$B"
(cd "$ROOT" && CGO_ENABLED=1 $GO build -tags rdma -o "$B/kvfence-plugin-verbs" ./plugins/verbs/cmd/kvfence-plugin-verbs \
  && CGO_ENABLED=1 $GO test -c -tags rdma -o "$B/verbs.test" ./plugins/verbs \
  && $GO build -tags kvfenceunsafe -o "$B/kvfence" ./cmd/kvfence)  # the agents of the late-arrival step (its unsafe arm needs the tag)
if ! (cd "$ROOT" && $GO build -o "$B/kvfence-certify" ./vm/certify) 2>"$OUT/certify-build.log"; then
  cat "$OUT/certify-build.log" >&2; echo "FAIL: the conformance suite does not build (vm/certify)" >&2; exit 1; fi
t2=$(date +%s)

# 4. initramfs
bash "$ROOT/vm/initramfs.sh" "$OUT" "$KROOT" "$KVER"
t3=$(date +%s)

# 5. boot; results come back on a second virtio disk (a tar written by init)
rm -rf "$OUT/results"; mkdir -p "$OUT/results"
truncate -s 0 "$OUT/results.img"; truncate -s 64M "$OUT/results.img"
# vm ACCEL CPU TIMEOUT EXTRA_APPEND LOG: boot the VM; qemu's status in $q.
vm() {
  set +e
  timeout "$3" qemu-system-x86_64 -accel "$1" -machine q35 -cpu "$2" -smp "${SMP:-2}" -m "${MEM:-2048}" \
    -nographic -no-reboot -kernel "$OUT/vmlinuz" -initrd "$OUT/initrd.gz" \
    -append "console=ttyS0 quiet loglevel=4 panic=-1 $4" \
    -drive file="$OUT/results.img",format=raw,if=virtio \
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 -nic none </dev/null >"$5" 2>&1
  q=$?
  set -e
}
# KVM only after a short boot probe succeeds (the guest boots, runs init
# and reports through isa-debug-exit): on some hosts QEMU aborts under KVM
# ("failed to set MSR 0x10a") or the guest hangs silently. Otherwise TCG.
ACCEL=tcg CPU=max WHY="no writable /dev/kvm"
if [ -w /dev/kvm ]; then
  vm kvm host "${KVM_PROBE_TIMEOUT:-30}" "kvf.probe=1" "$OUT/kvm-probe.log"
  if [ "$q" = 1 ] && grep -q "KVF probe: guest booted" "$OUT/kvm-probe.log"; then ACCEL=kvm CPU=host WHY="boot probe passed"
  else WHY="KVM boot probe failed (qemu status $q, see $OUT/kvm-probe.log)"; fi
fi
echo "accelerator: $ACCEL (-cpu $CPU): $WHY"
truncate -s 0 "$OUT/results.img"; truncate -s 64M "$OUT/results.img"
vm $ACCEL $CPU "${VM_TIMEOUT:-1500}" "${GUEST_ARGS:-}" "$OUT/console.log"
t4=$(date +%s)
tar -xf "$OUT/results.img" -C "$OUT/results" 2>/dev/null || true
grep -E '^(KVF|=====|--- (PASS|FAIL|SKIP)|ok |FAIL|PASS|SKIP)' "$OUT/console.log" | grep -v '^=== RUN' | tail -80 || true
[ -f "$OUT/results/bw.txt" ] && cat "$OUT/results/bw.txt"
[ -f "$OUT/results/lat.txt" ] && cat "$OUT/results/lat.txt"
echo "timings: packages+kernel=$((t1-t0))s go=$((t2-t1))s initramfs=$((t3-t2))s vm=$((t4-t3))s total=$((t4-t0))s (accel=$ACCEL)"
# isa-debug-exit: qemu status = (guest status << 1) | 1
if [ $((q & 1)) = 1 ]; then rc=$((q >> 1)); echo "GUEST STATUS: $rc (0 = pass)"; exit $rc; fi
echo "GUEST STATUS: unknown (qemu exit $q: no isa-debug-exit write; timeout or crash); console: $OUT/console.log"
exit 125
