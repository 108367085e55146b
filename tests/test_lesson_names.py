"""Lessons, sheets and guides name only code that exists: every ``packdata`` module, function or
class a lesson imports, calls or mentions is there, so prose and code cannot drift apart."""

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [
        *ROOT.glob("notebooks/[0-9][0-9]_*.md"),
        *ROOT.glob("solutions/[0-9][0-9]_*.md"),
        ROOT / "README.md",
        ROOT / "INSTRUCTORS.md",
        ROOT / "data" / "README.md",
    ]
)
FROM_IMPORT = re.compile(r"from (packdata(?:\.\w+)*) import (\([^)]*\)|[^\n#]+)")
DOTTED = re.compile(r"\bpackdata((?:\.\w+)+)")


def names_in(text):
    """``(line, module, attribute or None)`` of every packdata name the text uses."""
    found = []
    modules = {}  # local name -> module, from `from packdata import x [as y]`
    for match in FROM_IMPORT.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for item in match[2].strip("()").replace("\n", " ").split(","):
            name, _, alias = item.strip().partition(" as ")
            if not name:
                continue
            module = f"{match[1]}.{name}"
            if importlib.util.find_spec(match[1]) and _is_module(module):
                modules[alias or name] = module
                found.append((line, module, None))
            else:
                found.append((line, match[1], name))
    for match in DOTTED.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        parts = ["packdata", *match[1].strip(".").split(".")]
        module = next(
            ".".join(parts[:n]) for n in range(len(parts), 0, -1) if _is_module(".".join(parts[:n]))
        )
        rest = parts[len(module.split(".")) :]
        found.append((line, module, rest[0] if rest else None))
    for local, module in modules.items():
        for match in re.finditer(rf"(?<![\w.]){re.escape(local)}\.(\w+)", text):
            found.append((text.count("\n", 0, match.start()) + 1, module, match[1]))
    return found


def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_packdata_name_exists(document):
    missing = []
    for line, module, attribute in names_in(document.read_text()):
        if not _is_module(module):
            missing.append(f"line {line}: no module {module}")
        elif attribute and not hasattr(importlib.import_module(module), attribute):
            missing.append(f"line {line}: {module} has no {attribute}")
    assert not missing, (
        f"{document.relative_to(ROOT)} names code that does not exist:\n" + "\n".join(missing)
    )


def test_the_check_finds_a_wrong_name():
    text = "\n".join(
        [
            "from packdata.streaming import ShardDataset, NoSuchThing",
            "from packdata import imagefolder",
            "imagefolder.load_manifest(root)",
            "imagefolder.no_such_function()",
            "packdata.nomodule",
        ]
    )
    used = {(module, attribute) for _, module, attribute in names_in(text)}
    assert ("packdata.streaming", "NoSuchThing") in used
    assert ("packdata.imagefolder", "no_such_function") in used
    assert ("packdata", "nomodule") in used
