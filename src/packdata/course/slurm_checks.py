"""Checks for lesson 8's Slurm exercise: from the variables Slurm gives each task that ``srun``
starts, the ones ``torch.distributed`` reads (what torchrun would have set).

The check plays every task of a job of two nodes with three tasks each, and when an answer is
wrong, names the Slurm variable the learner's values follow instead of the right one. The values
are strings, as the script puts them in ``os.environ`` before ``init_process_group``.
"""

from collections.abc import Mapping

from .feedback import CheckFailed, passed

NODES, TASKS_PER_NODE = 2, 3

# what torch reads: the Slurm variable that holds it (None: computed from two of them)
SOURCES = {
    "RANK": "SLURM_PROCID",
    "WORLD_SIZE": "SLURM_NTASKS",
    "LOCAL_RANK": "SLURM_LOCALID",
    "LOCAL_WORLD_SIZE": "SLURM_NTASKS_PER_NODE",
    "GROUP_RANK": "SLURM_NODEID",
}

# Slurm variables that are no plain number: what each holds ({!r}: its value), what to read instead
NOT_NUMBERS = {
    "SLURMD_NODENAME": "the node's host name ({!r}), not its number; the node's number in the job "
    "is SLURM_NODEID",
    "SLURM_TASKS_PER_NODE": f"{{!r}} ({TASKS_PER_NODE} tasks on each of {NODES} nodes), not a "
    "plain number; SLURM_NTASKS_PER_NODE is the plain count (set only with --ntasks-per-node, "
    "as in this job)",
}

# the usual confusions: (torch's variable, the Slurm variable used) -> why that is wrong
CONFUSIONS = {
    ("RANK", "SLURM_NODEID"): "SLURM_NODEID numbers the nodes; a rank numbers the tasks of the "
    "whole job (SLURM_PROCID): the tasks of one node would all get the same rank",
    ("RANK", "SLURM_LOCALID"): "SLURM_LOCALID restarts at 0 on every node: two nodes would both "
    "have a rank 0. The rank across the job is SLURM_PROCID",
    ("WORLD_SIZE", "SLURM_NNODES"): "WORLD_SIZE counts ranks, not nodes: SLURM_NTASKS",
    ("WORLD_SIZE", "SLURM_NTASKS_PER_NODE"): "that is the ranks of one node; WORLD_SIZE counts "
    "those of every node: SLURM_NTASKS",
    ("LOCAL_RANK", "SLURM_PROCID"): "LOCAL_RANK picks this rank's GPU on its own node, so it "
    "restarts at 0 on every node: SLURM_LOCALID (the job-wide number would ask node 1 for GPU 3)",
    ("LOCAL_RANK", "SLURM_NODEID"): "that is the node's number; LOCAL_RANK is the task's number "
    "on its node: SLURM_LOCALID",
    ("LOCAL_WORLD_SIZE", "SLURM_NTASKS"): "that counts the ranks of every node; LOCAL_WORLD_SIZE "
    "is those of this node: SLURM_NTASKS_PER_NODE",
    ("LOCAL_WORLD_SIZE", "SLURM_NNODES"): "that counts nodes; LOCAL_WORLD_SIZE counts this node's "
    "ranks: SLURM_NTASKS_PER_NODE",
    ("GROUP_RANK", "SLURM_PROCID"): "GROUP_RANK is the node's number (SLURM_NODEID), the same for "
    "all the ranks of a node",
    ("GROUP_RANK", "SLURM_LOCALID"): "GROUP_RANK is the node's number (SLURM_NODEID), not the "
    "task's on its node",
}


def slurm_tasks():
    """The environment of every task of ``srun --nodes=2 --ntasks-per-node=3 --gpus-per-node=3``
    (job 4242, on nodes gpu07 and gpu08: a task per GPU), as Slurm sets it: strings, node by
    node."""
    return [
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_NNODES": str(NODES),
            "SLURM_NTASKS": str(NODES * TASKS_PER_NODE),
            "SLURM_NTASKS_PER_NODE": str(TASKS_PER_NODE),
            "SLURM_TASKS_PER_NODE": f"{TASKS_PER_NODE}(x{NODES})",
            "SLURM_CPUS_PER_TASK": "4",
            "SLURM_GPUS_ON_NODE": str(TASKS_PER_NODE),
            "SLURMD_NODENAME": f"gpu0{7 + node}",
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(local),
            "SLURM_PROCID": str(node * TASKS_PER_NODE + local),
        }
        for node in range(NODES)
        for local in range(TASKS_PER_NODE)
    ]


def _answers(torch_env, tasks):
    """``torch_env`` of every task; a variable it cannot read or a value it cannot convert is
    named."""
    try:
        answers = [torch_env(dict(task)) for task in tasks]
    except KeyError as error:
        if error.args and error.args[0] in tasks[0]:
            raise CheckFailed(
                f"torch_env read {error} from somewhere other than its slurm argument "
                "(os.environ? this notebook runs in no Slurm task): read slurm[...], which holds "
                "the task's variables."
            ) from None
        raise CheckFailed(
            f"torch_env read {error}, which Slurm does not set for these tasks; it sets "
            f"{', '.join(tasks[0])}."
        ) from None
    except ValueError as error:
        said = f"torch_env raised ValueError ({error}): not every Slurm variable is a number"
        raise _not_a_number(said, error, tasks) from None
    if not all(isinstance(answer, Mapping) for answer in answers):
        raise CheckFailed(
            f"torch_env returned {answers[0]!r:.60}: return a dict with {', '.join(SOURCES)}."
        )
    return answers


def _values(answers, name, tasks):
    """The learner's ``name`` for every task, as integers."""
    try:
        return [int(answer[name]) for answer in answers]
    except KeyError:
        message = f"the answer has no {name!r}: return a dict with {', '.join(SOURCES)}"
        raise CheckFailed(message) from None
    except (TypeError, ValueError) as error:
        said = f"{name} must be a whole number, in digits: {error}"
        raise _not_a_number(said, error, tasks) from None


def _not_a_number(said, error, tasks):
    """CheckFailed that starts with ``said``; when ``error`` quotes a Slurm variable that is no
    number, it says what that variable holds and which one to read instead."""
    for task in tasks:
        for variable, holds in NOT_NUMBERS.items():
            if repr(task[variable]) in str(error):
                return CheckFailed(f"{said}. {variable} is {holds.format(task[variable])}.")
    return CheckFailed(f"{said}.")


def _check_strings(answers):
    """Every value is a string, which is all that ``os.environ`` takes."""
    wrong = [(name, a[name]) for a in answers for name in SOURCES if not isinstance(a[name], str)]
    if wrong:
        name, value = wrong[0]
        raise CheckFailed(
            f"{name} is {value!r}, not a string: the script puts these values in os.environ, "
            "which takes strings only (os.environ.update(torch_env(os.environ)) "
            f"raises TypeError: str expected, not {type(value).__name__}). Return Slurm's "
            "strings as they are, or str() of what you compute."
        )


def _followed(values, tasks):
    """The Slurm variables whose values, task by task, are ``values``."""
    return [
        variable
        for variable in tasks[0]
        if all(str(value) == task[variable] for value, task in zip(values, tasks))
    ]


def check_torch_env(torch_env):
    """``torch_env(slurm)`` maps one task's Slurm variables (a dict of strings) to a dict of
    strings, ready for ``os.environ``, with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
    GROUP_RANK, for every task of a job of two nodes with three tasks each."""
    tasks = slurm_tasks()
    answers = _answers(torch_env, tasks)
    for name, source in SOURCES.items():
        got = _values(answers, name, tasks)
        want = [int(task[source]) for task in tasks]
        if got == want:
            continue
        for variable in _followed(got, tasks):
            if (name, variable) in CONFUSIONS:
                raise CheckFailed(f"{name}: {CONFUSIONS[name, variable]}.")
        task = next(n for n, (a, b) in enumerate(zip(got, want)) if a != b)
        place = f"node {tasks[task]['SLURM_NODEID']}, task {tasks[task]['SLURM_LOCALID']} there"
        raise CheckFailed(f"{name} of the task on {place} should be {want[task]}, got {got[task]}.")
    _check_strings(answers)
    ranks = _values(answers, "RANK", tasks)
    passed(
        f"all {len(tasks)} tasks of {NODES} nodes get their torch variables: ranks {ranks}, "
        f"local ranks {_values(answers, 'LOCAL_RANK', tasks)}."
    )
