"""DDP communication hooks on gradwire (`DistributedDataParallel.register_comm_hook`).

`allreduce_hook` averages each gradient bucket across ranks, as DDP does by
default. `weighted_allreduce_hook` weights each rank's bucket by its share
of the global batch, b_i / sum(b), so that ranks with uneven local batches
(the job server's OptPerf plan, Cannikin) still give the gradient of the
whole global batch: sum_i (b_i / B) g_i, where g_i is rank i's mean
gradient over its b_i samples.

    from gradwire.torch import hooks
    state = hooks.BatchShare(local_batch=b_i)     # or from the step plan
    ddp.register_comm_hook(state, hooks.weighted_allreduce_hook)
    ...
    state.local_batch = next_b_i                  # when the plan changes

Both run on the bucket's own memory (no copy) through the process group's
gradwire backend, or any backend of the group (then with torch's own calls).
"""

import torch
import torch.distributed as dist

__all__ = ["allreduce_hook", "weighted_allreduce_hook", "BatchShare"]


class BatchShare:
    """The hook's state: this rank's local batch; the global batch is summed
    across the group at each step, so ranks need not agree beforehand.
    `process_group=None` means the default group."""

    def __init__(self, local_batch, process_group=None):
        if int(local_batch) < 0:
            raise ValueError(f"local_batch must be >= 0, got {local_batch}")
        self.local_batch = int(local_batch)
        self.process_group = process_group

    def share(self):
        """b_i / sum(b) for this step (one small all-reduce)."""
        total = torch.tensor([self.local_batch], dtype=torch.int64)
        dist.all_reduce(total, group=self.process_group)
        if int(total.item()) == 0:
            raise ValueError("every rank's local batch is 0: nothing to weight by")
        return self.local_batch / int(total.item())


def _done(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def allreduce_hook(process_group, bucket):
    """The bucket averaged over the group's ranks."""
    group = process_group if process_group is not None else dist.group.WORLD
    buf = bucket.buffer()
    dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=group)
    return _done(buf)


def weighted_allreduce_hook(state, bucket):
    """The bucket as sum_i (b_i / B) g_i over the ranks (see the module comment)."""
    if not isinstance(state, BatchShare):
        raise TypeError("weighted_allreduce_hook needs a gradwire.torch.hooks.BatchShare state")
    buf = bucket.buffer()
    w = state.share()
    dist.all_reduce(buf, op=dist._make_nccl_premul_sum(w), group=state.process_group)
    return _done(buf)
