"""The slide decks open offline in headless Chromium.

Each deck is served from a loopback HTTP server while Chromium runs with every other host mapped
to an unresolvable name, so nothing can leave the machine. Chromium also writes its network log
(``--log-net-log``), which lists every request it started, including the ones that failed to
resolve. Requests whose initiator is the deck's origin are the deck's own (its scripts, styles,
fonts); the test asserts they all went to that origin. Chromium's background traffic (update
checks, account lookups) carries no such initiator and is ignored.

"Reveal initialised" means reveal.js ran: it marks its ``<div class="reveal">`` as ``ready``
and adds its controls, both absent from the HTML that nbconvert writes.
"""

import json
import re
import shutil
import subprocess
import tempfile
import threading
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jupytext
import pytest

from packdata.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--virtual-time-budget=5000",
]

FIXTURE = """\
<!-- #region slideshow={"slide_type": "slide"} -->
# Fixture deck

Inline math $e^{i\\pi} + 1 = 0$.
<!-- #endregion -->

```python slideshow={"slide_type": "fragment"}
print(1 + 1)
```

<!-- #region slideshow={"slide_type": "subslide"} -->
$$\\sum_{i=1}^n i = \\frac{n(n+1)}{2}$$
<!-- #endregion -->

```python slideshow={"slide_type": "skip"}
hidden = True
```

<!-- #region slideshow={"slide_type": "slide"} -->
## Second slide
<!-- #endregion -->

<!-- #region slideshow={"slide_type": "notes"} -->
Speaker notes.
<!-- #endregion -->
"""

LESSONS = ["00_fixture"] + sorted(
    path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.md")
)

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)"),
    pytest.mark.skipif(
        shutil.which("npm") is None, reason="npm is needed to vendor reveal.js for offline decks"
    ),
]


class SectionCounter(HTMLParser):
    """Count ``<section>`` elements nested in another one: nbconvert's (sub)slides."""

    def __init__(self):
        super().__init__()
        self.depth = self.inner = 0

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self.inner += self.depth == 1
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "section":
            self.depth -= 1


def expected_slides(lesson):
    """Slides plus subslides in the source; nbconvert also starts one at the first visible cell."""
    types = [
        cell.metadata.get("slideshow", {}).get("slide_type", "-")
        for cell in jupytext.read(lesson).cells
    ]
    visible = [t for t in types if t not in ("skip", "notes")]
    return sum(t in ("slide", "subslide") for t in visible) + (
        visible[0] not in ("slide", "subslide")
    )


def serve(folder):
    """Serve ``folder`` on a free loopback port; return the server and the list of requested
    paths."""
    requested = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requested.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, requested


def chromium(*args):
    """Run headless Chromium with a fresh profile; return its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def deck_requests(net_log, origin):
    """URLs of the requests that the page at ``origin`` started, from a Chromium network log."""
    events = json.loads(net_log.read_text())["events"]
    params = [event.get("params", {}) for event in events]
    return [p["url"] for p in params if "url" in p and p.get("initiator") == origin]


@pytest.fixture(scope="module", params=LESSONS)
def lesson(request, tmp_path_factory):
    """A lesson alone in its folder: the fixture above or one of the course's lessons."""
    folder = tmp_path_factory.mktemp("notebooks")
    target = folder / f"{request.param}.md"
    if request.param == "00_fixture":
        target.write_text(FIXTURE)
    else:
        shutil.copy(ROOT / "notebooks" / target.name, target)
    return target


def test_deck_runs_offline(lesson, tmp_path):
    out = tmp_path / "slides"
    (deck,) = build_slides(lesson.parent, out, execute=False)
    assert deck.name == f"{lesson.stem}.slides.html"

    server, requested = serve(out)
    origin = f"http://127.0.0.1:{server.server_port}"
    url = f"{origin}/{deck.name}"
    net_log = tmp_path / "net.json"
    screenshot = ROOT / "build" / "slides" / f"{lesson.stem}.png"
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    try:
        dom = chromium(f"--log-net-log={net_log}", "--dump-dom", url)
        chromium(f"--screenshot={screenshot}", "--window-size=1280,720", url)
    finally:
        server.shutdown()
        server.server_close()

    assert re.search(r'<div class="reveal\b[^"]*\bready\b', dom), "reveal.js did not initialise"
    assert '<aside class="controls"' in dom

    counter = SectionCounter()
    counter.feed(dom)
    assert counter.inner == expected_slides(lesson)

    urls = deck_requests(net_log, origin)
    assert any(u.endswith("/vendor/reveal.js/dist/reveal.js") for u in urls), (
        "network log shows no deck requests"
    )
    assert [u for u in urls if not u.startswith(origin + "/")] == []
    assert f"/{deck.name}" in requested

    assert screenshot.stat().st_size > 10_000


@pytest.mark.parametrize("lesson", LESSONS[1:])
def test_lesson_scrolls_when_presented_live(lesson):
    """RISE cuts long slides off unless the notebook asks it to scroll."""
    notebook = jupytext.read(ROOT / "notebooks" / f"{lesson}.md")
    assert notebook.metadata.get("rise", {}).get("scroll") is True, (
        f"add 'rise: scroll: true' to {lesson}.md"
    )
