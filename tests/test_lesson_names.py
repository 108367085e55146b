"""Lessons, sheets and guides name only code that exists: every ``packdata`` module, function or
class they import, call or mention is there, so prose and code cannot drift apart from the package.

Three kinds of use are found in each document: ``from packdata[.x] import a, b`` statements (also
parenthesised over several lines), dotted names ``packdata.x`` and ``packdata.x.Name`` anywhere, and
``x.Name`` in code blocks of a document that imports ``x`` with ``from packdata import x``."""

import importlib
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    *sorted(ROOT.glob("notebooks/[0-9][0-9]_*.md")),
    *sorted(ROOT.glob("solutions/[0-9][0-9]_*.md")),
    ROOT / "README.md",
    ROOT / "INSTRUCTORS.md",
    ROOT / "RECIPES.md",
    ROOT / "HUB.md",
    ROOT / "data" / "README.md",
]
CODE_BLOCK = re.compile(r"^```.*?$(.*?)^```", re.M | re.S)
FROM_IMPORT = re.compile(r"\bfrom[ \t]+(packdata(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)")
IMPORT_AS = re.compile(r"\bimport[ \t]+(packdata(?:\.\w+)+)[ \t]+as[ \t]+(\w+)")
DOTTED = re.compile(r"(?<![\w.])packdata((?:\.\w+)+)")
NAME_AS = re.compile(r"\s*(\w+)(?:\s+as\s+(\w+))?\s*")
NEWLINE = "\n"


def is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is no package, or no module at all
        return False


def imported(statement):
    """``(offset, name, alias)`` of every name a ``from packdata... import`` statement imports; a
    statement quoted in prose ends where the prose goes on."""
    body = re.sub(r"#[^\n]*", lambda comment: " " * len(comment[0]), statement[2])
    for item in re.finditer(r"[^,()]+", body):
        name = NAME_AS.match(item[0])
        if not name or not name[1]:
            return
        yield statement.start(2) + item.start() + name.start(1), name[1], name[2]
        if name.end() != len(item[0]):
            return


def names_in(text):
    """``(offset, module, [attribute, ...])`` of every packdata name the text uses."""
    found, local = [], {}  # local: name in the document's code -> the module it stands for
    code = [block.span(1) for block in CODE_BLOCK.finditer(text)]
    statements = list(FROM_IMPORT.finditer(text))
    for statement in statements:
        for offset, name, alias in imported(statement):
            module = f"{statement[1]}.{name}"
            if is_module(module):
                found.append((offset, module, []))
                if any(start <= offset < end for start, end in code):
                    local[alias or name] = module
            else:
                found.append((offset, statement[1], [name]))
    local |= {match[2]: match[1] for match in IMPORT_AS.finditer(text)}
    for match in DOTTED.finditer(text):
        if match.start() in {statement.start(1) for statement in statements}:
            continue  # the module of a from-import: checked with the names it imports
        parts = ["packdata", *match[1][1:].split(".")]
        n = next(n for n in range(len(parts), 0, -1) if is_module(".".join(parts[:n])))
        found.append((match.start(), ".".join(parts[:n]), parts[n:]))
    for start, end in code:
        for name, module in local.items():
            for match in re.finditer(rf"(?<![\w.]){name}((?:\.\w+)+)", text[start:end]):
                found.append((start + match.start(), module, match[1][1:].split(".")))
    return found


def wrong(module, attributes):
    """What does not exist of ``module.attribute.attribute...``, or None when all of it does."""
    if not is_module(module):
        return f"no module {module}"
    thing = importlib.import_module(module)
    for n, attribute in enumerate(attributes, 1):
        name = ".".join([module, *attributes[:n]])
        if hasattr(thing, attribute):
            thing = getattr(thing, attribute)
        elif is_module(name):
            thing = importlib.import_module(name)
        else:
            return f"no {name}"
    return None


def problems_in(text):
    """``N: what does not exist``, N the line, for every packdata name of the text not there."""
    return [
        f"{text.count(NEWLINE, 0, offset) + 1}: {problem}"
        for offset, module, attributes in sorted(names_in(text))
        if (problem := wrong(module, attributes))
    ]


def test_every_packdata_name_in_the_lessons_exists():
    problems = []
    for document in DOCUMENTS:
        text, where = document.read_text(), document.relative_to(ROOT)
        problems += [f"{where}:{problem}" for problem in problems_in(text)]
        if document.parent.name in ("notebooks", "solutions") and not names_in(text):
            problems.append(f"{where}: no packdata name found at all: is the scan broken?")
    assert not problems, "names of code that does not exist:\n" + "\n".join(problems)


def test_the_scan_finds_every_kind_of_name():
    text = """Prose: `packdata.nomodule`, `packdata.streaming.NoClass`; imagefolder.prose_only
and `from packdata.images import decode_image, no_decoder`, which the prose goes on from.
```python
from packdata import imagefolder, course as tools
from packdata.streaming import (
    ShardDataset,  # a comment, then
    NoSuchThing,
)
import packdata.layout as lay
imagefolder.load_manifest(root), imagefolder.no_function(), tools.packing_checks.no_check
lay.no_layout, other.imagefolder.not_ours, tools.packing_checks.check_pack_zip
from packdata.gone import thing
```
"""
    assert problems_in(text) == [
        "1: no packdata.nomodule",
        "1: no packdata.streaming.NoClass",
        "2: no packdata.images.no_decoder",
        "7: no packdata.streaming.NoSuchThing",
        "10: no packdata.imagefolder.no_function",
        "10: no packdata.course.packing_checks.no_check",
        "11: no packdata.layout.no_layout",
        "12: no module packdata.gone",
    ]
    found = {(module, *attributes) for _, module, attributes in names_in(text)}
    assert {
        ("packdata.images", "decode_image"),
        ("packdata.streaming", "ShardDataset"),
        ("packdata.imagefolder", "load_manifest"),
        ("packdata.course", "packing_checks", "check_pack_zip"),
    } <= found
