"""JupyterHub on loopback for the course: what ``make hub`` and tests/test_jupyterhub.py start.

``packdata.course.localhub`` runs ``jupyterhub -f`` on this file and passes the paths through
``PACKDATA_HUB_*`` environment variables. Every user gets a single-user JupyterLab from the course
environment (the Python running the hub: ``.venv``), with the Lab settings that
``packdata lab-settings`` writes, a home folder of their own under ``PACKDATA_HUB_HOMES`` and the
course's ``PACKDATA_DATA_DIR`` and ``PACKDATA_SIZE``.

For a test only: the dummy authenticator lets the named users in with any password and the simple
spawner runs every server as the hub's own system user. A real hub uses its site's single sign-on
(``oauthenticator``: GitHub, Google, GitLab or generic OAuth; ``ldapauthenticator``) or, on The
Littlest JupyterHub, its own ``firstuseauthenticator`` or ``nativeauthenticator``; see HUB.md.
"""

import os
import sys
from pathlib import Path

env = os.environ
state = Path(env["PACKDATA_HUB_STATE"])
lab_prefix = Path(env["PACKDATA_HUB_LAB_PREFIX"])
course_bin = Path(sys.executable).parent

c = get_config()  # noqa: F821 (defined by JupyterHub when it loads this file)

# Everything on loopback, on ports chosen by localhub; state and logs under build/hub/.
c.JupyterHub.bind_url = f"http://127.0.0.1:{env['PACKDATA_HUB_PORT']}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(env["PACKDATA_HUB_API_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env['PACKDATA_HUB_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [env["PACKDATA_HUB_PROXY"]]
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = set(env["PACKDATA_HUB_USERS"].split(","))

c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = str(Path(env["PACKDATA_HUB_HOMES"]) / "{username}")
c.Spawner.cmd = [str(course_bin / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.args = [
    f"--LabApp.app_settings_dir={lab_prefix / 'share' / 'jupyter' / 'lab' / 'settings'}"
]
if os.geteuid() == 0:
    c.Spawner.args.append("--allow-root")
c.Spawner.environment = {
    "PATH": f"{course_bin}{os.pathsep}{env['PATH']}",
    "JUPYTER_CONFIG_PATH": str(lab_prefix / "etc" / "jupyter"),
    **{name: env[name] for name in ("PACKDATA_DATA_DIR", "PACKDATA_SIZE") if name in env},
}
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60
