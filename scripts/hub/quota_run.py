"""Disk use of one learner on a hub with a small home quota: run lessons in a home folder that is a
size-limited filesystem, with the data on scratch space, and print what each place holds.

The home is a loop-mounted ext4 image of ``--quota`` MB (as root), or, where loop devices are
refused, a tmpfs of that size. The course is cloned into it as nbgitpuller would; each lesson runs
as a learner's Lab would leave it: its paired ``.ipynb`` saved with outputs. The course
environment (``.venv``) stays outside the home, as on a hub image.

    sudo .venv/bin/python scripts/hub/quota_run.py --quota 100 --size small 00 01
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def mount_home(image, mountpoint, megabytes):
    """Mount a ``megabytes``-sized filesystem at ``mountpoint``; return its kind."""
    subprocess.run(["truncate", "-s", f"{megabytes}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    ext4 = subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)])
    if ext4.returncode == 0:
        return f"ext4 image, {megabytes} MB"
    tmpfs = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(mountpoint)]
    subprocess.run(tmpfs, check=True)
    return f"tmpfs, size={megabytes} MB"


def disk_use(path):
    """Bytes that ``path`` takes on its disk (``du``: blocks, not file sizes)."""
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def run_lesson(course, stem, env):
    """Execute ``notebooks/<stem>_*.md`` in ``course``, saving the paired ``.ipynb`` with its
    outputs; return the seconds it took."""
    (lesson,) = (course / "notebooks").glob(f"{stem}_*.md")
    notebook = lesson.with_suffix(".ipynb")
    subprocess.run([BIN / "jupytext", "--quiet", "--to", "ipynb", lesson], env=env, check=True)
    start = time.monotonic()
    cmd = [BIN / "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace"]
    subprocess.run([*cmd, "--ExecutePreprocessor.timeout=1200", notebook], env=env, check=True)
    return time.monotonic() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lessons", nargs="+", help="lesson numbers, e.g. 00 01")
    parser.add_argument("--quota", type=int, default=100, help="home quota in MB")
    parser.add_argument("--size", default="small", help="PACKDATA_SIZE: small or workshop")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quota-") as work:
        work = Path(work)
        home, scratch = work / "home", work / "scratch"
        home.mkdir()
        kind = mount_home(work / "home.img", home, args.quota)
        try:
            course = home / "packdata-course"
            clone = ["git", "clone", "--quiet", "--depth=1", ROOT.as_uri(), str(course)]
            subprocess.run(clone, check=True)
            clone_bytes = disk_use(course)
            env = {
                **os.environ,
                "HOME": str(home),
                "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                "PACKDATA_DATA_DIR": str(scratch),
                "PACKDATA_SIZE": args.size,
            }
            env.pop("JUPYTER_CONFIG_DIR", None)
            env.pop("MPLCONFIGDIR", None)
            seconds = {stem: run_lesson(course, stem, env) for stem in args.lessons}
            report(kind, args, clone_bytes, disk_use(home), disk_use(scratch), seconds, home)
        finally:
            subprocess.run(["umount", str(home)], check=True)


def report(kind, args, clone_bytes, home_bytes, data_bytes, seconds, home):
    """Print the measured disk use."""
    print(f"home: {kind}; PACKDATA_SIZE={args.size}; lessons {', '.join(args.lessons)}")
    for stem, took in seconds.items():
        print(f"  lesson {stem} ran in {took:.0f} s")
    print(f"  course clone (nbgitpuller's copy, no .ipynb): {clone_bytes / 1e6:.1f} MB")
    print(f"  home after the lessons: {home_bytes / 1e6:.1f} MB")
    for entry in sorted(home.iterdir()):
        if entry.name != "lost+found":
            print(f"    {entry.name}: {disk_use(entry) / 1e6:.1f} MB")
    print(f"  data dir (PACKDATA_DATA_DIR): {data_bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
