"""The kernel knobs of the verify with the least GPU time among `kernel_bench.py --step`
files (`scripts/gpu_verify_ab.sh`'s verify-*.json), as `KEY=VALUE` words for
`STATEBENCH_SPEC_OPTIONS`; empty where the defaults won. A file without a timed step (a
variant stopped by its timeout) is passed over; none at all: empty, and a line on stderr.

    .venv/bin/python scripts/fastest_verify.py OUTDIR/verify-*.json
"""

from __future__ import annotations

import json
import sys


def knobs(path: str) -> tuple[float, str] | None:
    """(GPU ms, its knobs) of the file's step, None where it has none timed."""
    try:
        with open(path) as f:
            step = json.load(f)["step"][0]
        gpu = float(step["gpu_ms"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return gpu, " ".join(f"{k}={v}" for k, v in sorted(step["options"].items()) if v)


def main(paths: list[str]) -> int:
    timed = [k for k in map(knobs, paths) if k is not None]
    if not timed:
        print("fastest_verify: no timed verify among the files; the defaults", file=sys.stderr)
        print("")
        return 0
    print(min(timed)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
