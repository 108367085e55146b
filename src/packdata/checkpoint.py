"""What a job's checkpoint keeps of its loaders, and how a restart resumes from it, with as many
ranks and workers as before or not.

    saved = every_rank(loader)                 # on every rank: each rank's loader state
    if rank == 0:
        with written_atomically(path) as file:
            torch.save({"epoch": epoch, "step": step, "loaders": saved, ...}, file)
    ...                                        # restarted, perhaps with other ranks or workers
    resume_loader(torch.load(path, weights_only=False)["loaders"], dataset, loader)

One rank's loader state cannot say what the other ranks delivered, so every rank's goes into the
checkpoint: a restart with the same layout loads its own rank's state into the loader (the same
order, continued); one with another number of ranks or workers loads the rest of the epoch, merged
from all of them (``resume.rest_of_epoch``), into the dataset.
"""

import torch

from .resume import loader_states, rest_of_epoch


def every_rank(loader):
    """Every rank's ``loader.state_dict()`` in rank order, on every rank (``all_gather_object``, a
    collective: call it on every rank at the same step); this process's alone outside a
    distributed job."""
    state = loader.state_dict()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [state]
    states = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states


def resume_loader(saved, dataset, loader):
    """Resume ``loader`` over ``dataset`` (a ``ShardDataset``) from ``saved``, every rank's loader
    state (``every_rank``): this rank's state into the loader when the ranks and workers are those
    that saved it, else the rest of the epoch into the dataset. Returns which it did: "same
    layout" or "rest of the epoch"."""
    workers = [len(loader_states(state)) for state in saved]
    # a loader without workers saves another kind of state than one with a single worker
    kinds = {"_snapshot" in state for state in saved}
    same = set(workers) == {max(loader.num_workers, 1)} and kinds == {loader.num_workers > 0}
    if len(saved) == dataset.world_size and same:
        loader.load_state_dict(saved[dataset.rank])
        return "same layout"
    every_worker = [state for rank in saved for state in loader_states(rank)]
    dataset.load_state_dict(rest_of_epoch(dataset, every_worker))
    return "rest of the epoch"
