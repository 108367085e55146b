"""Every lesson cell that starts worker processes runs once more under ``spawn`` (macOS, Windows).

`make test` runs the whole of every notebook under ``forkserver`` (tests/start_method.py). Here each
lesson runs again under ``spawn``, but only its cells that start workers with the default start
method (found by what they call, see ``worker_cells``) and the earlier cells whose names they read:
the suite does not run every lesson twice. A cell that needs an earlier one for something other
than a name it binds (a file it wrote, say) fails here loudly, naming the cell.
"""

import ast
import os
import symtable
from pathlib import Path

import jupytext
import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
# the lessons; the exercise sheets' checks run their workers under forkserver with the rest. By
# default only the lessons whose workers run the streaming pipelines (ours and webdataset's) run
# again under spawn: all of them add about 400 s to `make test` on 2 cores (each spawned worker
# imports torch anew). PACKDATA_SPAWN_LESSONS=all runs every lesson's worker cells.
SPAWNED = "*" if os.environ.get("PACKDATA_SPAWN_LESSONS") == "all" else "0[45]"
LESSONS = sorted((ROOT / "notebooks").glob(f"{SPAWNED}_*.md"))
STARTUP = Path(__file__).with_name("start_method.py")
# keyword arguments that ask for worker processes, and the calls that make a pool of them
WORKER_KEYWORDS = {"num_workers", "workers", "processes"}
POOLS = {"Pool", "ProcessPoolExecutor"}
CONTEXT = "multiprocessing_context"
# calls that take a number of processes to describe a measurement, not to start them
REPORTS = {"verdict"}


def python_of(source):
    """A cell's source as plain Python (IPython's ``%magics`` become calls)."""
    return TransformerManager().transform_cell(source)


def asks_for_workers(value):
    """Whether a keyword's value may be a number of workers above zero."""
    return not (isinstance(value, ast.Constant) and value.value in (0, None))


def pins_context(call, pinned):
    """Whether ``call`` names its start method: ``multiprocessing_context=`` or ``**`` of a dict
    that holds one."""
    for keyword in call.keywords:
        if keyword.arg == CONTEXT:
            return True
        if keyword.arg is None and pinned & loaded_names(keyword.value):
            return True
    return False


def loaded_names(node):
    """The names ``node`` reads."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def stored_names(node):
    """The names an assignment target such as ``a, (b, c)`` stores."""
    return {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def bound_names(statement):
    """The names a top-level statement binds in the notebook's namespace (not those of its
    comprehensions or functions)."""
    table = symtable.symtable(ast.unparse(statement), "cell", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def asks_workers_here(node, pinned):
    """Whether ``node`` holds a call that asks for workers or a pool (``num_workers=2``, a dict
    with ``"num_workers"``, ``Pool(...)``), unless the call names its own start method."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call) and not pins_context(child, pinned):
            function = child.func
            name = getattr(function, "attr", getattr(function, "id", None))
            if (
                name in POOLS
                or name not in REPORTS
                and any(
                    keyword.arg in WORKER_KEYWORDS and asks_for_workers(keyword.value)
                    for keyword in child.keywords
                )
            ):
                return True
        if isinstance(child, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value == "num_workers" and asks_for_workers(value)
            for key, value in zip(child.keys, child.values)
        ):
            return True
    return False


def makes_starter(value, starters):
    """Whether the value ``value`` is, or holds, something that starts workers when used: a call
    of a function that does (it may return a loader), or a display of them: ``(loader, loader)``."""
    if isinstance(value, ast.Name):
        return value.id in starters
    if isinstance(value, ast.Call):
        return isinstance(value.func, ast.Name) and value.func.id in starters
    if isinstance(value, ast.Tuple | ast.List | ast.Set):
        return any(makes_starter(element, starters) for element in value.elts)
    if isinstance(value, ast.Dict):
        return any(makes_starter(element, starters) for element in value.values)
    return False


def holds_context(node):
    """Whether ``node`` builds a dict literal with a ``multiprocessing_context`` key."""
    return any(
        isinstance(child, ast.Dict)
        and any(isinstance(key, ast.Constant) and key.value == CONTEXT for key in child.keys)
        for child in ast.walk(node)
    )


def worker_cells(sources):
    """Indices of the cells that start workers with the default start method: a call that asks
    for workers (unless it names its own start method), or a use of a starter: a function defined
    with such a call, or what an assignment with one bound (a loader, a dict of runs)."""
    starters, pinned, found = set(), set(), set()
    for index, source in enumerate(sources):
        for statement in ast.parse(source).body:
            bound = bound_names(statement)
            here = asks_workers_here(statement, pinned)
            if holds_context(statement):
                pinned |= bound
            elif not here and not starters & loaded_names(statement):
                starters -= bound
            elif isinstance(statement, ast.FunctionDef | ast.ClassDef):
                starters |= bound
            else:
                found.add(index)
                value = getattr(statement, "value", None)
                holder = isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign)
                if holder and (here or makes_starter(value, starters)):
                    starters |= bound
                else:
                    starters -= bound  # a result: keys, rates
    return found


def global_names(source):
    """The global names ``source`` reads, its functions' bodies included."""

    def walk(table):
        names = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
        for child in table.get_children():
            names |= walk(child)
        return names

    return walk(symtable.symtable(source, "cell", "exec"))


def header_names(statement):
    """What a ``for`` or ``with`` binds before its body reads it."""
    if isinstance(statement, ast.For | ast.AsyncFor):
        return stored_names(statement.target)
    if isinstance(statement, ast.With | ast.AsyncWith):
        return set().union(
            *(stored_names(item.optional_vars) for item in statement.items if item.optional_vars)
        )
    return set()


def names_from_before(source):
    """The names a cell reads that it has not bound itself by then."""
    reads, bound = set(), set()
    for statement in ast.parse(source).body:
        reads |= global_names(ast.unparse(statement)) - bound - header_names(statement)
        bound |= bound_names(statement)
    return reads


def needed_cells(sources, chosen):
    """``chosen`` and every earlier cell that binds a name they read (the latest binder before the
    reader), transitively; the first cell (imports and set-up) always."""
    binds = [set().union(*map(bound_names, ast.parse(s).body)) for s in sources]
    needed, todo = set(), sorted(chosen | {0})
    while todo:
        reader = todo.pop()
        needed.add(reader)
        for name in names_from_before(sources[reader]):
            binder = next((i for i in range(reader - 1, -1, -1) if name in binds[i]), None)
            if binder is not None and binder not in needed and binder not in todo:
                todo.append(binder)
    return sorted(needed)


def spawn_selection(path):
    """The code cells of lesson ``path`` to run under spawn (an empty list: none starts workers)."""
    cells = [cell for cell in jupytext.read(path).cells if cell.cell_type == "code"]
    sources = [python_of(cell.source) for cell in cells]
    chosen = worker_cells(sources)
    return [cells[i] for i in needed_cells(sources, chosen)] if chosen else []


SELECTIONS = {path: spawn_selection(path) for path in LESSONS}


def test_the_selection_follows_functions_loaders_and_names():
    sources = [
        "import os\nfrom torch.utils.data import DataLoader\n"
        "fast = {'multiprocessing_context': 'fork'}",
        "data = list(range(8))\nunused = os.getpid()",
        "def make(workers=2):\n    return DataLoader(data, num_workers=workers)",
        "loader = make()",
        "keys = [key for key in loader]",
        "print(len(keys))",  # a result of workers, not a start of them
        "DataLoader(data, num_workers=2, **fast)\nDataLoader(data, num_workers=0)",
        "DataLoader(data, num_workers=1, multiprocessing_context='fork')",
    ]
    assert worker_cells(sources) == {3, 4}
    assert needed_cells(sources, {3, 4}) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "path",
    [path for path, cells in SELECTIONS.items() if cells],
    ids=lambda path: f"{path.parent.name}/{path.stem}",
)
def test_worker_cells_run_under_spawn(path, monkeypatch):
    monkeypatch.setenv("PYTHONSTARTUP", str(STARTUP))
    monkeypatch.setenv("PACKDATA_START_METHOD", "spawn")
    monkeypatch.setenv("PACKDATA_SIZE", os.environ.get("PACKDATA_SIZE", "small"))
    notebook = nbformat.v4.new_notebook(cells=SELECTIONS[path])
    notebook.metadata = jupytext.read(path).metadata
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": path.parent}}
    )
    client.execute()
