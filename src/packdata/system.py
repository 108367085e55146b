"""What machine are we on? Versions, cores, accelerator, start method: the facts a loader depends
on."""

import math
import multiprocessing
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"  # where a container sees its own cgroup
CGROUP_LISTING = "/proc/self/cgroup"  # this process's cgroup in each hierarchy
PACKAGES = (
    "torch",
    "torchvision",
    "torchcodec",
    "webdataset",
    "numpy",
    "pillow",
    "jupytext",
    "matplotlib",
)


def usable_cores():
    """CPU cores this process may use: its affinity mask, capped by its container's CPU quota when
    it has one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quotas = (cgroup_cpu_quota(folder) for folder in cgroup_folders(CGROUP_ROOT, CGROUP_LISTING))
    return min([cores, *(quota for quota in quotas if quota is not None)])


def cgroup_folders(root, listing):
    """The folder of this process's cgroup v2 under ``root``, then each one above it up to ``root``:
    a quota on any of them binds. In a container the process's cgroup is the root; under systemd it
    lies below (The Littlest JupyterHub gives each user a service of its own, with its own CPU
    quota). Just ``root`` where ``listing`` (``/proc/self/cgroup``) names no v2 cgroup."""
    root = Path(root)
    try:
        lines = Path(listing).read_text().splitlines()
    except OSError:
        return [root]
    own = next((line[3:] for line in lines if line.startswith("0::")), "/")
    parts = [part for part in own.split("/") if part not in ("", ".", "..")]
    return [root.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def cgroup_cpu_quota(root):
    """The CPU quota of the cgroup whose files are in ``root``, in whole cores (rounded up), or None
    without one.

    Docker and Kubernetes (and so most JupyterHubs) cap a container's CPUs this way, with cgroup
    v2's ``cpu.max`` or v1's ``cpu.cfs_quota_us``; the affinity mask still lists every core of the
    machine.
    """
    root = Path(root)
    try:
        # v2: "max 100000" or "200000 100000"
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        # v1: -1 when there is no quota
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return max(1, math.ceil(quota / period)) if quota > 0 else None


def pick_device():
    """The best torch device here: CUDA, then Apple's MPS, else the CPU. Never required, used when
    present."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def environment_report():
    """A dict of the facts that decide how fast a data loader can go on this machine."""
    device = pick_device()
    report = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "usable CPU cores": usable_cores(),
        "default start method": multiprocessing.get_start_method(allow_none=False),
        "torch device": str(device),
    }
    if device.type == "cuda":
        import torch

        report["GPU"] = torch.cuda.get_device_name(device)
    # webdataset reads http:// shards by running curl
    report["curl"] = shutil.which("curl") or "missing: webdataset cannot read http:// shards"
    for name in PACKAGES:
        try:
            report[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            report[name] = "not installed"
    return report
