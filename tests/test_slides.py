"""The slide decks, and RISE in JupyterLab, present offline in headless Chromium.

Each deck is served from a loopback HTTP server while Chromium runs with every other host mapped
to an unresolvable name, so nothing can leave the machine. Chromium also writes its network log
(``--log-net-log``), which lists every request it started, including the ones that failed to
resolve. A request belongs to the page when its network isolation key names the page's site as the
top frame: the page's own scripts, styles, fonts, frames and sockets, whoever initiated them.
Every such request must go to a loopback address or stay on the machine (``file:``, ``data:``,
``blob:``). Chromium's background traffic (update checks, account lookups) is keyed to other
sites and ignored. The same check runs on the executed decks in ``test_deck_fits_the_screen`` and
on a RISE slideshow served by ``jupyter lab`` with the settings that ``packdata lab-settings``
writes (``test_rise_presents_offline``): RISE's default reveal theme imports Google Fonts.

"Reveal initialised" means reveal.js ran: it marks its ``<div class="reveal">`` as ``ready``
and adds its controls, both absent from the HTML that nbconvert writes.

``test_deck_fits_the_screen`` renders every lesson's deck, executed, at 1280x720 (the smallest
projector we plan for) and visits each slide with every fragment shown. It fails when an element
reaches past the slide's canvas to the left, right or bottom, when a code or output box (a
``<pre>``) has to scroll sideways (its ``scrollWidth`` exceeds its ``clientWidth``), when any box
has to scroll vertically (no output is allowed a fixed height with a scrollbar: make the output
shorter in the lesson; tracebacks and warnings wrap their long lines instead of scrolling sideways,
see ``DECK_CSS``), or when visible text is drawn smaller than 14 px on the screen (its CSS
size times reveal's scale). It names the deck, the slide (reveal's ``h.v`` number, 1-based, and
its ``#/h/v`` address) and the offending element. The decks are those in ``build/slides/`` when
they are newer than their lesson and than ``packdata.course.slides`` (``tests/test_lessons.py``,
which runs first, and ``make slides`` build them); otherwise the test builds and executes the lesson
itself, which takes minutes.
"""

import html
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
from urllib.parse import urlsplit

import jupytext
import nbformat
import pytest
from browser import CHROMIUM, OFFLINE_FLAGS
from labserver import lab_server

from packdata.course.slides import build_slides, exporter

ROOT = Path(__file__).resolve().parents[1]
# The site (scheme and host, no port) of every page the tests open, and where requests may go.
PAGE_SITE = "http://127.0.0.1"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
LOCAL_SCHEMES = {"file", "data", "blob"}
SCREEN = (1280, 720)
MIN_TEXT_PX = 14

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


def chromium(*args, budget_ms=5000):
    """Run headless Chromium with a fresh profile; return its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        flags = [*OFFLINE_FLAGS, f"--virtual-time-budget={budget_ms}"]
        cmd = [CHROMIUM, *flags, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def page_requests(net_log, site=PAGE_SITE):
    """URLs of every request Chromium started for pages whose top frame is on ``site``, from its
    network log."""
    log = json.loads(net_log.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params", {})
        if event["type"] == start_job and "url" in params:
            top_frame_site = params.get("network_isolation_key", "").split(" ")[0]
            if top_frame_site == site:
                urls.append(params["url"])
    return urls


def leaves_the_machine(url):
    """True when ``url`` is neither on a loopback address nor local to the browser."""
    parts = urlsplit(url)
    return parts.scheme not in LOCAL_SCHEMES and parts.hostname not in LOOPBACK_HOSTS


def assert_offline(net_log, expected):
    """The pages logged in ``net_log`` requested ``expected`` (a URL ending) and nothing outside
    the machine."""
    urls = page_requests(net_log)
    assert any(url.split("?")[0].endswith(expected) for url in urls), (
        f"the network log shows no request for {expected}: {urls[:5]}"
    )
    outside = sorted({url for url in urls if leaves_the_machine(url)})
    assert not outside, f"requests that leave the machine: {outside}"


def test_a_progress_line_rewritten_with_carriage_returns_shows_its_last_state():
    cell = nbformat.v4.new_code_cell("!packdata shards map ...")
    progress = "\rmapped 1/2 shards (a)\rmapped 2/2 shards (b)\n"
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=progress)]
    html_text, _ = exporter().from_notebook_node(nbformat.v4.new_notebook(cells=[cell]))
    assert "mapped 2/2 shards (b)" in html_text and "mapped 1/2" not in html_text


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
        dom = chromium(
            f"--log-net-log={net_log}", "--dump-dom", f"--screenshot={screenshot}",
            "--window-size={},{}".format(*SCREEN), url,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()

    assert re.search(r'<div class="reveal\b[^"]*\bready\b', dom), "reveal.js did not initialise"
    assert '<aside class="controls"' in dom

    counter = SectionCounter()
    counter.feed(dom)
    assert counter.inner == expected_slides(lesson)

    assert_offline(net_log, "/vendor/reveal.js/dist/reveal.js")
    assert f"/{deck.name}" in requested

    assert screenshot.stat().st_size > 10_000


@pytest.mark.parametrize("lesson", LESSONS[1:])
def test_lesson_scrolls_when_presented_live(lesson):
    """RISE cuts long slides off unless the notebook asks it to scroll."""
    notebook = jupytext.read(ROOT / "notebooks" / f"{lesson}.md")
    assert notebook.metadata.get("rise", {}).get("scroll") is True, (
        f"add 'rise: scroll: true' to {lesson}.md"
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``jupyter lab`` on loopback with the course's settings, serving a folder with the fixture
    lesson; yields ``(base URL, token)``."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    root.mkdir()
    (root / "00_fixture.md").write_text(FIXTURE)
    with lab_server(root, home) as server:
        yield server


def test_rise_presents_offline(lab, tmp_path):
    """RISE's slideshow, as the Lab preview shows it, with the theme our Lab settings choose."""
    base, token = lab
    net_log = tmp_path / "net.json"
    dom = chromium(
        f"--log-net-log={net_log}",
        "--dump-dom",
        "--window-size=1280,720",
        f"{base}/rise/00_fixture.md?token={token}",
        budget_ms=60_000,
    )
    assert re.search(r'<div class="[^"]*\breveal\b[^"]*\bready\b', dom), "RISE did not start"
    assert "Fixture deck" in dom
    assert_offline(net_log, "/static/rise/bundle.js")


def test_lab_opens_a_lesson_offline(lab, tmp_path):
    """JupyterLab itself, opening a lesson as a notebook (the settings make .md a notebook)."""
    base, token = lab
    net_log = tmp_path / "net.json"
    dom = chromium(
        f"--log-net-log={net_log}",
        "--dump-dom",
        "--window-size=1280,720",
        f"{base}/lab/tree/00_fixture.md?token={token}",
        budget_ms=60_000,
    )
    assert "jp-NotebookPanel" in dom, "Lab did not open the lesson as a notebook"
    assert_offline(net_log, "/lab/tree/00_fixture.md")


# Injected into a copy of a deck: once reveal.js is ready, visit every slide with every fragment
# shown, measure it and write the findings as JSON into <pre id="fit-report">.
FIT_SCRIPT = """
<script>
require(["vendor/reveal.js/dist/reveal.js"], function (Reveal) {
  var MIN_PX = %(min_px)s;
  // Boxes whose overflow is reported; of nested ones only the innermost that overflows.
  var BOXES = "h1, h2, h3, h4, p, li, pre, img, svg, table, blockquote, .MathJax_Display, " +
    ".jp-OutputArea-output, .jp-Cell, .jp-RenderedHTMLCommon";
  function describe(el) {
    var name = el.tagName.toLowerCase();
    var cls = (el.getAttribute("class") || "").trim().split(/\\s+/).filter(Boolean).slice(0, 2);
    if (cls.length) name += "." + cls.join(".");
    var text = (el.textContent || el.getAttribute("alt") || "").replace(/\\s+/g, " ").trim();
    return name + (text ? " '" + text.slice(0, 60) + "'" : "");
  }
  function hidden(el) {
    if (!el.getClientRects().length) return true;
    var style = getComputedStyle(el);
    return style.visibility === "hidden" || el.closest("aside.notes, .MJX_Assistive_MathML");
  }
  function measure(slide) {
    var canvas = document.querySelector(".reveal .slides").getBoundingClientRect();
    var scale = Reveal.getScale();
    var problems = [];
    var flagged = new Map();
    slide.querySelectorAll(BOXES).forEach(function (el) {
      if (hidden(el)) return;
      var r = el.getBoundingClientRect(), why = [];
      if (r.left < canvas.left - 1) why.push("reaches past the left edge by " +
        Math.round((canvas.left - r.left) / scale) + " px");
      if (r.right > canvas.right + 1) why.push("reaches past the right edge by " +
        Math.round((r.right - canvas.right) / scale) + " px");
      if (r.bottom > canvas.bottom + 1) why.push("reaches past the bottom by " +
        Math.round((r.bottom - canvas.bottom) / scale) + " px");
      if (el.tagName === "PRE" && el.scrollWidth > el.clientWidth + 1)
        why.push("scrolls sideways (" + el.scrollWidth + " > " + el.clientWidth + " px)");
      var oy = getComputedStyle(el).overflowY;
      if ((oy === "auto" || oy === "scroll") && el.scrollHeight > el.clientHeight + 1)
        why.push("scrolls vertically (" + el.scrollHeight + " > " + el.clientHeight + " px)");
      if (why.length) flagged.set(el, why);
    });
    flagged.forEach(function (why, el) {
      var inner = false;
      flagged.forEach(function (other_why, other) {
        if (other !== el && el.contains(other)) inner = true;
      });
      if (!inner) problems.push(describe(el) + ": " + why.join(", "));
    });
    var small = new Set();
    var walker = document.createTreeWalker(slide, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      var el = walker.currentNode.parentElement;
      if (!walker.currentNode.textContent.trim() || small.has(el) || hidden(el)) continue;
      var px = parseFloat(getComputedStyle(el).fontSize) * scale;
      if (px < MIN_PX - 0.01) {
        small.add(el);
        problems.push(describe(el) + ": text of " + px.toFixed(1) + " px < " + MIN_PX + " px");
      }
    }
    return problems;
  }
  function finish(report) {
    var out = document.createElement("pre");
    out.id = "fit-report";
    out.style.display = "none";
    out.textContent = JSON.stringify(report);
    document.body.appendChild(out);
  }
  function run() {
    Reveal.configure({transition: "none", backgroundTransition: "none", fragments: false});
    var places = [];
    Reveal.getHorizontalSlides().forEach(function (top, h) {
      var stack = top.querySelectorAll(":scope > section");
      for (var v = 0; v < Math.max(stack.length, 1); v++) places.push([h, v]);
    });
    var report = {scale: Reveal.getScale(), viewport: [innerWidth, innerHeight], slides: []};
    function visit(i) {
      if (i === places.length) return finish(report);
      Reveal.slide(places[i][0], places[i][1]);
      Reveal.layout();
      setTimeout(function () {
        var h = places[i][0], v = places[i][1];
        report.slides.push({h: h, v: v, problems: measure(Reveal.getCurrentSlide())});
        visit(i + 1);
      }, 150);
    }
    visit(0);
  }
  if (Reveal.isReady()) run(); else Reveal.addEventListener("ready", run);
});
</script>
"""


def fresh_deck(lesson):
    """The deck that ``make slides`` built for ``lesson`` when it is newer than the lesson and
    the deck builder; else None."""
    deck = ROOT / "build" / "slides" / f"{lesson.stem}.slides.html"
    sources = [lesson, ROOT / "src" / "packdata" / "course" / "slides.py"]
    if deck.exists() and all(deck.stat().st_mtime > path.stat().st_mtime for path in sources):
        return deck
    return None


def fit_report(deck, folder):
    """Render ``deck`` in a SCREEN-sized viewport with FIT_SCRIPT; return ``[(slide, problems)]``.
    Fails when the deck, executed outputs included, requests anything outside the machine.

    Headless Chromium's ``--window-size`` includes the window's own chrome, whose height varies
    between versions: the first render measures the viewport, and a second one, when needed, grows
    the window so that the page itself gets exactly SCREEN."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / deck.name
    probe.write_text(
        deck.read_text(encoding="utf-8") + FIT_SCRIPT % {"min_px": MIN_TEXT_PX}, encoding="utf-8"
    )
    if not (folder / "vendor").exists():
        (folder / "vendor").symlink_to(deck.parent / "vendor", target_is_directory=True)
    window = list(SCREEN)
    net_log = folder / "net.json"
    server, _ = serve(folder)
    try:
        url = f"http://127.0.0.1:{server.server_port}/{probe.name}"
        for _ in range(2):
            dom = chromium(
                f"--log-net-log={net_log}",
                "--dump-dom",
                "--window-size={},{}".format(*window),
                url,
                budget_ms=60_000,
            )
            found = re.search(r'<pre id="fit-report"[^>]*>(.*?)</pre>', dom, re.DOTALL)
            assert found, f"{deck.name}: the fit probe wrote no report (did reveal.js start?)"
            report = json.loads(html.unescape(found.group(1)))
            if report["viewport"] == list(SCREEN):
                break
            window = [w + s - v for w, s, v in zip(window, SCREEN, report["viewport"])]
    finally:
        server.shutdown()
        server.server_close()
    assert report["viewport"] == list(SCREEN), f"viewport {report['viewport']}, not {SCREEN}"
    assert_offline(net_log, "/vendor/reveal.js/dist/reveal.js")  # the outputs load nothing either
    return [
        (f"slide {s['h'] + 1}.{s['v'] + 1} (#/{s['h']}/{s['v']})", s["problems"])
        for s in report["slides"]
    ]


@pytest.mark.parametrize("lesson", LESSONS[1:])
def test_deck_fits_the_screen(lesson, tmp_path):
    source = ROOT / "notebooks" / f"{lesson}.md"
    deck = fresh_deck(source)
    if deck is None:
        folder = tmp_path / "notebooks"
        folder.mkdir()
        shutil.copy(source, folder / source.name)
        (deck,) = build_slides(folder, tmp_path / "slides", execute=True)
    slides = fit_report(deck, tmp_path / "probe")
    assert slides, f"{deck.name}: no slides measured"
    misfits = [
        f"{deck.name} {slide}: {problem}" for slide, problems in slides for problem in problems
    ]
    assert not misfits, "\n".join(misfits)
