"""Run a learner's function in a fresh Python process, from its source, as a task on another
machine would: with a hash seed of its own, and nothing of the notebook but what it imports.

    fresh.run(bucket_for, keys, "[int({name}(key, 0, 8)) for key in args]", hash_seed=1)

The checks use it where an answer must come out the same in every process (str's ``hash()``
changes with each interpreter).
"""

import functools
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types


class Unreadable(Exception):
    """The function's source cannot be read (a lambda, a function made at run time)."""


class Failed(Exception):
    """The fresh process failed; the message is the last line of its error output."""


def _global_names(code):
    """The global names ``code`` reads, its comprehensions' and inner functions' included."""
    inner = [_global_names(const) for const in code.co_consts if isinstance(const, types.CodeType)]
    return set(code.co_names).union(*inner)


def _imported_as(value):
    """``[module, [attribute, ...]]`` by which another process imports ``value`` (a module, or a
    function or class a module defines, such as hashlib.blake2b), or None."""
    if isinstance(value, types.ModuleType):
        return [value.__name__, []]
    module, path = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(path, str) or module == "__main__":
        return None
    try:
        found = functools.reduce(getattr, path.split("."), importlib.import_module(module))
    except (ImportError, AttributeError):
        return None
    return [module, path.split(".")] if found is value else None


def program(function, result):
    """``(program, imports)``: Python that defines ``function`` from its source, imports the
    modules and functions it uses, and prints ``result`` as JSON: an expression in which
    ``{name}`` is the function's name and ``args`` the JSON given to ``run``. ``imports`` (JSON)
    is the program's first argument."""
    function = inspect.unwrap(function)  # a decorated one, e.g. by functools.lru_cache
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        source = ""
    if not source or not function.__name__.isidentifier():
        raise Unreadable(f"the source of {function!r} cannot be read")
    imports = {
        name: found
        for name in _global_names(function.__code__) & function.__globals__.keys()
        if (found := _imported_as(function.__globals__[name]))
    }
    text = (
        "import functools, importlib, json, sys\n"
        "for name, (module, path) in json.loads(sys.argv[1]).items():\n"
        "    globals()[name] = functools.reduce(getattr, path, importlib.import_module(module))\n"
        f"{source}\n"
        "args, results = json.loads(sys.argv[2]), sys.stdout\n"
        "sys.stdout = sys.stderr  # what the function prints goes aside\n"
        f"results.write(json.dumps({result.format(name=function.__name__)}))"
    )
    return text, json.dumps(imports)


def run(function, args, result, hash_seed, timeout=60):
    """What ``result`` (see ``program``) comes to in a fresh Python process with
    ``PYTHONHASHSEED=hash_seed``, ``args`` given as JSON. Raises ``Unreadable``, ``Failed``, or
    ``subprocess.TimeoutExpired``."""
    text, imports = program(function, result)
    done = subprocess.run(
        [sys.executable, "-c", text, imports, json.dumps(args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
        timeout=timeout,
    )
    if done.returncode != 0:
        raise Failed((done.stderr.strip().splitlines() or ["(no error output)"])[-1])
    return json.loads(done.stdout)
