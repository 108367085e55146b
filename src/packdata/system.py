"""What machine are we on? Versions, cores, accelerator, start method: the facts a loader depends on."""

import multiprocessing
import os
import platform
from importlib import metadata

PACKAGES = ("torch", "torchvision", "webdataset", "numpy", "pillow", "jupytext", "matplotlib")


def usable_cores():
    """CPU cores this process may run on (respects container and affinity limits where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def pick_device():
    """The best torch device here: CUDA, then Apple's MPS, else the CPU. Never required, used when present."""
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
    for name in PACKAGES:
        try:
            report[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            report[name] = "not installed"
    return report
