#!/bin/sh
# The A/B of this folder: 6 pairs of virtio_net_behind_viommu, the sticky
# quiescer (build/dmavisor-lead) and the fence (build/dmavisor-lead-fence,
# a wrapper adding --quiescer-barrier fence), the order inside each pair
# drawn from /dev/urandom. Run from the repository's root; logs go to
# build/sticky-ab/.
set -u
mkdir -p build/sticky-ab
for i in 1 2 3 4 5 6; do
	if [ $(($(od -An -N1 -tu1 /dev/urandom) % 2)) = 0 ]; then
		order="lead lead-fence"
	else
		order="lead-fence lead"
	fi
	for v in $order; do
		log=build/sticky-ab/$v-$i.log
		DMAVISOR_BIN=$PWD/build/dmavisor-$v DMAVISOR_CASES=net_dmavisor_viommu \
			timeout 600 cargo test --release -p integration-tests --test virtio_net \
			-- virtio_net_behind_viommu --nocapture >"$log" 2>&1
		rc=$?
		echo "$v $i rc=$rc $(grep -o 'invalidation batches ([0-9]* us)' "$log")" \
			"$(grep -o '"guest_to_host_MBps": [0-9.]*, "host_to_guest_MBps": [0-9.]*' "$log")" \
			"$(grep -o '[0-9]* invalidation batches' "$log")"
	done
done
