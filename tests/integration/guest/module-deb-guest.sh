#!/bin/sh
# Guest side of guest_module_deb_installs_and_loads: run by the root
# disk's systemd (dmavisor-test.service). Installs the guest driver's
# Debian package with dpkg (its postinst runs depmod), loads vviommu with
# modprobe from the package's path, then vvi_edu, and runs one DMA test
# through the vIOMMU. One line of results: GUEST-MODULE-DEB.
kver=$(uname -r)
dpkg -i /root/vviommu-modules.deb >/tmp/dpkg.log 2>&1
dpkg_rc=$?
[ "$dpkg_rc" = 0 ] || sed 's/^/GUEST-DPKG: /' /tmp/dpkg.log
status=$(dpkg-query -W -f='${Status}' "vviommu-modules-$kver" 2>/dev/null | tr ' ' _)
path=$(modinfo -n vviommu 2>/dev/null)
modprobe vviommu policy=magazine invalidation=strict 2>/tmp/modprobe.err
modprobe_rc=$?
[ "$modprobe_rc" = 0 ] || sed 's/^/GUEST-MODPROBE: /' /tmp/modprobe.err
loaded=0
[ -d /sys/module/vviommu ] && loaded=1
modprobe vvi_edu 2>/dev/null
edu_rc=$?
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug
dma_ok=""
if [ -e /sys/kernel/debug/vvi_edu/dmatest ]; then
    echo run >/sys/kernel/debug/vvi_edu/dmatest
    while read -r line; do
        case "$line" in dma_ok=*) dma_ok=${line#dma_ok=} ;; esac
    done </sys/kernel/debug/vvi_edu/dmatest
fi
bound=$(dmesg | grep -c 'vviommu.*virtio-iommu: pages')
echo "GUEST-MODULE-DEB kver=$kver dpkg_rc=$dpkg_rc status=$status path=$path modprobe_rc=$modprobe_rc loaded=$loaded edu_rc=$edu_rc dma_ok=$dma_ok bound=$bound"
