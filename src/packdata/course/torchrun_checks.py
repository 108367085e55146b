"""Checks of lesson 6: rank, world size and local rank read from the environment torchrun sets,
tried on made-up environments and then under a real ``torchrun``.
"""

from .feedback import (
    CheckFailed,
    is_whole,
    passed,
)

# some of what torchrun sets in each process: five processes of four jobs, on 1, 2 (two of its
# processes), 2 and 3 machines
_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


_TORCHRUN_PROCESSES = [
    (1, 2, 1, 2, 0),
    (1, 4, 1, 2, 0),
    (3, 4, 1, 2, 1),
    (6, 8, 2, 4, 1),
    (2, 3, 0, 1, 2),
]


# the first: a plain `python train.py`, or a notebook (no torchrun, none of them set)
_TORCHRUN_CASES = [{}] + [
    dict(zip(_TORCHRUN_VARIABLES, map(str, values), strict=True)) for values in _TORCHRUN_PROCESSES
]


def _where(environ):
    """The reference: ``(rank, world_size, local_rank)``; rank 0 of 1 outside torchrun."""
    return tuple(
        int(environ.get(name, default))
        for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0))
    )


def _where_mistakes():
    """``(what a learner whose answers follow this rule in every case got wrong, the rule)``."""
    import os

    return [
        (
            "you read os.environ, not the environ given (the check passes each process's "
            "variables as environ), or names torchrun does not set: read environ['RANK'], "
            "environ['WORLD_SIZE'] and environ['LOCAL_RANK'], upper case.",
            lambda env: _where(os.environ),
        ),
        (
            "LOCAL_RANK numbers the processes of one machine, from 0 on every machine; RANK "
            "numbers them across the whole job. With LOCAL_RANK as the rank, the first process "
            "of every machine would read the same shards.",
            lambda env: _where({**env, "RANK": env.get("LOCAL_RANK", 0)}),
        ),
        (
            "GROUP_RANK is the machine's number, not the process's: RANK is.",
            lambda env: _where({**env, "RANK": env.get("GROUP_RANK", 0)}),
        ),
        (
            "outside torchrun a process is alone: a world of 1, not 0 (shards[rank::0] fails).",
            lambda env: _where({"WORLD_SIZE": 0, **env}),
        ),
        (
            "LOCAL_WORLD_SIZE counts the processes of one machine; WORLD_SIZE counts all the "
            "job's processes, on every machine.",
            lambda env: _where({**env, "WORLD_SIZE": env.get("LOCAL_WORLD_SIZE", 1)}),
        ),
        (
            "the local rank is LOCAL_RANK: it picks this process's GPU (cuda:LOCAL_RANK), and "
            "every machine numbers its GPUs from 0, so rank 3 on a machine of 2 GPUs has no "
            "cuda:3.",
            lambda env: _where({**env, "LOCAL_RANK": env.get("RANK", 0)}),
        ),
    ]


def _before_torchruns_traceback(stderr):
    """What the processes torchrun started printed: ``stderr`` up to torchrun's own traceback,
    which comes last and only says that a process failed (all of it when there is nothing else)."""
    own = stderr.rfind("Traceback (most recent call last)")
    return stderr[:own] if own > 0 else stderr


def _run_under_torchrun(where_am_i):
    """Write ``where_am_i`` into a script, run it with ``torchrun --standalone
    --nproc_per_node=2``, and return each process's ``{"got", "rank", "world_size"}``, the last two
    from ``torch.distributed`` after ``init_process_group``."""
    import inspect
    import json
    import subprocess
    import sys
    import tempfile
    import textwrap
    from pathlib import Path

    from .. import multinode

    try:
        source = textwrap.dedent(inspect.getsource(where_am_i))
    except (OSError, TypeError) as error:
        raise CheckFailed(
            f"could not read the source of where_am_i ({error}): define it with def in a cell."
        ) from None
    script = "\n".join(
        [
            "import json, os, sys",
            "import torch.distributed as dist",
            source,
            f"where_am_i = {where_am_i.__name__}",
            'dist.init_process_group("gloo")',
            "try:",
            "    got = [int(value) for value in where_am_i(os.environ)]  # numpy's too, for JSON",
            "except Exception as error:",
            '    got = f"{type(error).__name__}: {error}"',
            "answer = dict(got=got, rank=dist.get_rank(), world_size=dist.get_world_size())",
            "with open(os.path.join(sys.argv[1], f'{dist.get_rank()}.json'), 'w') as file:",
            "    json.dump(answer, file)",
            "dist.destroy_process_group()",
        ]
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "where_am_i.py"
        path.write_text(script)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        with subprocess.Popen(
            [*command, "--nproc_per_node=2", str(path), folder],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as run:
            _, printed, _ = multinode.finish(run, timeout=300)
        if run.returncode != 0:
            raise CheckFailed(
                f"under torchrun --standalone --nproc_per_node=2 your function failed (exit "
                f"status {run.returncode}); the end of what the processes printed:\n"
                f"{_before_torchruns_traceback(printed)[-1500:]}"
            )
        return [json.loads(answer.read_text()) for answer in sorted(Path(folder).glob("*.json"))]


def _follows(where_am_i, rule):
    """Whether ``where_am_i`` answers as ``rule`` does for every process of ``_TORCHRUN_CASES``."""
    try:
        return all(where_am_i(dict(env)) == rule(env) for env in _TORCHRUN_CASES)
    except Exception:  # a rule it does not follow, whatever it raised
        return False


def check_where_am_i(where_am_i):
    """Lesson 6: ``where_am_i(environ)`` reads ``(rank, world_size, local_rank)`` from the variables
    torchrun sets, as ints, and ``(0, 1, 0)`` outside torchrun; then it runs for real under
    ``torchrun --standalone --nproc_per_node=2`` and must agree with ``torch.distributed``."""
    for environ in _TORCHRUN_CASES:
        shown = ", ".join(f"{name}={value}" for name, value in environ.items()) or "nothing"
        call = f"where_am_i({{{shown}}})" if environ else "where_am_i({}) (no torchrun)"
        expected = _where(environ)
        try:
            got = where_am_i(dict(environ))
        except KeyError as error:
            raise CheckFailed(
                f"{call} raised KeyError: {error}. Outside torchrun (python train.py, a "
                "notebook) none of its variables is set: a single process is rank 0 of a world "
                "of 1, local rank 0."
            ) from None
        except TypeError as error:
            if "NoneType" not in str(error):
                raise
            raise CheckFailed(
                f"{call} raised TypeError: {error}. environ.get(name) is None where torchrun set "
                'nothing: give each a default, environ.get("RANK", 0), so that a process alone is '
                "rank 0 of a world of 1, local rank 0."
            ) from None
        except (ValueError, RuntimeError) as error:
            if "process group" not in str(error).lower():
                raise
            raise CheckFailed(
                f"{call} asked torch.distributed ({error}): it knows the rank only after "
                "init_process_group, which itself reads these variables. Read the environment."
            ) from None
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{call} returned {got!r}: return (rank, world_size, local_rank).")
        if any(isinstance(value, str) for value in got):
            raise CheckFailed(
                f"{call} returned {got!r}: the environment holds strings; convert each with "
                "int(), or shards[rank::world_size] fails."
            )
        if not all(map(is_whole, got)):
            raise CheckFailed(
                f"{call} returned {tuple(got)!r}: ranks and sizes are whole numbers, and "
                "shards[rank::world_size] takes only ints: convert each with int()."
            )
        got = tuple(got)
        if got == expected:
            continue
        follows = [hint for hint, rule in _where_mistakes() if _follows(where_am_i, rule)]
        hint = (follows or ["read RANK, WORLD_SIZE and LOCAL_RANK, each as an int."])[0]
        raise CheckFailed(f"{call} returned {got}, expected {expected}: {hint}")
    answers = _run_under_torchrun(where_am_i)
    if len(answers) != 2:
        raise CheckFailed(f"under torchrun, {len(answers)} processes answered instead of 2.")
    for answer in sorted(answers, key=lambda a: a["rank"]):
        if isinstance(answer["got"], str):
            raise CheckFailed(
                f"under torchrun, where_am_i raised {answer['got']}. The script holds your "
                "function alone, after `import json, os, sys`: import anything else it needs "
                "inside it."
            )
        truth = [answer["rank"], answer["world_size"], answer["rank"]]  # one machine
        if answer["got"] != truth:
            raise CheckFailed(
                f"under torchrun, the process that torch.distributed calls rank {answer['rank']} "
                f"of {answer['world_size']} got {tuple(answer['got'])} from where_am_i, expected "
                f"{tuple(truth)}."
            )
    passed(
        "rank, world size and local rank read as ints from the environment on 1 to 3 machines, "
        "rank 0 of 1 alone; under torchrun both processes agree with torch.distributed."
    )
