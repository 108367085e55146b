"""Build offline reveal.js decks from the jupytext lessons in ``notebooks/``."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
from nbclient import NotebookClient
from nbconvert import SlidesExporter

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


def build_slides(notebooks_dir, out_dir, execute=True, npm_prefix=None):
    """Write one ``NN_topic.slides.html`` deck per ``NN_*.md`` lesson; return their paths."""
    notebooks_dir, out_dir = Path(notebooks_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offline = vendor_assets(out_dir / "vendor", Path(npm_prefix or DEFAULT_NPM_PREFIX))
    # images travel inside the deck; long slides scroll; a 16:9 canvas wide enough for 100-column
    # code
    traits = {
        "embed_images": True,
        "reveal_scroll": True,
        "reveal_width": "1400",
        "reveal_height": "790",
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
            ).execute()
        html, _ = SlidesExporter(**traits).from_notebook_node(nb, resources=resources)
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
    return True


def check_offline(html, lesson):
    """Raise if the deck would still load a script, style or image from another host."""
    remote = REMOTE_ASSET.findall(html)
    if remote:
        raise RuntimeError(f"{lesson}: the deck still loads remote assets: {remote}")
