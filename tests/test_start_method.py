"""tests/start_method.py, which starts a lesson kernel's workers as Python 3.14 or macOS would.

Its spawn-once rule must keep the spawn run honest: a loader's workers are spawned the first time
they are sent something, and again whenever a forkserver's workers would see another environment.
"""

import os
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).with_name("start_method.py")
# as a lesson kernel runs it (PYTHONSTARTUP), then one loader's epochs
EPOCHS = f"""
import os, runpy
runpy.run_path({str(HARNESS)!r})
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.arange(4)), num_workers=2)
def epoch():
    assert sorted(int(x) for (x,) in loader) == [0, 1, 2, 3]
epoch()
epoch()
import torchvision  # as the server did first: it sets TORCHINDUCTOR_CACHE_DIR
assert "TORCHINDUCTOR_CACHE_DIR" in os.environ
epoch()
os.environ["RANK"] = "1"
epoch()
"""


def started(tmp_path, **variables):
    """The kind of each process the script above started, in order."""
    log = tmp_path / "processes.log"
    environ = {**os.environ, "PACKDATA_PROCESS_LOG": str(log), **variables}
    for name in ("RANK", "TORCHINDUCTOR_CACHE_DIR"):
        environ.pop(name, None)
    subprocess.run([sys.executable, "-c", EPOCHS], env=environ, check=True, timeout=300)
    return log.read_text().split()


def test_spawn_once_spawns_what_is_new_and_forks_the_rest(tmp_path):
    kinds = started(
        tmp_path,
        PACKDATA_START_METHOD="spawn",
        PACKDATA_MOST_WORKERS="1",
        PACKDATA_SPAWN_ONCE="1",
    )
    # the first epoch's worker is spawned (Process: the default context's); the second imports
    # nothing new and comes from the forkserver; so does the third (importing torchvision here
    # set a variable the server set too); the fourth would see the server's old RANK
    assert kinds == ["Process", "ForkServerProcess", "ForkServerProcess", "Process"]
