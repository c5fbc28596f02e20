"""DDP communication hooks on gradwire (`DistributedDataParallel.register_comm_hook`).

`allreduce_hook` averages each gradient bucket across ranks, as DDP does by
default. `weighted_allreduce_hook` weights each rank's bucket by its share
of the global batch, b_i / sum(b), so that ranks with uneven local batches
(the job server's OptPerf plan, Cannikin) still give the gradient of the
whole global batch: sum_i (b_i / B) g_i, where g_i is rank i's mean
gradient over its b_i samples.

    from gradwire.torch import hooks
    state = hooks.BatchShare(local_batch=b_i)
    ddp.register_comm_hook(state, hooks.weighted_allreduce_hook)
    ...
    state.local_batch = next_b_i                  # when your split changes

Under a gwjob agent the job server chooses the split (OptPerf) and the
weights: `StepPlan` takes both from its step plan, one request per step,
and reports the step's times back so that the next plan fits the ranks'
speeds (see gradwire.torch.job for joining the process group there):

    plan = hooks.StepPlan(comm)                   # comm = gradwire.torch.job.init_process_group()
    ddp.register_comm_hook(plan, hooks.weighted_allreduce_hook)
    while True:
        s = plan.begin()                          # s.local_batch samples at s.offset of the global batch
        ...forward, backward (the hook weights by s.weight), optimizer step...
        if plan.end():                            # reports the step's times; True: stop
            break

Both run on the bucket's own memory (no copy) through the process group's
gradwire backend, or any backend of the group (then with torch's own calls).
"""

import time

import torch
import torch.distributed as dist

__all__ = ["allreduce_hook", "weighted_allreduce_hook", "BatchShare", "StepPlan"]


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


class StepPlan:
    """The hook's state under a gwjob agent: each step's local batch, offset
    and weight b_i / B come from the job server's step plan (gwStepBegin),
    so no extra all-reduce is needed to learn the global batch. `comm` is the
    gradwire communicator of the job's ranks (gradwire.torch.job's
    init_process_group returns it); `process_group` is the torch group DDP
    reduces over (None: the default group).

    end() reports the step's times for OptPerf: the whole step from begin(),
    and of it the time spent in the hook's all-reduces (which includes
    waiting for slower ranks) as communication; the rest is this rank's
    compute, which is what the planner fits to the local batch."""

    def __init__(self, comm, process_group=None):
        if not hasattr(comm, "step_begin"):
            raise TypeError("StepPlan needs a gradwire communicator (gradwire.torch.job.init_process_group())")
        self.comm = comm
        self.process_group = process_group
        self.info = None
        self._began = 0.0
        self._comm_s = 0.0

    def begin(self):
        """The plan of this rank's next step (gradwire.StepInfo: step, global_batch,
        local_batch, offset, weight, algo, predicted_step_s)."""
        self.info = self.comm.step_begin()
        self._began = time.perf_counter()
        self._comm_s = 0.0
        return self.info

    def end(self, samples=None):
        """Reports the step begun last (`samples` defaults to the plan's local
        batch). True: the job server asks this worker to stop."""
        if self.info is None:
            raise RuntimeError("StepPlan.end() without begin()")
        step_s = max(time.perf_counter() - self._began, 1e-9)
        comm_s = min(self._comm_s, step_s)
        compute_s = max(step_s - comm_s, 1e-9)
        n = self.info.local_batch if samples is None else samples
        self.info = None
        return self.comm.step_end(n, compute_s, comm_s, step_s)

    def share(self):
        """This step's weight b_i / B, from the plan."""
        if self.info is None:
            raise RuntimeError("weighted_allreduce_hook with a StepPlan: call plan.begin() before "
                               "the backward pass of each step")
        return self.info.weight


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
    if not isinstance(state, (BatchShare, StepPlan)):
        raise TypeError("weighted_allreduce_hook needs a gradwire.torch.hooks.BatchShare or StepPlan state")
    t0 = time.perf_counter()
    buf = bucket.buffer()
    w = state.share()
    dist.all_reduce(buf, op=dist._make_nccl_premul_sum(w), group=state.process_group)
    if isinstance(state, StepPlan):
        state._comm_s += time.perf_counter() - t0
    return _done(buf)
