#!/usr/bin/env bash
# Builds (once per machine) the Linux rxe peer the interop suite boots: Debian bookworm's own
# kernel (rdma_rxe) and rdma-core user space, as files qemu boots directly:
#   $CACHE/vmlinux            the kernel, uncompressed ELF (qemu's PVH entry: no BIOS, no xz)
#   $CACHE/initramfs.cpio.gz  static busybox + the virtio/ext4 modules that mount the root
#   $CACHE/root.img           ext4 (mkfs.ext4 -d, no loop mount) of a debootstrap minbase root
#                             with rdma-core, ibverbs-utils, rdmacm-utils, perftest
# CACHE is ${URDMA_INTEROP_CACHE:-/var/tmp/urdma-interop}, outside the checkout. A stamp of
# this script, guest/* and the kernel package rebuilds the images when any of them changes;
# an up-to-date cache costs a few seconds. Needs root and a Debian mirror on the first run
# (MIRROR, default: this host's own apt source).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${URDMA_INTEROP_CACHE:-/var/tmp/urdma-interop}
SUITE=bookworm
GUEST_PACKAGES="kmod iproute2 rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest procps"
say() { echo "[interop image] $*"; }

host_mirror() { # the host's own Debian source (deb822 or one-line format)
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources || true
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list || true
  } | awk '{print $2}' | grep -v -- '-security' | grep '/debian/\?$' | head -1 || true
}

kernel_package() { # what bookworm's linux-image-amd64 points to, unless KERNEL_PKG pins it
  local pkg=${KERNEL_PKG:-}
  [ -n "$pkg" ] || pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get update -qq
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  fi
  echo "$pkg"
}

fetch_kernel() { # fetch_kernel PKG: kernel/root holds the unpacked .deb, vmlinux its ELF image
  local pkg=$1 kver=${1#linux-image-}
  if [ ! -f "kernel/$kver.done" ]; then
    say "fetching $pkg"
    rm -rf kernel && mkdir -p kernel/debs
    (cd kernel/debs && apt-get download -o APT::Sandbox::User=root "$pkg")
    dpkg-deb -x kernel/debs/"$pkg"_*.deb kernel/root
    touch "kernel/$kver.done"
  fi
  [ -s vmlinux ] && [ vmlinux -nt "kernel/$kver.done" ] && return 0
  # The bzImage holds the kernel as an xz stream: unpack it to the ELF that PVH boots.
  local z=kernel/root/boot/vmlinuz-$kver off
  off=$(grep -aboF "$(printf '\xfd7zXZ')" "$z" | head -n1 | cut -d: -f1)
  tail -c +$((off + 1)) "$z" | xz -dc -q > vmlinux.tmp 2>/dev/null || true
  [ "$(head -c 4 vmlinux.tmp | od -An -tx1 | tr -d ' ')" = 7f454c46 ] ||
    { say "cannot unpack vmlinux from $z"; exit 1; }
  mv vmlinux.tmp vmlinux
}

debootstrap_root() {
  [ -f rootfs/.done ] && return 0
  local mirror=${MIRROR:-$(host_mirror)}
  [ -n "$mirror" ] || { say "no Debian apt source on this host; set MIRROR"; exit 1; }
  say "debootstrap $SUITE minbase + rdma-core (a few minutes, once)"
  rm -rf rootfs.tmp
  debootstrap --variant=minbase --include="$(echo $GUEST_PACKAGES | tr ' ' ',')" \
    "$SUITE" rootfs.tmp "$mirror" > debootstrap.log 2>&1 || { tail -20 debootstrap.log; exit 1; }
  rm -f rootfs.tmp/var/cache/apt/archives/*.deb
  touch rootfs.tmp/.done
  rm -rf rootfs && mv rootfs.tmp rootfs
}

install_modules() { # the kernel's modules minus hardware drivers a virtio guest never loads
  local kver=$1
  rm -rf "rootfs/lib/modules/$kver" && mkdir -p "rootfs/lib/modules/$kver"
  tar -C "kernel/root/lib/modules/$kver" \
    --exclude=./kernel/sound --exclude=./kernel/drivers/gpu --exclude=./kernel/drivers/media \
    --exclude=./kernel/drivers/net/wireless --exclude=./kernel/drivers/net/ethernet \
    --exclude=./kernel/drivers/staging --exclude=./kernel/drivers/infiniband/hw \
    --exclude=./kernel/drivers/usb --exclude=./kernel/drivers/bluetooth \
    --exclude=./kernel/net/wireless --exclude=./kernel/net/mac80211 \
    -cf - . | tar -C "rootfs/lib/modules/$kver" -xf -
  chroot rootfs depmod -a "$kver"
}

write_root_image() {
  install -m 0755 "$HERE/guest/init" rootfs/sbin/interop-init
  install -m 0755 "$HERE/guest/wait-listen" rootfs/usr/local/bin/wait-listen
  mkdir -p rootfs/mnt/ctl rootfs/mnt/build
  echo rxepeer > rootfs/etc/hostname
  : > rootfs/etc/resolv.conf
  local size_mb=$(( $(du -sm rootfs | cut -f1) * 5 / 4 + 128 ))
  rm -f root.img.tmp
  mkfs.ext4 -q -F -O ^has_journal -E root_owner=0:0 -d rootfs root.img.tmp "${size_mb}M"
  mv root.img.tmp root.img
}

write_initramfs() { # static busybox + virtio/ext4 modules in dependency order
  local kver=$1 m
  rm -rf initramfs && mkdir -p initramfs/{bin,dev,proc,sys,newroot,etc}
  cp /bin/busybox initramfs/bin/busybox
  install -m 0755 "$HERE/guest/initramfs-init" initramfs/init
  mknod -m 600 initramfs/dev/console c 5 1
  chroot rootfs modprobe -a -S "$kver" --show-depends crc32c_generic virtio_pci virtio_blk ext4 |
    awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' > initramfs/etc/insmod.list
  while read -r m; do
    mkdir -p "initramfs/$(dirname "$m")" && cp "rootfs/$m" "initramfs/$m"
  done < initramfs/etc/insmod.list
  (cd initramfs && find . | cpio -o -H newc --quiet | gzip -6) > initramfs.cpio.gz.tmp
  mv initramfs.cpio.gz.tmp initramfs.cpio.gz
}

main() {
  [ "$(id -u)" = 0 ] || { echo "image.sh needs root (debootstrap, chroot, mknod)" >&2; exit 1; }
  mkdir -p "$CACHE" && cd "$CACHE"
  # Two runs on one host share the cache: one builds, the other waits for it.
  exec 9> "$CACHE/.lock"
  flock 9
  local pkg kver stamp
  pkg=$(kernel_package)
  kver=${pkg#linux-image-}
  stamp=$(cat "$HERE/image.sh" "$HERE"/guest/* <(echo "$pkg $GUEST_PACKAGES") | sha256sum | cut -c1-16)
  if [ -s root.img ] && [ -s initramfs.cpio.gz ] && [ -s vmlinux ] &&
     [ "$(cat image.stamp 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  rm -f image.stamp
  # A changed package list needs a new root, not only new images.
  [ "$(cat rootfs/.packages 2>/dev/null)" = "$GUEST_PACKAGES" ] || rm -rf rootfs
  fetch_kernel "$pkg"
  debootstrap_root
  echo "$GUEST_PACKAGES" > rootfs/.packages
  install_modules "$kver"
  write_root_image
  write_initramfs "$kver"
  echo "$stamp" > image.stamp
  say "built $CACHE ($pkg; $(chroot rootfs dpkg-query -W -f='${Package} ${Version} ' rdma-core perftest))"
}
main "$@"
