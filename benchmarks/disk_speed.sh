#!/bin/sh
# The disk under a directory, as the chunk store uses it: 1 GiB written and fsynced, then read back
# around the page cache (O_DIRECT). Figures quoted beside the tiered-memory benchmarks.
#     sh benchmarks/disk_speed.sh [DIR]   (default: the system's temporary folder)
set -e
file="$(mktemp "${1:-${TMPDIR:-/tmp}}/disk-speed.XXXXXX")"
trap 'rm -f "$file"' EXIT
echo "write, fsync:"; dd if=/dev/zero of="$file" bs=1M count=1024 conv=fsync 2>&1 | tail -1
echo "read, direct:"; dd if="$file" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1
