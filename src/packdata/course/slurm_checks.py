"""Checks for lesson 8's Slurm exercise: from the variables Slurm gives each task that ``srun``
starts, the ones ``torch.distributed`` reads (what torchrun would have set).

The check plays every task of two jobs on two nodes: ``--ntasks-per-node=3`` (three tasks each),
then ``--ntasks=5`` (three tasks, then two; Slurm sets no ``SLURM_NTASKS_PER_NODE`` there). When an
answer is wrong, it names the Slurm variable the learner's values follow instead of the right one.
The values are strings, as the script puts them in ``os.environ`` before ``init_process_group``.
"""

from collections.abc import Mapping

from .feedback import CheckFailed, passed

NODES, TASKS_PER_NODE = 2, 3
UNEVEN = (3, 2)  # srun --nodes=2 --ntasks=5: Slurm fills the first node first

# what torch reads: the Slurm variable that holds it (None: computed from two of them)
SOURCES = {
    "RANK": "SLURM_PROCID",
    "WORLD_SIZE": "SLURM_NTASKS",
    "LOCAL_RANK": "SLURM_LOCALID",
    "LOCAL_WORLD_SIZE": None,  # this node's entry of SLURM_TASKS_PER_NODE
    "GROUP_RANK": "SLURM_NODEID",
}

# Slurm variables that are no plain number: what each holds ({!r}: its value), what to read instead
NOT_NUMBERS = {
    "SLURMD_NODENAME": "the node's host name ({!r}), not its number; the node's number in the job "
    "is SLURM_NODEID",
    "SLURM_TASKS_PER_NODE": "{!r}, one count per node ('3(x2)': 3 on each of 2 nodes; '3,2': "
    "3, then 2), not a plain number: take this node's entry (SLURM_NODEID), or "
    "SLURM_NTASKS_PER_NODE, the plain count, in a job that gives --ntasks-per-node",
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
    "is those of this node: its entry of SLURM_TASKS_PER_NODE",
    ("LOCAL_WORLD_SIZE", "SLURM_NNODES"): "that counts nodes; LOCAL_WORLD_SIZE counts this node's "
    "ranks: its entry of SLURM_TASKS_PER_NODE",
    ("LOCAL_WORLD_SIZE", "SLURM_GPUS_ON_NODE"): "that counts the node's GPUs, and srun --ntasks=5 "
    "starts 2 tasks on node 1's 3 GPUs; LOCAL_WORLD_SIZE counts this node's ranks: its entry of "
    "SLURM_TASKS_PER_NODE",
    ("GROUP_RANK", "SLURM_PROCID"): "GROUP_RANK is the node's number (SLURM_NODEID), the same for "
    "all the ranks of a node",
    ("GROUP_RANK", "SLURM_LOCALID"): "GROUP_RANK is the node's number (SLURM_NODEID), not the "
    "task's on its node",
}


def slurm_tasks(per_node=(TASKS_PER_NODE,) * NODES):
    """The environment of every task of ``srun --nodes=2 --gpus-per-node=3`` with ``per_node``
    tasks on each node (job 4242, on nodes gpu07 and gpu08), as Slurm sets it: strings, node by
    node. Equal counts come from ``--ntasks-per-node=3`` (a task per GPU), which sets
    ``SLURM_NTASKS_PER_NODE``; others from ``--ntasks``, which does not."""
    even = len(set(per_node)) == 1
    counts = f"{per_node[0]}(x{len(per_node)})" if even else ",".join(map(str, per_node))
    return [
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_NNODES": str(len(per_node)),
            "SLURM_NTASKS": str(sum(per_node)),
            **({"SLURM_NTASKS_PER_NODE": str(per_node[0])} if even else {}),
            "SLURM_TASKS_PER_NODE": counts,
            # srun's own: the step's counts, here the job's
            "SLURM_STEP_NUM_NODES": str(len(per_node)),
            "SLURM_STEP_NUM_TASKS": str(sum(per_node)),
            "SLURM_STEP_TASKS_PER_NODE": counts,
            "SLURM_CPUS_PER_TASK": "4",
            "SLURM_GPUS_ON_NODE": str(TASKS_PER_NODE),
            "SLURMD_NODENAME": f"gpu0{7 + node}",
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(local),
            "SLURM_PROCID": str(sum(per_node[:node]) + local),
        }
        for node, tasks in enumerate(per_node)
        for local in range(tasks)
    ]


def tasks_on_node(task):
    """This task's node's count of tasks, from ``SLURM_TASKS_PER_NODE`` (``'3(x2),2'``: 3, 3,
    then 2) and ``SLURM_NODEID``."""
    counts = []
    for part in task["SLURM_TASKS_PER_NODE"].split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    return counts[int(task["SLURM_NODEID"])]


def _wanted(name, task):
    source = SOURCES[name]
    return tasks_on_node(task) if source is None else int(task[source])


def _answers(torch_env, tasks, job):
    """``torch_env`` of every task of ``srun {job}``; a variable it cannot read or a value it
    cannot convert is named."""
    try:
        answers = [torch_env(dict(task)) for task in tasks]
    except KeyError as error:
        if error.args == ("SLURM_NTASKS_PER_NODE",):
            raise CheckFailed(
                f"torch_env read 'SLURM_NTASKS_PER_NODE', which Slurm sets only with "
                f"--ntasks-per-node; after srun --nodes=2 {job} it is not there. This "
                f"node's count is its entry of SLURM_TASKS_PER_NODE "
                f"({tasks[0]['SLURM_TASKS_PER_NODE']!r}: one count per node, in node order; "
                "'3(x2)' would be 3 on each of 2 nodes)."
            ) from None
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
    except IndexError as error:
        counts = tasks[0]["SLURM_TASKS_PER_NODE"]
        raise CheckFailed(
            f"torch_env raised IndexError ({error}) after srun --nodes=2 {job}, where "
            f"SLURM_TASKS_PER_NODE is {counts!r}"
            + (
                ": one entry stands for several nodes ('3(x2)' is 3 on each of 2 nodes). Expand "
                "it ('3(x2)' to 3, 3) before you take this node's entry (SLURM_NODEID)."
                if "(x" in counts
                else "."
            )
        ) from None
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
    GROUP_RANK, for every task of two jobs on two nodes: three tasks on each, then three and
    two."""
    jobs = {"--ntasks-per-node=3": slurm_tasks(), "--ntasks=5": slurm_tasks(UNEVEN)}
    for job, tasks in jobs.items():
        answers = _answers(torch_env, tasks, job)
        for name in SOURCES:
            _check_values(torch_env, name, _values(answers, name, tasks), tasks, job)
        _check_strings(answers)
    passed(
        f"every task of both jobs gets its torch variables; with --ntasks=5, ranks "
        f"{_values(answers, 'RANK', tasks)}, local ranks {_values(answers, 'LOCAL_RANK', tasks)}, "
        f"local world sizes {_values(answers, 'LOCAL_WORLD_SIZE', tasks)}."
    )


def _check_values(torch_env, name, got, tasks, job):
    """``CheckFailed`` unless ``got`` is every task's ``name``: the Slurm variable it follows
    instead named, when it is a usual confusion and ``torch_env`` takes the value from it, else
    the first task where it is wrong."""
    want = [_wanted(name, task) for task in tasks]
    if got == want:
        return
    for variable in _followed(got, tasks):
        if (name, variable) in CONFUSIONS and _taken_from(torch_env, name, variable, tasks[0]):
            raise CheckFailed(f"{name}: {CONFUSIONS[name, variable]}.")
    task = next(n for n, (a, b) in enumerate(zip(got, want)) if a != b)
    place = f"node {tasks[task]['SLURM_NODEID']}, task {tasks[task]['SLURM_LOCALID']} there"
    uneven = ""
    if name == "LOCAL_WORLD_SIZE" and "(x" not in tasks[0]["SLURM_TASKS_PER_NODE"]:
        uneven = (
            " Slurm put the tasks on the nodes unevenly here, so no count for every node (such "
            "as SLURM_NTASKS // SLURM_NNODES) holds: take this node's entry of "
            f"SLURM_TASKS_PER_NODE ({tasks[0]['SLURM_TASKS_PER_NODE']!r})."
        )
    raise CheckFailed(
        f"srun {job}: {name} of the task on {place} should be {want[task]}, got "
        f"{got[task]}.{uneven}"
    )


def _taken_from(torch_env, name, variable, task):
    """Whether ``torch_env`` gives ``name`` the value of ``variable`` itself: changed in ``task``
    to a number no other variable holds, it comes back as ``name``; when that change makes the
    learner's code fail, whether it read ``variable`` at all."""
    marked = _Reads({**task, variable: "97"})
    try:
        return str(torch_env(marked)[name]) == "97"
    except Exception:  # noqa: BLE001  the learner's code, failing on a value no job would have
        return variable in marked.read


class _Reads(dict):
    """A task's variables that note which of them were read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)
