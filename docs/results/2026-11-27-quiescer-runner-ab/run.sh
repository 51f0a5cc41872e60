#!/bin/sh
# alternate sticky / fence, 6 runs each, order per pair shuffled by $RANDOM parity
cd /work/main
for i in 1 2 3 4 5 6; do
  if [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) = 0 ]; then order="lead lead-fence"; else order="lead-fence lead"; fi
  for v in $order; do
    DMAVISOR_BIN=$PWD/build/dmavisor-$v DMAVISOR_CASES=net_dmavisor_viommu timeout 600 cargo test --release -p integration-tests --test virtio_net -- virtio_net_behind_viommu --nocapture > build/sticky-ab/$v-$i.log 2>&1
    echo "$v $i rc=$? $(grep -o 'invalidation batches ([0-9]* us)' build/sticky-ab/$v-$i.log) $(grep -o '"guest_to_host_MBps": [0-9.]*, "host_to_guest_MBps": [0-9.]*' build/sticky-ab/$v-$i.log) $(grep -o '[0-9]* invalidation batches' build/sticky-ab/$v-$i.log)"
  done
done
