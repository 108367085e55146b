"""A real JupyterHub on 127.0.0.1 for the course: started by ``make hub`` and by
tests/test_jupyterhub.py, configured by ``scripts/hub/jupyterhub_config.py``.

The hub's proxy, ``configurable-http-proxy``, comes from npm into ``build/hub/npm`` (never a global
install). Learners' servers run JupyterLab from this Python's environment, the course's ``.venv``,
with the Lab settings of ``packdata lab-settings``. ``git_pull_link`` fills in the nbgitpuller link
exactly as the README documents it.

Run ``python -m packdata.course.localhub`` to start a hub in the foreground (Ctrl-C stops it).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ..ports import free_port
from .hub import write_lab_settings

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "scripts" / "hub" / "jupyterhub_config.py"
DEFAULT_WORKDIR = ROOT / "build" / "hub"
PROXY_PACKAGE = "configurable-http-proxy@5.2.0"
# The link template in the README's hub section: one line with user-redirect/git-pull in it.
README_LINK = re.compile(r"^https://HUB/hub/user-redirect/git-pull\?\S+$", re.MULTILINE)


class HubError(RuntimeError):
    """The hub could not be started, or did not answer in time."""


@dataclass
class Hub:
    """A running hub: its process, public URL, working folder and log file."""

    process: subprocess.Popen
    url: str
    workdir: Path
    log: Path

    def home(self, user):
        """The home folder of ``user``'s server."""
        return self.workdir / "home" / user

    def log_tail(self, lines=40):
        """The last ``lines`` lines of the hub's log (the proxy's and the servers' included)."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def proxy_command(npm_prefix=None):
    """Path of ``configurable-http-proxy``, installed with npm into ``npm_prefix`` (default
    ``build/hub/npm``) when missing."""
    prefix = Path(npm_prefix or DEFAULT_WORKDIR / "npm")
    command = prefix / "node_modules" / ".bin" / "configurable-http-proxy"
    if command.exists():
        return command
    if shutil.which("npm") is None:
        raise HubError(f"npm is needed to install {PROXY_PACKAGE}, the hub's proxy")
    cmd = ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(prefix)]
    subprocess.run([*cmd, PROXY_PACKAGE], check=True, stdout=subprocess.DEVNULL)
    return command


def start(workdir=None, users=("learner",), port=None, env=None, npm_prefix=None):
    """Start a hub on 127.0.0.1 with state, logs and users' homes under ``workdir``; return it
    once it answers. ``env`` adds to the environment (``PACKDATA_DATA_DIR``, ``PACKDATA_SIZE``
    reach the learners' servers)."""
    jupyterhub = Path(sys.executable).with_name("jupyterhub")
    if not jupyterhub.exists():
        raise HubError(f"{jupyterhub} is missing: install the course's pins (make setup)")
    workdir = Path(workdir or DEFAULT_WORKDIR).resolve()
    state = workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    lab_prefix = workdir / "lab"
    write_lab_settings(lab_prefix)
    port = port or free_port()
    hub_env = {
        **os.environ,
        **(env or {}),
        "PACKDATA_HUB_STATE": str(state),
        "PACKDATA_HUB_LAB_PREFIX": str(lab_prefix),
        "PACKDATA_HUB_HOMES": str(workdir / "home"),
        "PACKDATA_HUB_USERS": ",".join(users),
        "PACKDATA_HUB_PROXY": str(proxy_command(npm_prefix)),
        "PACKDATA_HUB_PORT": str(port),
        "PACKDATA_HUB_API_PORT": str(free_port()),
        "PACKDATA_HUB_PROXY_API_PORT": str(free_port()),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    log = workdir / "jupyterhub.log"
    cmd = [str(jupyterhub), "-f", str(CONFIG)]
    with log.open("w") as out:
        process = subprocess.Popen(
            cmd, cwd=state, env=hub_env, stdout=out, stderr=subprocess.STDOUT
        )
    hub = Hub(process, f"http://127.0.0.1:{port}", workdir, log)
    try:
        wait_until_ready(hub)
    except BaseException:
        stop(hub)
        raise
    return hub


def wait_until_ready(hub, timeout=60):
    """Return once the hub answers through its proxy; ``HubError`` with the log's tail when it
    exits or takes longer than ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.process.poll() is not None:
            raise HubError(
                f"jupyterhub exited with {hub.process.returncode}; end of {hub.log}:\n"
                f"{hub.log_tail()}"
            )
        try:
            with urllib.request.urlopen(f"{hub.url}/hub/api", timeout=5):
                return
        except OSError:
            time.sleep(0.3)
    raise HubError(
        f"jupyterhub did not answer within {timeout} s; end of {hub.log}:\n{hub.log_tail()}"
    )


def stop(hub, timeout=30):
    """Stop the hub; it stops its proxy and the learners' servers first."""
    if hub.process.poll() is None:
        hub.process.send_signal(signal.SIGTERM)
        try:
            hub.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            hub.process.kill()
            hub.process.wait()


def git_pull_link(hub_url, repo_url, folder, readme=ROOT / "README.md"):
    """The README's nbgitpuller link with ``HUB``, ``REPOSITORY_URL`` (URL-encoded) and
    ``REPOSITORY_FOLDER`` filled in."""
    found = README_LINK.findall(Path(readme).read_text())
    if len(found) != 1:
        raise HubError(f"{readme}: expected one nbgitpuller link template, found {len(found)}")
    link = found[0].replace("https://HUB", hub_url.rstrip("/"), 1)
    link = link.replace("REPOSITORY_URL", quote(repo_url, safe=""), 1)
    return link.replace("REPOSITORY_FOLDER", folder, 1)


def main():
    """Start a hub in the foreground; print its URL and the nbgitpuller link for this clone."""
    hub = start()
    link = git_pull_link(hub.url, ROOT.as_uri(), ROOT.name)
    print(f"JupyterHub on {hub.url} (log: {hub.log}); log in as 'learner' with any password.")
    print(f"nbgitpuller link for this clone's committed 'main' branch:\n{link}")
    print("Ctrl-C stops the hub and the learners' servers.")
    try:
        hub.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(hub)
    if hub.process.returncode not in (0, -signal.SIGTERM):
        sys.exit(f"jupyterhub exited with {hub.process.returncode}:\n{hub.log_tail()}")


if __name__ == "__main__":
    main()
