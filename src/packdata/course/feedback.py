"""What the exercise checks say: one line starting with ✓ when the learner's answer is right,
and otherwise :class:`CheckFailed`, whose message names the mistake.

Each ``check_*`` of the ``*_checks`` modules runs the learner's work against a reference from
``packdata``; the helpers here put two numbers side by side with as many digits as it takes for
them to differ on screen.
"""

import math
import numbers


class CheckFailed(AssertionError):
    """The learner's answer is not right yet; the message says what to look at."""


def passed(message):
    print(f"✓ {message}")


# relative tolerance of the checks whose answer is a real number (float rounding, nothing more)
RELATIVE_TOLERANCE = 1e-6


def _significant(value, digits):
    """``value`` with ``digits`` significant digits, in plain notation where that stays short."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    if not -6 <= magnitude < 15:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{max(0, digits - 1 - magnitude)}f}"


def _percent(fraction):
    """A positive fraction as a percentage with two significant digits: 0.003 -> '0.3%'."""
    percent = abs(fraction) * 100
    if percent >= 10 or percent == 0:
        return f"{percent:.0f}%"
    decimals = max(0, 1 - math.floor(math.log10(percent)))
    return f"{percent:.{decimals}f}".rstrip("0").rstrip(".") + "%"


def is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def close_enough(got, expected, tolerance=RELATIVE_TOLERANCE):
    """Whether ``got`` is ``expected`` within a relative ``tolerance``."""
    return is_number(got) and abs(got - expected) <= tolerance * abs(expected)


def mismatch(got, expected, unit="", tolerance=0):
    """'returned 20.24 s, expected 20.19 s (0.3% off; the check allows 0.0001%)': both numbers with
    as many digits as it takes for them to differ on screen, and how far apart they are."""
    suffix = f" {unit}" if unit else ""
    if not is_number(got):
        return f"returned {got!r:.80}, expected {expected:g}{suffix}"
    if isinstance(got, numbers.Integral) and isinstance(expected, numbers.Integral):
        shown = str(got), str(expected)
    else:
        shown = next(
            (
                (_significant(got, digits), _significant(expected, digits))
                for digits in range(4, 18)
                if _significant(got, digits) != _significant(expected, digits)
            ),
            (repr(float(got)), repr(float(expected))),
        )
    allows = f"the check allows {_percent(tolerance)}" if tolerance else "the check wants it exact"
    off = f"{_percent((got - expected) / expected)} off" if expected else "expected zero"
    return f"returned {shown[0]}{suffix}, expected {shown[1]}{suffix} ({off}; {allows})"


def is_whole(value):
    """Whether ``value`` is a whole number: an int, or a NumPy integer (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def stop_workers(batches):
    """Stop the worker processes behind ``batches``, a ``DataLoader``'s iterator or a
    ``WebLoader``'s generator, even when it was not read to its end (``None``, or an iterator
    without workers, has none). A check calls it before it raises: the learner's error, kept with
    its traceback as a notebook keeps the last one, would otherwise keep the workers alive."""
    stop = getattr(batches, "close", None) or getattr(batches, "_shutdown_workers", None)
    if stop:
        stop()
