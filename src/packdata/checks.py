"""Auto-checks that exercise notebooks call right after the learner's code.

Each ``check_*`` runs the learner's work against a reference from ``packdata``, prints one line
starting with ✓ when it is right, and raises :class:`CheckFailed` with a specific, friendly message
when it is not.
"""

from collections import Counter
from collections.abc import Mapping

from . import data


class CheckFailed(AssertionError):
    """The learner's answer is not right yet; the message says what to look at."""


def passed(message):
    print(f"✓ {message}")


def check_count_per_class(count_per_class, root):
    """Lesson 0: counting images per class by walking the folders must agree with the manifest."""
    manifest = data.load_manifest(root)
    expected = Counter(manifest["classes"][s["label"]] for s in manifest["samples"])
    got = count_per_class(root)
    if not isinstance(got, Mapping):
        raise CheckFailed(f"count_per_class should return a dict {{class name: count}}, not a {type(got).__name__}.")
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise CheckFailed(
            f"The class names differ from the folder names: missing {missing}, unexpected {extra}. "
            "Use each sub-folder's name as the class name and skip plain files such as manifest.json."
        )
    wrong = {name: (got[name], n) for name, n in expected.items() if got[name] != n}
    if wrong:
        name, (g, n) = next(iter(wrong.items()))
        raise CheckFailed(
            f"{len(wrong)} class(es) have the wrong count, e.g. '{name}': you counted {g}, the folder holds {n}. "
            "Count only the .jpg files inside each class folder."
        )
    passed(f"{len(expected)} classes, {sum(expected.values())} images: your counts match the manifest.")
