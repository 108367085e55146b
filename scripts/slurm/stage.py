"""Copy training shards to this node's local scratch, once per node: the job script runs it with
``srun --ntasks-per-node=1``. Files already there are kept, so a second run costs nothing.

    python scripts/slurm/stage.py /tmp/packdata-1234 "/shared/shapes/train-{000000..000009}.tar"
"""

import argparse
import socket
import time

from packdata.transfer import stage


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", help="this node's local folder for the shards")
    parser.add_argument("shards", nargs="+", help="paths, http:// URLs or brace patterns")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    local = stage(args.shards, args.scratch, threads=4, progress=False)
    megabytes = sum(path.stat().st_size for path in local) / 1e6
    print(
        f"{socket.gethostname()}: {len(local)} shards ({megabytes:.1f} MB) in {args.scratch}, "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
