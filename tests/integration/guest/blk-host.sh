#!/bin/sh
# Runner side of the virtio-blk tests (tests/virtio_blk.rs): make a raw
# image of 8 MiB with a known pattern in a fresh directory, boot the guest
# (guest/blk-guest.sh) with it as its disk, then print the image's MD5s.
#
#   blk-host.sh dmavisor BIN KERNEL INITRD          (num_queues=2)
#   blk-host.sh dmavisor-viommu BIN KERNEL INITRD   (--iommu, iommu=on,
#       the guest's in-tree driver strict: iommu.strict=1)
#   blk-host.sh dmavisor-ro BIN KERNEL INITRD       (readonly=on)
#   blk-host.sh qemu - KERNEL INITRD                (virtio-blk-pci, raw)
#   blk-host.sh qemu-viommu - KERNEL INITRD         (the same behind
#       virtio-iommu-pci, the guest strict)
#
# HOST-IMG lines: md5 of the whole image, of its first MiB (what the guest
# reads first) and of the 4 MiB at 1 MiB (what the guest writes).
mode=$1
bin=$2
kernel=$3
initrd=$4
dir=$(mktemp -d)
img=$dir/disk.raw
yes "dmavisor virtio-blk test image" | head -c 8388608 > "$img"

sums() {
    echo "$1 size=$(stat -c %s "$img") md5_all=$(md5sum < "$img" | cut -d' ' -f1)" \
        "md5_head=$(head -c 1048576 "$img" | md5sum | cut -d' ' -f1)" \
        "md5_written=$(dd if="$img" bs=1M skip=1 count=4 2>/dev/null | md5sum | cut -d' ' -f1)"
}
sums HOST-IMG-BEFORE

cmdline="console=ttyS0 quiet loglevel=3 panic=-1"
vm() {
    "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline $1" \
        --cpus boot=2 --memory size=512M --serial tty --disk "$2" $3
    echo "VMM-EXIT rc=$?"
}

case "$mode" in
dmavisor)
    vm "blk_mode=rw" "path=$img,num_queues=2"
    ;;
dmavisor-viommu)
    # -v: the vIOMMU's request counts at exit.
    vm "blk_mode=rw iommu.strict=1" "path=$img,iommu=on" "--iommu -v"
    ;;
dmavisor-ro)
    vm "blk_mode=ro" "path=$img,readonly=on"
    ;;
qemu|qemu-viommu)
    iommu=""
    platform=""
    extra=""
    if [ "$mode" = qemu-viommu ]; then
        iommu="-device virtio-iommu-pci"
        platform=",iommu_platform=on"
        extra="iommu.strict=1"
    fi
    # shellcheck disable=SC2086
    qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp 2 -m 512 \
        -nographic -nodefaults -no-reboot -serial stdio \
        -kernel "$kernel" -initrd "$initrd" -append "$cmdline blk_mode=rw $extra" \
        -drive "file=$img,format=raw,if=none,id=d0" $iommu \
        -device "virtio-blk-pci,drive=d0,disable-legacy=on$platform"
    echo "VMM-EXIT rc=$?"
    ;;
*)
    echo "unknown mode $mode"
    ;;
esac

sums HOST-IMG-AFTER
rm -rf "$dir"
