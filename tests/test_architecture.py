"""The package's shape: one idea per module, imports that only run down the layers listed in
``packdata/__init__.py``, no cycle, and the library apart from the course tooling."""

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import packdata

PACKAGE = Path(packdata.__file__).parent


def find_modules():
    """``{dotted name: path}`` of every module of the package; a package is its ``__init__.py``."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = find_modules()


def imports(name, source, is_package=False):
    """The package's modules that module ``name`` imports, at the top or inside a function:
    ``from packdata import x`` and ``from . import x`` import ``packdata.x`` when that is a module,
    ``packdata`` itself when ``x`` is a name defined there."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: one dot is this package, each further dot one level up
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}".rstrip(".")
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return (found & MODULES.keys()) - {name}


def graph():
    """``{module: the package's modules it imports}``."""
    return {
        name: imports(name, path.read_text(), path.name == "__init__.py")
        for name, path in MODULES.items()
    }


def is_course(name):
    return name == "packdata.course" or name.startswith("packdata.course.")


def layers():
    """``{module: layer number}`` from the package docstring's list, lowest layer first."""
    numbers, layer = {}, 0
    for line in packdata.__doc__.splitlines():
        if line and not line.startswith(("-", " ")) and numbers:
            layer += 1
        if match := re.match(r"- ``(\w+)``", line):
            numbers[f"packdata.{match[1]}"] = layer
    return numbers


def find_cycle(edges):
    """One import cycle as ``[a, b, ..., a]``, each module importing the next, or None."""
    try:
        TopologicalSorter(edges).prepare()
    except CycleError as error:
        return error.args[1][::-1]  # graphlib walks the edges backwards
    return None


def test_imports_are_found_however_they_are_written():
    source = """
import packdata.tario
from packdata import layout, __version__
from . import feedback
from ..images import decode_image

def later():
    from .. import course
"""
    assert imports("packdata.course.hub", source) == {
        "packdata.tario",
        "packdata.layout",
        "packdata",  # for __version__, which packdata/__init__.py defines
        "packdata.course.feedback",
        "packdata.images",
        "packdata.course",
    }
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_library_never_imports_the_course_tools():
    wrong = [
        f"{name} imports {other}"
        for name, others in graph().items()
        if not is_course(name)
        for other in sorted(others)
        if is_course(other)
    ]
    assert not wrong, "\n".join(wrong)


def test_every_module_starts_with_its_docstring():
    missing = [
        str(path.relative_to(PACKAGE.parent))
        for path in MODULES.values()
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not missing, f"no docstring as the first statement: {', '.join(missing)}"


def test_every_library_module_is_listed_in_its_layer():
    library = {name for name in MODULES if name != "packdata" and not is_course(name)}
    assert set(layers()) == library


def test_imports_only_run_down_the_layers():
    rank = layers()
    upward = [
        f"{name} (layer {rank[name]}) imports {other} (layer {rank[other]})"
        for name, others in graph().items()
        if name in rank
        for other in sorted(others)
        if other in rank and rank[other] > rank[name]
    ]
    assert not upward, "\n".join(upward)
