"""The ``packdata`` command line: one verb per job, each a thin wrapper over a module function.

The data verbs need only the library; the course verbs (exercises, schedule, lab-settings, slides)
need the course tools, ``pip install 'packdata[course]'``, and say so when they are missing."""

import argparse
import importlib
import sys
from itertools import islice
from pathlib import Path

from .presigned import withheld


def _make_data(args):
    from . import photos, synthetic

    make = photos.make_photos if args.photos else synthetic.make_dataset
    print(make(args.root, size=args.size, seed=args.seed, force=args.force))


def _export(args):
    from . import export

    root = export.export_image_folder(args.source, args.target)
    print(root)


class CourseToolsMissing(RuntimeError):
    """A course verb run where only the library is installed."""


def course_module(name):
    """``packdata.course.<name>``, or ``CourseToolsMissing`` saying what to install."""
    try:
        return importlib.import_module(f"packdata.course.{name}")
    except ModuleNotFoundError as missing:
        raise CourseToolsMissing(
            f"needs {missing.name!r}, one of the course tools: pip install 'packdata[course]' "
            "(in the course's repository, make setup installs them)"
        ) from None


def _exercises(args):
    exercises = course_module("exercises")
    if args.check:
        drifted = exercises.check_exercises(args.solutions, args.exercises)
        for path in drifted:
            print(f"drifted: {path} (run 'make exercises')", file=sys.stderr)
        return 1 if drifted else 0
    for path in exercises.write_exercises(args.solutions, args.exercises):
        print(path)


def _slides(args):
    for deck in course_module("slides").build_slides(args.notebooks, args.out, args.execute):
        print(deck)


def _lab_settings(args):
    print(course_module("hub").write_lab_settings(args.prefix))


def _schedule(args):
    print(course_module("schedule").make_schedule(".", args.guide))


def _shards(args):
    from . import layout, shardread

    if args.action == "list":
        for shard in layout.expand_shards(args.shards):
            info = shardread.describe_shard(shard)
            print(shardread.format_shard(info))
            for name, size in info["member_sizes"] if args.members else ():
                print(f"  {name}\t{size:,} bytes")
    elif args.action == "show":
        for sample in islice(shardread.iter_shard_samples(args.shards), args.count):
            print(shardread.format_sample(sample))
    elif args.action == "map":
        for path, samples in _map(args):
            print(f"{path}\t{samples} samples")
    else:
        for info in _written(args):
            print(f"{info.path}\t{info.samples} samples\t{info.bytes:,} bytes")


def _written(args):
    """The shards the ``write``, ``split`` or ``cat`` action writes."""
    from . import shardwrite

    if args.action == "cat":
        return [shardwrite.cat_shards(args.shards, args.output)]
    sizes = {"prefix": args.prefix, "maxcount": args.maxcount, "maxsize": args.maxsize}
    if args.action == "write":
        return shardwrite.write_shards(
            args.source, args.out_dir, resize=args.resize, processes=args.processes, **sizes
        )
    return shardwrite.split_tar(args.shards[0], args.out_dir, **sizes)


def import_function(spec):
    """The function named ``"package.module:function"``; ``ValueError`` when there is none."""
    module_name, _, name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(
            f"cannot import {spec!r}: give an importable module and a function in it, "
            "as in packdata.mapshards:resize_sample"
        ) from None
    if not callable(function):
        raise ValueError(f"{spec!r} is not a function")
    return function


def _map(args):
    """``shards map``: the command or function over every sample, on a pool or a Dask cluster."""
    from functools import partial

    from . import engines, mapshards

    if args.command is not None:
        function = partial(mapshards.shell_sample, command=args.command)
    else:
        function = import_function(args.function)
    map_over = partial(mapshards.map_shards, function, args.shards, args.out_dir)
    if args.dask is None:
        return map_over(processes=args.processes)
    address = None if args.dask == "local" else args.dask
    with engines.dask(address, workers=args.processes) as executor:
        return map_over(executor=executor)


def _serve(args):
    from . import service

    service.serve(
        args.root,
        latency=args.latency / 1000,
        bandwidth=args.bandwidth * 1e6 if args.bandwidth else None,
        host=args.host,
        port=args.port,
        max_upload=int(args.max_upload * 1e6) if args.max_upload else service.MAX_UPLOAD,
    )


def one_or_more(text):
    """An argument that counts processes or workers: a whole number of 1 or more."""
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number}: give 1 or more")
    return number


def port_number(text):
    """A port argument: 0 (any free one) to 65535."""
    number = int(text)
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number}: a port is 0 to 65535")
    return number


def add_make_data(verbs):
    p = verbs.add_parser("make-data", help="generate the synthetic image dataset")
    p.add_argument("--root", type=Path, help="target folder (default: data/synthetic-SIZE)")
    p.add_argument(
        "--size",
        help="'small', 'workshop' or a number of images (default: $PACKDATA_SIZE or workshop)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="regenerate even if it exists")
    p.add_argument(
        "--photos", action="store_true", help="the ImageNet-sized photos (data/photos-SIZE) instead"
    )
    p.set_defaults(run=_make_data)


def add_export(verbs):
    p = verbs.add_parser(
        "export", help="copy an image folder (ImageFolder layout) into the course layout"
    )
    p.add_argument("source", type=Path)
    p.add_argument("target", type=Path)
    p.set_defaults(run=_export)


def add_exercises(verbs):
    p = verbs.add_parser("exercises", help="generate exercises/ from solutions/ (course tools)")
    p.add_argument("--solutions", type=Path, default=Path("solutions"))
    p.add_argument("--exercises", type=Path, default=Path("exercises"))
    p.add_argument(
        "--check", action="store_true", help="fail when exercises/ differs from what it would be"
    )
    p.set_defaults(run=_exercises)


def add_schedule(verbs):
    p = verbs.add_parser("schedule", help="time every lesson; write the guide's schedule")
    p.add_argument("--guide", default="INSTRUCTORS.md")
    p.set_defaults(run=_schedule)


def add_lab_settings(verbs):
    p = verbs.add_parser("lab-settings", help="make JupyterLab open the .md lessons as notebooks")
    p.add_argument("--prefix", type=Path, help="Jupyter's prefix (default: this Python's)")
    p.set_defaults(run=_lab_settings)


def add_slides(verbs):
    p = verbs.add_parser("slides", help="build offline reveal.js decks from the lessons")
    p.add_argument("--notebooks", type=Path, default=Path("notebooks"))
    p.add_argument("--out", type=Path, default=Path("build/slides"))
    p.add_argument(
        "--no-execute", dest="execute", action="store_false", help="do not run the code cells"
    )
    p.set_defaults(run=_slides)


def add_shards(verbs):
    p = verbs.add_parser(
        "shards", help="list, show, split, join and map tar shards (webdataset layout)"
    )
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("list", help="samples, members and bytes of each shard")
    q.add_argument("shards", nargs="+", help="shard paths, URLs or brace patterns (quote them)")
    q.add_argument("--members", action="store_true", help="also list every member with its size")
    q = actions.add_parser("show", help="print the first samples: key, members, label")
    q.add_argument("shards", nargs="+")
    q.add_argument("-n", "--count", type=int, default=5)
    q = actions.add_parser(
        "write",
        help="write a dataset folder (from 'packdata export' or make-data) as shards, its samples "
        "shuffled first",
    )
    q.add_argument("source", type=Path, help="the dataset folder, with its manifest.json")
    add_shard_sizes(q)
    q.add_argument("--resize", type=int, help="resize every image to RESIZE×RESIZE pixels")
    q.add_argument("-p", "--processes", type=one_or_more, default=1, help="processes that encode")
    q = actions.add_parser("split", help="split one tar into shards, samples kept whole")
    q.add_argument("shards", nargs=1, metavar="tar")
    add_shard_sizes(q)
    q = actions.add_parser("cat", help="concatenate shards into one tar")
    q.add_argument("shards", nargs="+")
    q.add_argument("-o", "--output", type=Path, required=True)
    add_shards_map(actions)
    p.set_defaults(run=_shards)


def add_shard_sizes(parser):
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--prefix", default="train")
    parser.add_argument("--maxcount", type=int, default=1000, help="samples per shard at most")
    parser.add_argument("--maxsize", type=float, default=None, help="bytes per shard at most")


def add_shards_map(actions):
    q = actions.add_parser(
        "map",
        help="apply a shell command or a Python function to every sample, in parallel, "
        "into new shards (tarproc style)",
    )
    q.add_argument("shards", nargs="+", help="shard paths or brace patterns (quote them)")
    q.add_argument("-o", "--out-dir", type=Path, required=True, help="folder of the new shards")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "-c",
        "--command",
        help="shell command, run in a folder holding the sample as sample.<ext> files; "
        "the sample.* files left there are the new sample",
    )
    how.add_argument(
        "-f",
        "--function",
        help="module:function, given a sample dict, returning {ext: bytes} (None drops it)",
    )
    q.add_argument(
        "-p", "--processes", type=one_or_more, default=2, help="processes or Dask workers"
    )
    q.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run on the Dask scheduler at ADDRESS ('local': a LocalCluster on 127.0.0.1)",
    )


def add_serve(verbs):
    p = verbs.add_parser("serve", help="run the dataset store service (lesson 6) until Ctrl-C")
    p.add_argument("root", type=Path, help="folder that holds the datasets (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=port_number, default=8080, help="port (0: any free one)")
    p.add_argument("--latency", type=float, default=0.0, help="emulated latency per request, ms")
    p.add_argument("--bandwidth", type=float, help="emulated bandwidth cap per transfer, MB/s")
    p.add_argument("--max-upload", type=float, help="largest upload accepted, MB (default: 1 GiB)")
    p.set_defaults(run=_serve)


VERBS = (add_make_data, add_export, add_shards, add_serve) + (
    add_exercises,
    add_schedule,
    add_lab_settings,
    add_slides,  # the course tools
)


def build_parser():
    parser = argparse.ArgumentParser(prog="packdata", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    for add in VERBS:
        add(verbs)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    # bad input, or a course verb without the course tools: one clear line, no traceback
    except (ValueError, OSError, CourseToolsMissing) as error:
        parser.exit(2, f"packdata {args.verb}: error: {withheld(str(error))}\n")


if __name__ == "__main__":
    sys.exit(main())
