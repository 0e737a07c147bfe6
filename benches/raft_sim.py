"""Run the deterministic Raft simulation over many seeds.

    python benches/raft_sim.py --seeds 300 [--start 0] [--jobs 2] [-v]

Ends with the line `N passed, M failed`; exits non-zero on any failure. A failure prints its
seed and the command that replays it alone, verbosely.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orchestrator.sim.raft_sim import SimFailure, run_seed


def _one(seed: int) -> tuple[int, str | None]:
    try:
        run_seed(seed)
    except SimFailure as exc:
        return seed, str(exc)
    except Exception as exc:  # a crash of the code under test is a failure too, not an abort
        import traceback

        return seed, f"seed {seed}: crashed: {exc!r}\n{traceback.format_exc()}"
    return seed, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every event (one seed)")
    args = ap.parse_args()
    seeds = range(args.start, args.start + args.seeds)
    t0 = time.monotonic()
    failed: list[int] = []
    if args.verbose:
        for s in seeds:
            res = run_seed(s, verbose=True)
            print(res)
        print(f"{len(seeds)} passed, 0 failed")
        return 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for seed, err in pool.map(_one, seeds, chunksize=4):
            if err is not None:
                failed.append(seed)
                print(err, file=sys.stderr)
                print(
                    f"replay: python benches/raft_sim.py --start {seed} --seeds 1 -v",
                    file=sys.stderr,
                )
    passed = len(seeds) - len(failed)
    print(f"# {len(seeds)} seeds in {time.monotonic() - t0:.1f}s")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
