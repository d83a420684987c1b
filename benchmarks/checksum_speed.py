"""How fast a chunk file's checksum is: zlib's CRC-32 (what `trainers.memory.chunks.store` uses) against
BLAKE2b (what it used before), over random bytes in memory, one thread, best of --repeats.

    python benchmarks/checksum_speed.py [--mib 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import time
import zlib

CHECKSUMS = {"CRC-32 (zlib)": zlib.crc32, "BLAKE2b-128": lambda data: hashlib.blake2b(data, digest_size=16).digest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="MiB of data checksummed")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = memoryview(os.urandom(args.mib << 20))
    print(f"{args.mib} MiB, best of {args.repeats}, {platform.processor() or platform.machine()}")
    print("| checksum | GB/s |\n|---|---|")
    for name, checksum in CHECKSUMS.items():
        best = float("inf")
        for _ in range(args.repeats):
            started = time.perf_counter()
            checksum(data)
            best = min(best, time.perf_counter() - started)
        print(f"| {name} | {data.nbytes / best / 1e9:.2f} |")


if __name__ == "__main__":
    main()
