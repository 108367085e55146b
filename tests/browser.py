"""Headless Chromium driven over the DevTools protocol (CDP), for tests that click through
JupyterLab and JupyterHub like a learner: open a page, wait for what it shows, click, type, save,
take a screenshot.

Chromium runs with every host but 127.0.0.1 mapped to an unresolvable name and writes its network
log, so a test can check that nothing left the machine (``test_slides.assert_offline``).
"""

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import websocket

CHROMIUM = shutil.which("chromium")
# headless, nothing of Chromium's own traffic, and every host but 127.0.0.1 unresolvable
OFFLINE_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Chromium asks Google about the forms of a page it shows (Lab has some), keyed to that page
    "--disable-features=AutofillServerCommunication",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
FLAGS = [
    *OFFLINE_FLAGS,
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1280,800",
]


class PageError(AssertionError):
    """A page did not show what a test waited for."""


class Page:
    """One browser tab, spoken to over its DevTools websocket."""

    def __init__(self, socket_url):
        self.socket = websocket.create_connection(socket_url, timeout=120, suppress_origin=True)
        self.next_id = 0

    def send(self, method, **params):
        """Call a CDP method; return its result (events that arrive meanwhile are dropped)."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise PageError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, script):
        """The value of the JavaScript expression ``script`` in the page (promises awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=script, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise PageError(f"{script!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url):
        """Navigate to ``url``."""
        self.send("Page.navigate", url=url)

    def wait_for(self, script, what, timeout=60):
        """Poll ``script`` until it is truthy; return its value, or fail saying ``what`` did not
        happen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(script)
            except PageError:  # the page navigated away while the script ran
                value = None
            if value:
                return value
            time.sleep(0.25)
        raise PageError(f"{what} within {timeout} s (page: {self.evaluate('location.href')})")

    def click(self, selector, text=None, timeout=30):
        """Click, with the mouse, the first visible element matching the CSS ``selector`` (and
        whose text is ``text``, when given)."""
        find = f"""(() => {{
            const hit = [...document.querySelectorAll({json.dumps(selector)})].find(el =>
                el.getClientRects().length &&
                ({json.dumps(text)} === null || el.textContent.trim() === {json.dumps(text)}));
            if (!hit) return null;
            hit.scrollIntoView({{block: "center"}});
            const r = hit.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2];
        }})()"""
        x, y = self.wait_for(find, f"no {selector} {text or ''} to click", timeout)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_text(self, text):
        """Type ``text`` where the focus is."""
        self.send("Input.insertText", text=text)

    def press(self, key, code, key_code, modifiers=0):
        """Press and release one key (``modifiers``: 2 is Ctrl)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.send(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=code,
                windowsVirtualKeyCode=key_code,
                modifiers=modifiers,
            )

    def screenshot(self, path):
        """Save what the tab shows as a PNG at ``path``."""
        data = self.send("Page.captureScreenshot", format="png")["data"]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(base64.b64decode(data))


# The notebook in JupyterLab's current tab (Lab hides the panels of the other tabs).
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CURRENT_TAB = "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current"


def wait_for_notebook(page, name):
    """Wait until JupyterLab's current tab is the file ``name`` shown as a notebook, with a kernel
    started and idle; return the kernel's name as the notebook's toolbar shows it."""
    page.wait_for(
        f"document.querySelector('{CURRENT_TAB} .lm-TabBar-tabLabel')"
        f"?.textContent === {json.dumps(name)} && !!document.querySelector('{NOTEBOOK} .jp-Cell')",
        f"Lab did not open {name} as a notebook",
        timeout=90,
    )
    toolbar = f"document.querySelector('{NOTEBOOK} [data-jp-item-name=%s]')?.textContent"
    kernel = page.wait_for(
        f"(n => n && n !== 'No Kernel' && n)({toolbar % 'kernelName'}?.trim())",
        "no kernel started",
    )
    page.wait_for(f"{toolbar % 'executionProgress'}?.includes('Idle')", "the kernel is not idle")
    return kernel


def press_save(page, tries=4, timeout=15):
    """Ctrl+S, as a learner saves in JupyterLab; wait until the current tab no longer marks
    unsaved changes (Lab marks a notebook changed once its kernel starts). A learner whose save
    shows no effect presses again: so does this, up to ``tries`` times, ``timeout`` s apart (on a
    busy machine a key press can arrive while Lab is still busy with the cell that ran). The
    failure names any dialog open on the page."""
    saved = f"!document.querySelector('{CURRENT_TAB}.jp-mod-dirty')"
    for _ in range(tries):
        page.press("s", "KeyS", 83, modifiers=2)
        try:
            page.wait_for(saved, "Ctrl+S did not save", timeout)
            return
        except PageError:
            continue
    dialog = page.evaluate("document.querySelector('.jp-Dialog')?.innerText || 'none'")
    raise PageError(f"Ctrl+S, pressed {tries} times, did not save (dialog open: {dialog})")


def devtools_port(profile, process, timeout=30):
    """The DevTools port Chromium chose, from the file it writes into its profile."""
    active = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PageError(f"chromium exited with {process.returncode}")
        if active.exists() and active.read_text().strip():
            return int(active.read_text().split()[0])
        time.sleep(0.1)
    raise PageError(f"chromium opened no DevTools port within {timeout} s")


@contextmanager
def browser(net_log=None):
    """Start headless Chromium with a fresh profile; yield its first tab as a ``Page``."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
        if net_log:
            cmd.append(f"--log-net-log={net_log}")
        process = subprocess.Popen(
            [*cmd, "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            port = devtools_port(profile, process)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as answer:
                tab = next(t for t in json.load(answer) if t["type"] == "page")
            page = Page(tab["webSocketDebuggerUrl"])
            yield page
            page.send("Browser.close")
            page.socket.close()
            process.wait(timeout=30)  # a clean exit writes the network log out whole
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
