"""The package's shape: one idea per module, imports that only run down the layers listed in
``packdata/__init__.py``, no cycle, and the library apart from the course tooling."""

import ast
import re
from pathlib import Path

import packdata

PACKAGE = Path(packdata.__file__).parent


def modules():
    """``{dotted name: path}`` of every module of the package (``__init__`` files left out)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] != "__init__":
            found[".".join(parts)] = path
    return found


def imports(name, path):
    """The package's modules that module ``name`` imports, at the top or inside a function."""
    package = name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {module for module in found if module in modules()} - {name}


def graph():
    return {name: imports(name, path) for name, path in modules().items()}


def cycle(edges):
    """One import cycle as a list of module names, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for after in sorted(edges[node]):
            if state.get(after) == "open":
                return [*trail[trail.index(after) :], after]
            if after not in state and (found := visit(after, [*trail, after])):
                return found
        state[node] = "done"
        return None

    return next(
        (found for node in edges if node not in state if (found := visit(node, [node]))), None
    )


def layers():
    """``{module: layer number}`` from the package docstring's list, lowest layer first."""
    numbers, layer = {}, 0
    for line in packdata.__doc__.splitlines():
        if line and not line.startswith(("-", " ")) and numbers:
            layer += 1
        if match := re.match(r"- ``(\w+)``", line):
            numbers[f"packdata.{match[1]}"] = layer
    return numbers


def test_no_import_cycle():
    assert cycle(graph()) is None, f"import cycle: {' -> '.join(cycle(graph()))}"


def test_every_module_is_listed_in_its_layer():
    library = {name for name in modules() if not name.startswith("packdata.course.")}
    assert set(layers()) == library


def test_imports_only_run_down_the_layers():
    rank = layers()
    upward = [
        f"{name} ({rank[name]}) imports {other} ({rank[other]})"
        for name, others in graph().items()
        if name in rank
        for other in others
        if other in rank and rank[other] > rank[name]
    ]
    assert not upward, "\n".join(upward)


def test_the_library_never_imports_the_course_tools():
    library = {
        name: others for name, others in graph().items() if not name.startswith("packdata.course")
    }
    assert not {
        name: others
        for name, others in library.items()
        if any(o.startswith("packdata.course") for o in others)
    }


def test_every_module_says_what_it_is_for():
    missing = [
        name
        for name, path in modules().items()
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not missing
