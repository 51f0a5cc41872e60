#!/bin/sh
# Guest script for api_socket_endpoints (tests/boot.rs): say that userspace
# is up, then idle until the VMM is shut down through its API.
echo "GUEST-IDLE cpus=$(grep -c '^processor' /proc/cpuinfo)"
sleep 600
