"""Build offline reveal.js decks from the jupytext lessons in ``notebooks/``."""

import fcntl
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
from nbclient import NotebookClient
from nbconvert import SlidesExporter
from traitlets.config import Config

from packdata.shardcache import flocked

NPM_PACKAGES = ["reveal.js@4.0.2", "jquery@2.2.4", "requirejs@2.1.10", "mathjax@2.7.7"]

# What the decks load from each npm package, relative to node_modules/<package>/.
VENDOR_FILES = {
    "reveal.js": ["dist/reveal.js", "dist/reveal.css", "dist/theme/simple.css", "plugin/notes"],
    "jquery": ["dist/jquery.min.js"],
    "requirejs": ["require.js"],
    "mathjax": [
        "MathJax.js",
        "config/TeX-AMS_CHTML-full.js",
        "config/Safe.js",
        "extensions",
        "jax/element",
        "jax/input/TeX",
        "jax/output/CommonHTML",
        "fonts/HTML-CSS/TeX/woff",
    ],
}

OFFLINE_TRAITS = {
    "reveal_theme": "simple",
    "reveal_url_prefix": "vendor/reveal.js",
    "require_js_url": "vendor/requirejs/require.js",
    "jquery_url": "vendor/jquery/dist/jquery.min.js",
    "mathjax_url": "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
}

TEMPLATE = Path(__file__).with_name("templates") / "offline_reveal.html.j2"
DEFAULT_NPM_PREFIX = Path(__file__).resolve().parents[3] / "build" / "npm"

# A tag that makes the browser fetch something from another host.
REMOTE_ASSET = re.compile(
    r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//[^\s\"'>]+",
    re.IGNORECASE,
)
# The reveal themes pull their web fonts from Google; offline they fall back to the system fonts.
CSS_REMOTE_IMPORT = re.compile(r"@import url\((?:https?:)?//[^)]*\);\s*")


# The reveal.js canvas, in CSS pixels: the size of the smallest screen the decks must fit, a
# 1280x720 projector, so that a slide is drawn at almost its own size there (reveal scales the
# canvas to the window, less DECK_MARGIN of it on each side: 0.98 at 1280x720).
DECK_SIZE = (1280, 720)
DECK_MARGIN = 0.02
# Sizes for that canvas. The lessons' visible code cells have at most 90 columns and 20 lines
# (tests/test_slide_fit.py); at 15 px DejaVu Sans Mono they take 815 x 360 px, and every text is
# at least 14 px on a 1280x720 screen (15 x 0.98 = 14.7). The execution counts in front of each
# cell ("In [3]:") would take 110 px of every line and teach nothing on a slide: hidden.
DECK_CSS = """
:root {
  --jp-code-font-size: 15px;
  --jp-code-line-height: 1.2;
  --jp-content-font-size1: 20px;
  --jp-ui-font-size1: 18px;
  --jp-cell-prompt-width: 0px;
}
.reveal { font-size: 20px; }
.reveal h1 { font-size: 44px; }
.reveal h2 { font-size: 34px; }
.reveal h3 { font-size: 26px; }
.reveal .jp-InputPrompt, .reveal .jp-OutputPrompt { display: none; }
.reveal .jp-RenderedHTMLCommon { font-size: 20px; line-height: 1.35; }
.reveal .jp-RenderedHTMLCommon p, .reveal .jp-RenderedHTMLCommon ul,
.reveal .jp-RenderedHTMLCommon ol { margin-bottom: 0.5em; }
.reveal .jp-RenderedHTMLCommon code { font-size: 18px; }
.reveal .jp-RenderedHTMLCommon table { font-size: 18px; }
.reveal div.highlight > pre, .reveal div.jp-OutputArea-output > pre {
  width: auto;
  padding: 4px 6px;
  font-size: var(--jp-code-font-size);
  line-height: var(--jp-code-line-height);
  white-space: pre;
  overflow-x: auto;
}
/* tracebacks and warnings carry long paths: they wrap instead of scrolling sideways */
.reveal div.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"] > pre {
  white-space: pre-wrap;
  overflow-wrap: anywhere;
}
.reveal .jp-Cell { padding: 2px 0; }
.reveal section img { max-height: 440px; width: auto; }
"""


def fit_to_screen(html):
    """Add DECK_CSS after the theme's styles and DECK_MARGIN to reveal's settings."""
    html = html.replace("</head>", f'<style id="deck-fit">{DECK_CSS}</style>\n</head>', 1)
    return html.replace("Reveal.initialize({", f"Reveal.initialize({{\n  margin: {DECK_MARGIN},", 1)


def slide_type(cell):
    """A cell's reveal role: slide, subslide, fragment, skip, notes or ``-`` (continues)."""
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def deck_slides(cells):
    """How many slides the deck of a notebook with ``cells`` has: the cells it shows that start a
    slide or subslide, plus the slide nbconvert opens at the first shown cell when that starts none.
    """
    shown = [cell for cell in cells if slide_type(cell) not in ("skip", "notes")]
    starts = sum(slide_type(cell) in ("slide", "subslide") for cell in shown)
    return starts + (bool(shown) and slide_type(shown[0]) not in ("slide", "subslide"))


def exporter(**traits):
    """nbconvert's slide exporter with ``traits``, which also merges each cell's stream outputs
    and applies their carriage returns, as a terminal and JupyterLab do: a progress line rewritten
    with ``\r`` (a command run by ``!`` gets a terminal) shows its last state, not every state
    glued into one line."""
    coalesced = Config({"CoalesceStreamsPreprocessor": {"enabled": True}})
    return SlidesExporter(config=coalesced, **traits)


def build_slides(notebooks_dir, out_dir, execute=True, npm_prefix=None):
    """Write one ``NN_topic.slides.html`` deck per ``NN_*.md`` lesson; return their paths."""
    notebooks_dir, out_dir = Path(notebooks_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offline = vendor_assets(out_dir / "vendor", Path(npm_prefix or DEFAULT_NPM_PREFIX))
    # images travel inside the deck; a slide taller than the canvas scrolls (a last resort: the
    # browser test in tests/test_slides.py fails on it); the canvas is DECK_SIZE, see DECK_CSS
    traits = {
        "embed_images": True,
        "reveal_scroll": True,
        "reveal_width": str(DECK_SIZE[0]),
        "reveal_height": str(DECK_SIZE[1]),
    }
    if offline:
        traits.update(OFFLINE_TRAITS, template_file=str(TEMPLATE))
    decks = []
    for lesson in sorted(notebooks_dir.glob("[0-9][0-9]_*.md")):
        nb = jupytext.read(lesson)
        resources = {"metadata": {"name": lesson.stem, "path": str(notebooks_dir)}}
        if execute:
            NotebookClient(
                nb,
                timeout=1200,
                kernel_name="python3",
                store_widget_state=False,  # widget state would pull the widget renderer from a CDN
                resources=resources,
            ).execute(stderr=subprocess.DEVNULL)  # the kernel's own stderr: lesson 3's worker
            # processes print their intended tracebacks there; the deck shows what cells print
        html, _ = exporter(**traits).from_notebook_node(nb, resources=resources)
        html = fit_to_screen(html)
        if offline:
            check_offline(html, lesson)
        deck = out_dir / f"{lesson.stem}.slides.html"
        deck.write_text(html, encoding="utf-8")
        decks.append(deck)
    return decks


def vendor_assets(vendor_dir, npm_prefix):
    """Copy reveal.js, jQuery, require.js and MathJax into ``vendor_dir``; False when npm is
    missing."""
    if shutil.which("npm") is None:
        print(
            "warning: npm not found, the slides load reveal.js and MathJax from CDNs and need "
            "network",
            file=sys.stderr,
        )
        return False
    # decks built side by side (make test's xdist workers) install and copy one at a time: two
    # npm installs into one prefix fail with ENOTEMPTY
    npm_prefix.mkdir(parents=True, exist_ok=True)
    with flocked(npm_prefix / ".vendor.lock", fcntl.LOCK_EX):
        install_and_copy(vendor_dir, npm_prefix)
    return True


def install_and_copy(vendor_dir, npm_prefix):
    """npm-install NPM_PACKAGES into ``npm_prefix`` when missing; copy VENDOR_FILES from it."""
    modules = npm_prefix / "node_modules"
    if not all((modules / name / "package.json").exists() for name in VENDOR_FILES):
        cmd = [
            "npm",
            "install",
            "--no-save",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(npm_prefix),
            *NPM_PACKAGES,
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    for name, paths in VENDOR_FILES.items():
        for rel in paths:
            source, target = modules / name / rel, vendor_dir / name / rel
            if source.is_dir():
                shutil.copytree(
                    source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("a11y")
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
            if target.suffix == ".css":
                target.write_text(CSS_REMOTE_IMPORT.sub("", target.read_text()))


def check_offline(html, lesson):
    """Raise if the deck would still load a script, style or image from another host."""
    remote = REMOTE_ASSET.findall(html)
    if remote:
        raise RuntimeError(f"{lesson}: the deck still loads remote assets: {remote}")
