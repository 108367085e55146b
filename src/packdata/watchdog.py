"""DataLoader workers that end with the process that started them, whatever starts them.

A worker forked from its rank notices the rank's death (its parent changes) and exits. A worker
started by ``forkserver`` is the server's child, not the rank's: when the rank is killed outright
(``SIGKILL``, the out-of-memory killer), the worker, the server and its resource tracker live on,
holding memory and the job's output. Give the workers this ``worker_init_fn``:

    DataLoader(dataset, num_workers=2, worker_init_fn=exit_with(os.getpid()))
"""

import os
import threading
import time
from functools import partial

POLL = 1.0  # seconds between two looks at the rank


def exit_with(pid):
    """A ``worker_init_fn`` (picklable, for every start method) that makes each worker exit once
    the process ``pid`` has ended."""
    return partial(_watch, pid)


def _watch(pid, worker_id):
    threading.Thread(target=_until_gone, args=(pid,), daemon=True, name="exit-with").start()


def _until_gone(pid):
    while True:
        time.sleep(POLL)
        try:
            os.kill(pid, 0)  # no signal sent: only asks whether the process exists
        except ProcessLookupError:
            os._exit(1)  # its rank is gone: nobody will take what this worker makes
        except PermissionError:  # the number is another user's process now: the rank is gone
            os._exit(1)
