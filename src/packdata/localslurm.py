"""A real one-node Slurm cluster on loopback: Debian's ``munge`` and ``slurm-wlm`` daemons, run from
a private folder, for the course's job script and its test.

    with cluster() as slurm:                   # munged, slurmctld, slurmd from build/slurm/
        job = slurm.submit("scripts/slurm/train.sbatch", env=...)
        state = slurm.wait(job)                # "COMPLETED", "FAILED", ...

    python -m packdata.localslurm up|down|status      (make slurm-up, make slurm-down)

The folder holds everything: a munge key, ``slurm.conf`` (one node: this host, its CPUs and memory
as ``slurmd -C`` finds them, reached at 127.0.0.1 on free ports), state, spool, pid files and one
log per daemon. Client commands find the cluster through ``SLURM_CONF`` (``slurm.environment()``).
A daemon that cannot start raises ``SlurmError`` naming it, with the last lines of its log.
"""

import argparse
import getpass
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from .ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo")
DEFAULT_FOLDER = Path("build") / "slurm"

CONFIG = """\
# Written by packdata.localslurm: a one-node cluster on loopback, everything under {folder}
ClusterName=packdata
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
# job numbers from a random start: two clusters on one host (two learners on one hub, say) would
# otherwise both number their first job 1, and jobs that derive a port or a folder from it clash
FirstJobId={first_job}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd.pid
# no cgroups needed: track a job's processes by their parents, bind no tasks to cores
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(RuntimeError):
    """A Slurm daemon or command failed; the message names it and quotes its log."""


class SlurmMissing(SlurmError):
    """Slurm or munge is not installed here."""


def missing_programs():
    """The daemons and client commands not found on ``PATH`` (or in ``/usr/sbin``)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in DAEMONS + CLIENTS if shutil.which(name, path=path) is None]


def how_to_install(missing):
    """What to tell someone whose machine lacks the ``missing`` programs, in lines that fit a
    slide. Where Slurm's commands are here but not its daemons (a cluster's login node), that is
    to submit the job script to the cluster itself."""
    if set(CLIENTS).isdisjoint(missing):
        return (
            f"No Slurm cluster on this machine: {', '.join(missing)} missing.\n"
            "Slurm's commands are here (a cluster's login node?): submit the job script to your\n"
            "cluster instead, as the top of scripts/slurm/train.sbatch says. Or, on Debian or\n"
            "Ubuntu, as root: `apt-get install slurm-wlm munge`, then rerun this cell."
        )
    return (
        f"No Slurm here: {', '.join(missing)} missing.\n"
        "On Debian or Ubuntu, as root: `apt-get install slurm-wlm munge`;\n"
        "on a hub, ask its admin. Then rerun this cell."
    )


def last_lines(path, count=12):
    """The last ``count`` lines of the text file ``path`` ("" when it does not exist)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-count:])
    except FileNotFoundError:
        return ""


def alive(pid, mark=""):
    """True while process ``pid`` exists, is not a zombie and has ``mark`` in its command line
    (so that a pid file left behind never names some other process that got the same pid)."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        command = (proc / "cmdline").read_bytes().decode(errors="replace")
    except (OSError, IndexError):
        return False
    return state != "Z" and mark in command


class LocalSlurm:
    """The one-node cluster whose files live in ``folder``."""

    def __init__(self, folder=DEFAULT_FOLDER):
        self.folder = Path(folder).resolve()
        self.conf = self.folder / "slurm.conf"
        # munged wants every folder above its socket open to all, which a private folder (pytest's
        # temporary ones, say) is not: the socket lives in one of its own under /tmp
        digest = hashlib.sha256(str(self.folder).encode()).hexdigest()[:12]
        self.socket = Path(tempfile.gettempdir()) / f"packdata-munge-{digest}" / "munge.socket"
        self.sbin = os.pathsep.join(["/usr/sbin", "/sbin", os.environ.get("PATH", "")])
        self._children = {}  # daemons this process started: reaped when stopped

    # --- files -------------------------------------------------------------------------------

    def log(self, daemon):
        return self.folder / "log" / f"{daemon}.log"

    def pid_file(self, daemon):
        return self.folder / "run" / f"{daemon}.pid"

    def environment(self, **extra):
        """This process's environment with ``SLURM_CONF`` pointing at the cluster, plus
        ``extra``: what sbatch, srun, scontrol and sinfo need to find it."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def render(self):
        """Write the munge key (once) and ``slurm.conf`` for this host, with fresh ports."""
        for name in ("munge", "state", "spool", "log", "run"):
            (self.folder / name).mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(exist_ok=True)
        self.socket.parent.chmod(0o755)
        self.socket.unlink(missing_ok=True)  # left by a munged that was killed
        key = self.folder / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        node_line = self._run(["slurmd", "-C"]).splitlines()[0]  # NodeName=... CPUs=...
        node = node_line.split()[0].partition("=")[2]
        try:  # job scripts reach the node by this name (torchrun's rendezvous, say)
            socket.gethostbyname(node)
        except OSError as error:
            raise SlurmError(
                f"this host's name {node!r} does not resolve ({error}): add it to /etc/hosts"
            ) from None
        self.conf.write_text(
            CONFIG.format(
                folder=self.folder,
                socket=self.socket,
                node=node,
                node_line=node_line,
                user=getpass.getuser(),
                ctld_port=free_port(),
                slurmd_port=free_port(),
                first_job=random.randrange(1, 1_000_000),
            )
        )

    # --- daemons -----------------------------------------------------------------------------

    def pid(self, daemon):
        """The pid of ``daemon`` when it runs from this folder, else None."""
        try:
            pid = int(self.pid_file(daemon).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return pid if alive(pid, str(self.folder)) else None

    def running(self):
        """True when all three daemons of this folder run."""
        return all(self.pid(daemon) for daemon in DAEMONS)

    def _command(self, daemon):
        """The command that runs ``daemon`` in the foreground, logging to stderr."""
        munge = self.folder / "munge"
        if daemon == "munged":
            return [
                "munged",
                "--foreground",
                f"--socket={self.socket}",
                f"--key-file={munge / 'munge.key'}",
                f"--seed-file={munge / 'munged.seed'}",
                f"--pid-file={munge / 'munged.pid'}",
            ]
        return [daemon, "-D", "-f", str(self.conf)]

    def _spawn(self, daemon):
        """Start ``daemon`` in a session of its own (it outlives this process), its output in its
        log; record its pid."""
        with open(self.log(daemon), "ab") as log:
            child = subprocess.Popen(
                self._command(daemon),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(PATH=self.sbin),
                start_new_session=True,
            )
        self._children[daemon] = child
        self.pid_file(daemon).write_text(f"{child.pid}\n")
        return child

    def _ready(self, daemon):
        """True once ``daemon`` answers: munge's socket exists, the controller answers a ping,
        the node is idle."""
        if daemon == "munged":
            return self.socket.exists()
        if daemon == "slurmctld":
            return self._try(["scontrol", "ping"]) is not None
        states = self._try(["sinfo", "--noheader", "--format=%t"])
        return states is not None and "idle" in states.split()

    def _await(self, daemon, child, timeout):
        """Wait until ``daemon`` is ready; raise ``SlurmError`` with its log when it dies or
        stays unready for ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self._ready(daemon):
            if child.poll() is not None:
                problem = f"exited with status {child.returncode}"
            elif time.monotonic() > deadline:
                problem = f"not ready after {timeout:.0f} s"
            else:
                time.sleep(0.1)
                continue
            raise SlurmError(
                f"{daemon} could not start ({problem}); the last lines of {self.log(daemon)}:\n"
                + last_lines(self.log(daemon))
            )

    def start(self, timeout=30.0):
        """Render the configuration and start munged, slurmctld and slurmd, each once the one
        before answers; return the seconds it took. Already running: nothing to do (0)."""
        if self.running():
            return 0.0
        if missing := missing_programs():
            raise SlurmMissing(
                f"not installed: {', '.join(missing)} (Debian: apt-get install slurm-wlm munge)"
            )
        started = time.perf_counter()
        self.stop()  # what is left of a half-started cluster
        self.render()
        try:
            for daemon in DAEMONS:
                self._await(daemon, self._spawn(daemon), timeout)
        except BaseException:  # a daemon that failed, a command that hung, Ctrl-C: none stays
            self.stop()
            raise
        return time.perf_counter() - started

    def stop(self, timeout=10.0):
        """Stop the daemons of this folder (by their pid files), slurmd first; SIGKILL the ones
        still running after ``timeout`` s."""
        for daemon in reversed(DAEMONS):
            if pid := self.pid(daemon):
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout
                while alive(pid) and time.monotonic() < deadline:
                    self._reap(daemon)
                    time.sleep(0.05)
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            self._reap(daemon)
            self.pid_file(daemon).unlink(missing_ok=True)
        shutil.rmtree(self.socket.parent, ignore_errors=True)

    def _reap(self, daemon):
        """Collect the exit status of ``daemon`` when this process started it."""
        if (child := self._children.get(daemon)) and child.poll() is not None:
            del self._children[daemon]

    # --- commands ----------------------------------------------------------------------------

    def _run(self, command, **kwargs):
        """Run a Slurm command against this cluster; its stdout, or ``SlurmError`` with its
        stderr."""
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=self.environment(PATH=self.sbin),
            timeout=60,
            **kwargs,
        )
        if done.returncode:
            raise SlurmError(f"{' '.join(map(str, command))}: {done.stderr.strip()}")
        return done.stdout

    def _try(self, command):
        """``_run`` that answers None instead of raising."""
        try:
            return self._run(command)
        except SlurmError:
            return None

    def submit(self, script, *options, env=None, cwd=None):
        """``sbatch OPTIONS SCRIPT`` with ``env`` (default: ``environment()``); the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            capture_output=True,
            text=True,
            env=env or self.environment(),
            cwd=cwd,
            timeout=60,
        )
        if done.returncode:
            raise SlurmError(f"sbatch {script}: {done.stderr.strip()}")
        return int(done.stdout.split(";")[0])

    def state(self, job):
        """Job ``job``'s state: PENDING, RUNNING, COMPLETED, FAILED, ... (``scontrol``)."""
        fields = self._run(["scontrol", "show", "job", "--oneliner", str(job)]).split()
        return dict(field.partition("=")[::2] for field in fields)["JobState"]

    def wait(self, job, timeout=300.0):
        """Wait until job ``job`` has ended; return its final state."""
        deadline = time.monotonic() + timeout
        while (state := self.state(job)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            if time.monotonic() > deadline:
                self._run(["scancel", str(job)])
                raise SlurmError(f"job {job} still {state} after {timeout:.0f} s: cancelled")
            time.sleep(0.2)
        return state


@contextmanager
def cluster(folder=DEFAULT_FOLDER, timeout=30.0):
    """A running one-node cluster for the block (started if needed, then stopped again if this
    block started it)."""
    slurm = LocalSlurm(folder)
    was_running = slurm.running()
    slurm.start(timeout)
    try:
        yield slurm
    finally:
        if not was_running:
            slurm.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description="a one-node Slurm cluster on loopback")
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    args = parser.parse_args(argv)
    slurm = LocalSlurm(args.folder)
    if args.action == "up":
        try:
            seconds = slurm.start()
        except SlurmError as error:
            sys.exit(str(error))
        print(f"Slurm is up ({seconds:.1f} s to start). Use it with:")
        print(f"  export SLURM_CONF={slurm.conf}")
    elif args.action == "down":
        slurm.stop()
        print("Slurm is down")
    else:
        pids = {daemon: slurm.pid(daemon) for daemon in DAEMONS}
        print(", ".join(f"{daemon}: {pid or 'not running'}" for daemon, pid in pids.items()))


if __name__ == "__main__":
    main()
