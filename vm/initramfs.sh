#!/bin/bash
# initramfs.sh OUT KROOT KVER: busybox + iproute2/rdma/perftest + the rxe
# provider + the kernel modules + our binaries and guest scripts.
set -euo pipefail
OUT=$1 KROOT=$2 KVER=$3
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$KROOT/lib/modules/$KVER/modules.dep" ] || depmod -b "$KROOT" "$KVER"
cp "$KROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
S=$OUT/root; rm -rf "$S"
mkdir -p "$S"/{bin,sbin,proc,sys,dev,tmp,run,etc,root,results} "$S"/usr/{bin,sbin,lib/x86_64-linux-gnu,lib64}
ln -s usr/lib "$S/lib"; ln -s usr/lib64 "$S/lib64"
cp /bin/busybox "$S/bin/busybox"
ln -s /bin/busybox "$S/sbin/modprobe"
L=$S/usr/lib/x86_64-linux-gnu
put() {  # put FILE DEST-DIR: a binary and the shared libraries it needs
  [ -n "$2" ] && cp -L "$1" "$S$2/"
  ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r lib; do
    case $lib in */ld-linux-x86-64.so.2) t=$S/usr/lib64;; *) t=$L;; esac
    [ -e "$t/$(basename "$lib")" ] || cp -L "$lib" "$t/"
  done
}
for b in /usr/sbin/ip /usr/sbin/tc; do put $b /usr/sbin; done
for b in /usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ib_write_bw /usr/bin/ib_write_lat "$OUT"/bin/*; do put "$b" /usr/bin; done
mkdir -p "$L/libibverbs" "$S/etc/libibverbs.d"
cp -L /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so "$L/libibverbs/"
put "$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)" ""
cp /etc/libibverbs.d/rxe.driver "$S/etc/libibverbs.d/"
cp -L /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 "$L/"   # glibc dlopens it (pthread_exit)
[ -d /usr/lib/tc ] && cp -a /usr/lib/tc "$S/usr/lib/"  # netem distribution tables
echo "root:x:0:0:root:/root:/bin/sh" > "$S/etc/passwd"
echo "127.0.0.1 localhost" > "$S/etc/hosts"
# modules in dependency order; rdma_rxe needs the crc32 shash at run time
: > "$S/etc/modules.order"
for m in virtio_pci virtio_blk veth sch_netem crc32_generic crc32-pclmul rdma_rxe; do
  modprobe -d "$KROOT" -S "$KVER" --show-depends $m | awk '$1=="insmod"{print $2}' | while read -r p; do
    rel=${p#$KROOT/}; mkdir -p "$S/$(dirname "$rel")"; cp "$p" "$S/$rel"
    grep -qx "/$rel" "$S/etc/modules.order" || echo "/$rel" >> "$S/etc/modules.order"
  done
done
install -m 755 "$HERE/init" "$S/init"
install -m 755 "$HERE/guest.sh" "$S/guest.sh"
install -m 755 "$HERE/late-arrival.sh" "$S/late-arrival.sh"
(cd "$S" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$OUT/initrd.gz"
echo "initramfs: $(du -h "$OUT/initrd.gz" | cut -f1) kernel $KVER"
