"""`init_process_group` for workers that a `gwjob` agent started.

An agent gives its workers gradwire's launch contract (GW_RANK,
GW_WORLD_SIZE, GW_STORE, and GW_JOB_* for the job server's step protocol)
but not torchrun's MASTER_ADDR/MASTER_PORT: the job server places rank 0 and
opens gradwire's rendezvous store on its node, and knows of no port for
torch's store. So the ranks first form a gradwire communicator from their
environment (which is also the one the step protocol needs: its rank is
the job's rank), rank 0 opens torch's TCPStore on a free port of its node
(the node that holds GW_STORE) and broadcasts the port over gradwire, and
every rank then joins torch's process group with that store.

    from gradwire.torch import hooks, job
    comm = job.init_process_group()                  # instead of dist.init_process_group
    plan = hooks.StepPlan(comm)                      # local batches and weights from the server
    ddp.register_comm_hook(plan, hooks.weighted_allreduce_hook)
"""

import datetime
import os

import numpy as np
import torch.distributed as dist

import gradwire as _gw

__all__ = ["under_gwjob", "init_process_group"]


def under_gwjob():
    """Whether this process was started by a gwjob agent: GW_JOB_SERVER set (gwrun
    sets GW_STORE and GW_JOB_ID too, but no job server), and GW_STORE."""
    return bool(os.environ.get("GW_JOB_SERVER")) and bool(os.environ.get("GW_STORE"))


def _store_host(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"gradwire.torch.job: GW_STORE={addr!r} is not host:port")
    return host.strip("[]")


def init_process_group(backend="gradwire", timeout=datetime.timedelta(minutes=5)):
    """Joins torch's default process group as this gwjob worker's rank, with
    `backend` ("gradwire", or another such as "gloo"), and returns the
    gradwire communicator made from the job's environment (for
    hooks.StepPlan). Raises RuntimeError outside a gwjob worker."""
    if not under_gwjob():
        raise RuntimeError(
            "gradwire.torch.job.init_process_group: GW_JOB_SERVER and GW_STORE are not set, so this "
            "process was not started by a gwjob agent; under gwrun or torchrun call "
            "torch.distributed.init_process_group instead")
    host = _store_host(os.environ["GW_STORE"])
    if backend == "gradwire":
        import gradwire.torch  # noqa: F401  (registers the backend)
    comm = _gw.init()
    port = np.zeros(1, dtype=np.int64)
    store = None
    if comm.rank == 0:
        store = dist.TCPStore(host, 0, comm.size, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        port[0] = store.port
    port = comm.broadcast(port, root=0)
    if comm.rank != 0:
        store = dist.TCPStore(host, int(port[0]), comm.size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size,
                            timeout=timeout)
    return comm
