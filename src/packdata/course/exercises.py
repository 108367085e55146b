"""Generate learner exercises from worked solutions: one source, no hand-made twins.

A solution notebook (``solutions/NN_topic.md``, jupytext Markdown) marks the learner's part inside
code cells::

    def count_per_class(root):
        ### HINT: walk the class folders with Path.iterdir()
        ### BEGIN SOLUTION
        return {d.name: len(list(d.iterdir())) for d in Path(root).iterdir() if d.is_dir()}
        ### END SOLUTION

The exercise replaces each region with a stub that raises ``NotImplementedError`` carrying the hint,
tags the cell ``raises-exception`` (so nbval expects the error), and drops cells tagged
``solution-only`` (explanations of the answer).
"""

import textwrap
from pathlib import Path

import jupytext

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
STUB_TAG, SOLUTION_ONLY_TAG = "raises-exception", "solution-only"


class ExerciseSourceError(ValueError):
    """A solution notebook whose markers do not pair up."""


STUB_COLUMNS = 90  # as wide as a slide's code


def make_stub(indent, hints):
    """The line that stands where a solution was; a message too long for one line of
    ``STUB_COLUMNS`` goes over several, as adjacent strings."""
    message = "Your turn! Hint: " + (" ".join(hints) or "see the text above")
    line = f"{indent}raise NotImplementedError({message!r})"
    if len(line) <= STUB_COLUMNS:
        return line
    inner = indent + " " * 4
    # the pieces keep their spaces, so that the strings join into the message exactly
    pieces = textwrap.wrap(
        message, STUB_COLUMNS - len(inner) - 4, drop_whitespace=False, break_long_words=False
    )
    strings = "".join(f"{inner}{piece!r}\n" for piece in pieces)
    return f"{indent}raise NotImplementedError(\n{strings}{indent})"


def strip_solutions(source, where="cell"):
    """Replace every solution region of one cell's source by a stub; return (source, n_regions)."""
    out, hints, in_solution, regions = [], [], False, 0
    for number, line in enumerate(source.splitlines(), start=1):
        marker = line.strip()
        if marker.startswith(HINT):
            hints.append(marker[len(HINT) :].strip())
        elif marker == BEGIN:
            if in_solution:
                raise ExerciseSourceError(f"{where}, line {number}: nested {BEGIN}")
            in_solution, regions = True, regions + 1
            out.append(make_stub(line[: len(line) - len(line.lstrip())], hints))
            hints = []
        elif marker == END:
            if not in_solution:
                raise ExerciseSourceError(f"{where}, line {number}: {END} without {BEGIN}")
            in_solution = False
        elif not in_solution:
            if hints:
                raise ExerciseSourceError(
                    f"{where}, line {number}: {HINT} must come right before {BEGIN}"
                )
            out.append(line)
    if in_solution:
        raise ExerciseSourceError(f"{where}: {BEGIN} without {END}")
    if hints:
        raise ExerciseSourceError(
            f"{where}: {HINT} at the end of the cell, with no {BEGIN} after it"
        )
    return "\n".join(out), regions


def exercise_text(solution_path):
    """The exercise notebook (jupytext Markdown text) generated from one solution notebook."""
    solution_path = Path(solution_path)
    notebook = jupytext.read(solution_path, fmt="md")
    cells, total = [], 0
    for index, cell in enumerate(notebook.cells):
        tags = cell.metadata.get("tags", [])
        if SOLUTION_ONLY_TAG in tags:
            continue
        if cell.cell_type == "code":
            cell.source, regions = strip_solutions(
                cell.source, f"{solution_path}, cell {index + 1}"
            )
            if regions and STUB_TAG not in tags:
                cell.metadata["tags"] = [*tags, STUB_TAG]
            total += regions
        cells.append(cell)
    if total == 0:
        raise ExerciseSourceError(
            f"{solution_path}: no {BEGIN} region, so there is nothing to exercise"
        )
    notebook.cells = cells
    return jupytext.writes(notebook, fmt="md")


def solution_files(solutions_dir):
    return sorted(Path(solutions_dir).glob("[0-9][0-9]_*.md"))


def write_exercises(solutions_dir="solutions", exercises_dir="exercises"):
    """Regenerate every exercise from its solution; return the paths written."""
    exercises_dir = Path(exercises_dir)
    exercises_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for solution in solution_files(solutions_dir):
        target = exercises_dir / solution.name
        target.write_text(exercise_text(solution), encoding="utf-8")
        written.append(target)
    return written


def check_exercises(solutions_dir="solutions", exercises_dir="exercises"):
    """Paths of exercises that are missing, stale or have no solution behind them (empty: in
    sync)."""
    exercises_dir = Path(exercises_dir)
    solutions = solution_files(solutions_dir)
    drifted = [
        exercises_dir / s.name
        for s in solutions
        if not (exercises_dir / s.name).exists()
        or (exercises_dir / s.name).read_text(encoding="utf-8") != exercise_text(s)
    ]
    expected = {s.name for s in solutions}
    orphans = [p for p in solution_files(exercises_dir) if p.name not in expected]
    return drifted + orphans
