"""Estimate teaching and exercise minutes per lesson from what is on its slides and sheets.

    .venv/bin/python scripts/teaching_minutes.py                          # print the estimate
    .venv/bin/python scripts/teaching_minutes.py --write INSTRUCTORS.md   # rewrite it there

Nobody timed these by talking through the decks: they are counts turned into minutes by a stated
rule, a starting point to correct after one rehearsal. For every ``notebooks/NN_*.md`` it counts,
on the slides (cells that are not ``skip`` or ``notes``):

- slides: ``slide`` and ``subslide`` cells (plus the one nbconvert opens at the first visible
  cell when that cell starts none);
- words of Markdown, and words of speaker notes (``notes`` cells, said aloud);
- visible code cells and their lines.

and, in the worked sheet ``solutions/NN_*.md``, the exercises (code cells that call a
``check_…`` function of a checks module, ``folder_checks`` or ``resume_checks`` for instance) and
the lines of code of each (blank lines and comments left out).

The rule: words, on the slides and in the notes, at WORDS_PER_MINUTE (slower than reading aloud,
because slides are explained, not read), plus CODE_CELL_MINUTES for each visible code cell (say
what it will do, take the room's prediction, run it, read the output); the computation itself,
which ``make schedule`` measures, comes on top. An exercise takes EXERCISE_MINUTES to read and
check, plus MINUTES_PER_SOLUTION_LINE for each line of its worked solution.
"""

import argparse
import re
from datetime import date
from pathlib import Path

import jupytext

from packdata.course.slides import deck_slides, slide_type

WORDS_PER_MINUTE = 100
CODE_CELL_MINUTES = 1.5
EXERCISE_MINUTES = 4
MINUTES_PER_SOLUTION_LINE = 0.5
START = "<!-- teaching-minutes:start (scripts/teaching_minutes.py --write INSTRUCTORS.md) -->"
END = "<!-- teaching-minutes:end -->"
WORD = re.compile(r"[A-Za-z0-9][\w'’.-]*")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
CHECK_CALL = re.compile(r"^\w*checks\.check_\w+\(", re.MULTILINE)


def words(markdown):
    """Words a person reads in ``markdown``: HTML comments left out, code spans kept."""
    return len(WORD.findall(HTML_COMMENT.sub("", markdown)))


def lesson_counts(path):
    """Counts for the lesson at ``path``: slides, slide and note words, code cells and lines."""
    cells = jupytext.read(path).cells
    visible = [cell for cell in cells if slide_type(cell) not in ("skip", "notes")]
    code = [cell for cell in visible if cell.cell_type == "code"]
    return {
        "slides": deck_slides(cells),
        "slide words": sum(words(c.source) for c in visible if c.cell_type == "markdown"),
        "note words": sum(words(c.source) for c in cells if slide_type(c) == "notes"),
        "code cells": len(code),
        "code lines": sum(len(cell.source.splitlines()) for cell in code),
    }


def code_lines(source):
    """Lines of ``source`` that are neither blank nor comments."""
    return sum(
        bool(line.strip()) and not line.strip().startswith("#") for line in source.split("\n")
    )


def solution_lines(path):
    """Lines of code of each exercise in the worked sheet at ``path``; [] when there is none."""
    if not path.exists():
        return []
    cells = jupytext.read(path).cells
    return [
        code_lines(c.source) for c in cells if c.cell_type == "code" and CHECK_CALL.search(c.source)
    ]


def estimate(counts, exercises):
    """``(teaching minutes, exercise minutes)`` by the rule in the module's docstring;
    ``exercises`` holds the solution lines of each exercise."""
    talk = (counts["slide words"] + counts["note words"]) / WORDS_PER_MINUTE
    practise = sum(EXERCISE_MINUTES + lines * MINUTES_PER_SOLUTION_LINE for lines in exercises)
    return talk + counts["code cells"] * CODE_CELL_MINUTES, practise


def lesson_rows(root):
    """``(lesson path, counts, solution lines of each exercise, teaching minutes, exercise
    minutes)`` for every lesson under ``root``, in order; whole minutes, so that the sums of
    ``totals`` are the sums of the table's rows."""
    for lesson in sorted((root / "notebooks").glob("[0-9][0-9]_*.md")):
        counts = lesson_counts(lesson)
        exercises = solution_lines(root / "solutions" / lesson.name)
        minutes = (round(value) for value in estimate(counts, exercises))
        yield (lesson, counts, exercises, *minutes)


def markdown_table(rows):
    """``lesson_rows`` as a Markdown table."""
    lines = [
        "| lesson | slides | words on slides | words in notes | code cells (lines) "
        "| exercises (solution lines) | teaching min | exercise min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lesson, counts, exercises, teach, practise in rows:
        lines.append(
            f"| `{lesson.stem}` | {counts['slides']} | {counts['slide words']} | "
            f"{counts['note words']} | {counts['code cells']} ({counts['code lines']}) | "
            f"{len(exercises)} ({sum(exercises)}) | {teach:.0f} | {practise:.0f} |"
        )
    return "\n".join(lines)


def totals(rows):
    """``{(first, last): (teaching minutes, exercise minutes)}`` of ``lesson_rows`` for the day's
    lessons (0 to 6) and the second morning's (7 and 8)."""
    found = {}
    for lesson, _, _, teach, practise in rows:
        part = (0, 6) if int(lesson.name[:2]) <= 6 else (7, 8)
        before = found.get(part, (0, 0))
        found[part] = (before[0] + teach, before[1] + practise)
    return found


def generated_block(root):
    """The guide's generated part: the date, the table and the sums for each part of the day."""
    rows = list(lesson_rows(root))
    sums = "; ".join(
        f"lessons {first} {'and' if last == first + 1 else 'to'} {last}: {teach:.0f} minutes of "
        f"teaching and {practise:.0f} of exercises"
        for (first, last), (teach, practise) in totals(rows).items()
    )
    return f"Estimated on {date.today().isoformat()}:\n\n{markdown_table(rows)}\n\nIn all, {sums}."


def write_into(guide, root):
    """Replace the part of ``guide`` between ``START`` and ``END`` with ``generated_block``."""
    text = guide.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{guide} has no {START} ... {END} block to write into")
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    guide.write_text(f"{before}{START}\n{generated_block(root)}\n{END}{after}", encoding="utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="the course's folder")
    parser.add_argument(
        "--write", type=Path, metavar="GUIDE", help="rewrite the estimate in GUIDE (INSTRUCTORS.md)"
    )
    args = parser.parse_args(argv)
    if args.write:
        write_into(args.write, args.root)
    else:
        print(generated_block(args.root))


if __name__ == "__main__":
    main()
