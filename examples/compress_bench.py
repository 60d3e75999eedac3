"""A real program to tune through the command target: block-parallel compression of a file.

The file is cut into blocks of ``--block-kb`` KiB, compressed with ``--codec`` at ``--level``
by ``--threads`` worker threads (zlib, bz2 and lzma release the GIL while they compress),
written to ``--out``, and the first block is decompressed again to check the round trip.
It prints one JSON line of metrics: ``mb_per_s`` (input MiB per second of wall time) and
``ratio`` (input bytes / output bytes)::

    python3 examples/compress_bench.py --make-data runs/compress/data.bin --mb 16
    python3 examples/compress_bench.py --data runs/compress/data.bin --codec zlib --level 6 \\
        --threads 2 --block-kb 1024 --out runs/compress/out.bin
    {"mb_per_s": 41.7, "ratio": 3.12, "seconds": 0.38, "blocks": 16}

The data file (``--make-data``) is deterministic: text drawn from a Zipf-distributed
vocabulary (compresses well), interleaved with JSON-like log records and stretches of
random bytes (incompressible), so codecs and levels trade speed for ratio as on real data.
Exit status 2 means bad arguments; 3 means a configuration this program cannot run (the
examples list it as INFEASIBLE).
"""

from __future__ import annotations

import argparse
import bz2
import json
import lzma
import random
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CODECS: dict[str, tuple[Callable[[bytes, int], bytes], Callable[[bytes], bytes]]] = {
    "zlib": (lambda data, level: zlib.compress(data, level), zlib.decompress),
    "bz2": (lambda data, level: bz2.compress(data, level), bz2.decompress),
    "lzma": (lambda data, level: lzma.compress(data, preset=level), lzma.decompress),
}
EXIT_INFEASIBLE = 3


def make_data(path: Path, mebibytes: int, seed: int = 11) -> None:
    """Write ``mebibytes`` MiB of mixed text, log records and random bytes to ``path``."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("etaoinshrdlucmfwypvbgkqjxz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
    path.parent.mkdir(parents=True, exist_ok=True)
    target = mebibytes * 1024 * 1024
    written = 0
    with path.open("wb") as handle:
        while written < target:
            kind = rng.random()
            if kind < 0.6:
                words = rng.choices(vocabulary, weights, k=2000)
                chunk = (" ".join(words) + "\n").encode()
            elif kind < 0.9:
                records = [
                    json.dumps(
                        {
                            "ts": 1_700_000_000 + rng.randint(0, 10**6),
                            "level": rng.choice(["INFO", "WARN", "ERROR"]),
                            "user": rng.randint(1, 5000),
                            "latency_ms": round(rng.lognormvariate(1.0, 0.8), 3),
                        }
                    )
                    for _ in range(150)
                ]
                chunk = ("\n".join(records) + "\n").encode()
            else:
                chunk = rng.randbytes(16 * 1024)
            chunk = chunk[: target - written]
            handle.write(chunk)
            written += len(chunk)


def compress(data: bytes, codec: str, level: int, threads: int, block: int) -> list[bytes]:
    """The blocks of ``data``, each compressed on its own, by ``threads`` threads."""
    squeeze = CODECS[codec][0]
    blocks = [data[i : i + block] for i in range(0, len(data), block)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda b: squeeze(b, level), blocks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make-data", type=Path, metavar="PATH", help="write the data file")
    parser.add_argument("--mb", type=int, default=16, help="size of the data file (MiB)")
    parser.add_argument("--data", type=Path, help="the file to compress")
    parser.add_argument("--codec", choices=sorted(CODECS), default="zlib")
    parser.add_argument("--level", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block-kb", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="where the compressed blocks go")
    args = parser.parse_args(argv)
    if args.make_data is not None:
        make_data(args.make_data, args.mb)
        print(json.dumps({"data": str(args.make_data), "mb": args.mb}))
        return 0
    if args.data is None:
        parser.error("--data is required (or --make-data PATH)")
    if (args.codec == "lzma" and not 0 <= args.level <= 9) or (
        args.codec != "lzma" and not 1 <= args.level <= 9
    ):
        print(f"level {args.level} is not valid for {args.codec}", file=sys.stderr)
        return EXIT_INFEASIBLE
    if args.threads < 1 or args.block_kb < 1:
        print("threads and block size must be positive", file=sys.stderr)
        return EXIT_INFEASIBLE
    data = args.data.read_bytes()
    start = time.perf_counter()
    blocks = compress(data, args.codec, args.level, args.threads, args.block_kb * 1024)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("wb") as handle:
            for block in blocks:
                handle.write(len(block).to_bytes(4, "big") + block)
    seconds = time.perf_counter() - start
    if CODECS[args.codec][1](blocks[0]) != data[: args.block_kb * 1024]:
        print("round trip of the first block failed", file=sys.stderr)
        return 1
    size = sum(len(b) for b in blocks)
    metrics = {
        "mb_per_s": round(len(data) / 2**20 / seconds, 3),
        "ratio": round(len(data) / size, 4),
        "seconds": round(seconds, 4),
        "blocks": len(blocks),
    }
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
