"""Run the deterministic Raft simulation over many seeds.

    python benches/raft_sim.py --seeds 300 [--start 0] [--jobs 2] [--machine mvcc|kv] [-v]

Each server runs the real MVCC store by default (checks Raft, the store and its watch events);
`--machine kv` runs a plain dictionary instead (checks Raft alone, several times faster).

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

from orchestrator.testing.machines import MemoryKV, MVCCMachine
from orchestrator.testing.raft_sim import SimFailure, run_seed

MACHINES = {"mvcc": MVCCMachine, "kv": MemoryKV}


def _one(job: tuple[int, str]) -> tuple[int, str | None]:
    seed, machine = job
    try:
        run_seed(seed, sm_factory=MACHINES[machine])
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
    ap.add_argument(
        "--machine", choices=sorted(MACHINES), default="mvcc", help="state machine each server runs"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print every event (one seed)")
    args = ap.parse_args()
    seeds = range(args.start, args.start + args.seeds)
    t0 = time.monotonic()
    failed: list[int] = []
    if args.verbose:
        for s in seeds:
            res = run_seed(s, verbose=True, sm_factory=MACHINES[args.machine])
            print(res)
        print(f"{len(seeds)} passed, 0 failed")
        return 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        jobs = [(s, args.machine) for s in seeds]
        for seed, err in pool.map(_one, jobs, chunksize=4):
            if err is not None:
                failed.append(seed)
                print(err, file=sys.stderr)
                print(
                    f"replay: python benches/raft_sim.py --start {seed} --seeds 1"
                    f" --machine {args.machine} -v",
                    file=sys.stderr,
                )
    passed = len(seeds) - len(failed)
    print(f"# {len(seeds)} seeds in {time.monotonic() - t0:.1f}s")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
