"""``jupyter lab`` on loopback for the tests, with the settings that ``packdata lab-settings``
writes, in a prefix of its own: what ``make setup`` and ``postBuild`` ship, not one ``.venv``'s
state."""

import os
import secrets
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

import pytest

from packdata.course.hub import write_lab_settings
from packdata.ports import free_port


@contextmanager
def lab_server(root, home):
    """Run ``jupyter lab`` on ``root``, its settings and logs under ``home``; yield
    ``(base URL, token)``."""
    prefix = home / "prefix"
    settings = write_lab_settings(prefix).parent
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}"]
    cmd += [
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.app_settings_dir={settings}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {
        **os.environ,
        "JUPYTER_CONFIG_PATH": str(prefix / "etc" / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    log_path = home / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(server, f"{base}/api/status?token={token}", log_path)
            yield base, token
        finally:
            server.terminate()  # Jupyter shuts its kernels down on SIGTERM
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def wait_until_up(server, url, log, timeout=90):
    """Return once ``url`` answers; fail with the server's log when it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"jupyter lab exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {timeout} s:\n{log.read_text()}")
