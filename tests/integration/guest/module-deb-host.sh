#!/bin/sh
# Runner side of guest_module_deb_installs_and_loads (tests/virtio_blk.rs):
# the guest driver installed the way users install out-of-tree modules,
# from its Debian package (`make -C guest-driver deb`), on the Debian root
# disk (resources/mkrootfs), then loaded from there.
#
#   module-deb-host.sh BIN KERNEL INITRD IMAGE DEB
#
# The cached image is copied into the runner's tmpfs and the package
# written into the copy's /root with debugfs (no mount). The guest boots
# from it with a vIOMMU and the DMA test device behind it (the disk is
# not behind it: the driver is loaded after the disk is in use), and
# guest/module-deb-guest.sh runs dpkg -i, modprobe and a DMA test.
bin=$1
kernel=$2
initrd=$3
image=$4
deb=$5
dir=$(mktemp -d)
img=$dir/root.img
cp --sparse=always "$image" "$img"
if ! debugfs -w -R "write $deb /root/vviommu-modules.deb" "$img" >"$dir/debugfs" 2>&1; then
    echo "HOST-DEB-WRITE rc=1 $(tail -n 1 "$dir/debugfs")"
fi
echo "HOST-DEB-WRITE bytes=$(stat -c %s "$deb")"
"$bin" --kernel "$kernel" --initramfs "$initrd" \
    --cmdline "console=ttyS0 quiet loglevel=3 panic=-1 root=/dev/vda rw guest_timeout=300" \
    --cpus boot=1 --memory size=512M --serial tty --disk "path=$img" \
    --iommu --dma-test iommu=on
rc=$?
e2fsck -fn "$img" >"$dir/fsck" 2>&1
echo "HOST-ROOTFS-FSCK rc=$? $(tail -n 1 "$dir/fsck")"
echo "VMM-EXIT rc=$rc"
rm -rf "$dir"
