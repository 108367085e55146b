"""Several torchrun "nodes" on this machine, meeting in one c10d rendezvous on loopback: a
multi-node job for real, each node a ``torchrun`` process of its own as on a cluster.

    nodes = launch_nodes(["scripts/train.py", shards, "--test", test], nodes=2, procs_per_node=1)
    for node in nodes:
        print(node.node, node.returncode, node.lines("rank"))

Every launch runs the same command line, as ``srun`` runs it once per node:
``torchrun --nnodes=N --nproc_per_node=P --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT
--rdzv_id=JOB``. The first launch hosts the rendezvous store (``is_host``); c10d numbers the nodes
by host name, then process id, not by launch: on one machine, launch 0 is node rank 0 only when its
torchrun has the lowest process id.
"""

import os
import subprocess
import sys
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .ports import free_port


@dataclass(frozen=True)
class NodeRun:
    """What one launch did: its index, exit status and output (stdout and stderr together)."""

    node: int
    returncode: int
    output: str

    def lines(self, prefix=""):
        """The output's lines that start with ``prefix``."""
        return [line for line in self.output.splitlines() if line.startswith(prefix)]


def torchrun_command(arguments, nodes, procs_per_node, endpoint, run_id, host):
    """The torchrun command line of one node; ``host``: this node hosts the rendezvous store."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc_per_node={procs_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={run_id}",
        f"--rdzv_conf=is_host={int(host)}",
        *map(str, arguments),
    ]


def gpus_per_node(nodes, procs_per_node):
    """``CUDA_VISIBLE_DEVICES`` for each launch: GPUs of its own, as separate machines have, when
    this machine has one for every rank of every launch; else none, and the ranks use the CPU
    (launches that saw the same GPUs would put two ranks on one, which NCCL refuses)."""
    import torch  # only here: the launches import it themselves

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(gpus) < nodes * procs_per_node:
        return [""] * nodes
    return [",".join(gpus[n * procs_per_node : (n + 1) * procs_per_node]) for n in range(nodes)]


def launch_nodes(arguments, nodes=2, procs_per_node=1, timeout=300, env=None):
    """Run the script and arguments ``arguments`` on ``nodes`` torchrun launches of
    ``procs_per_node`` ranks each, meeting at a free port of 127.0.0.1; wait for all of them and
    return a ``NodeRun`` per launch. Each launch sees GPUs of its own, or none
    (``gpus_per_node``). Launches still running after ``timeout`` s are stopped, ranks included
    (their output so far is kept; their status is then not 0)."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"packdata-{uuid.uuid4().hex[:8]}"
    # one thread per rank: the ranks share this machine's cores (and torchrun stops warning)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    launches = [
        subprocess.Popen(
            torchrun_command(arguments, nodes, procs_per_node, endpoint, run_id, node == 0),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "CUDA_VISIBLE_DEVICES": gpus},
        )
        for node, gpus in enumerate(gpus_per_node(nodes, procs_per_node))
    ]

    def collect(node):
        launch = launches[node]
        output, _, _ = finish(launch, timeout)
        return NodeRun(node, launch.returncode, output)

    # each in a thread of its own: a launch whose pipe fills must not wait for another's end
    with ThreadPoolExecutor(nodes) as pool:
        return list(pool.map(collect, range(nodes)))


def finish(launch, timeout):
    """``(stdout, stderr, hung)`` of the torchrun ``launch`` (a ``Popen`` with pipes): what
    ``communicate()`` gives within ``timeout`` s; past it, ``hung`` is True and the launch is
    stopped (``stop``), ranks included, with what it printed so far."""
    try:
        return (*launch.communicate(timeout=timeout), False)
    except subprocess.TimeoutExpired:
        return (*stop(launch), True)


def stop(launch):
    """Stop the torchrun ``launch`` (a ``Popen`` with pipes) and the ranks it started; return what
    ``communicate()`` gives. SIGTERM, which torchrun passes on to its ranks: they run in sessions of
    their own, and a SIGKILL of torchrun would leave them running. SIGKILL after 30 s, and then
    what it printed so far: ranks left running would keep its pipes open."""
    launch.terminate()
    try:
        return launch.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        launch.kill()
        launch.wait()  # its status: the pipes may stay open
    try:
        return launch.communicate(timeout=5)
    except subprocess.TimeoutExpired as stuck:
        return tuple(_text(output) for output in (stuck.stdout, stuck.stderr))


def _text(output):
    """What a cut-short ``communicate()`` kept (bytes, text or None), as text."""
    return output if isinstance(output, str) else (output or b"").decode(errors="replace")


def last_lines(text, count=5, width=88):
    """The last ``count`` lines of ``text`` that hold something (a failed launch's output ends with
    its error), each wrapped to ``width`` columns so that they fit a slide."""
    lines = [line for line in text.splitlines() if line.strip()][-count:]
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ") for line in lines)
