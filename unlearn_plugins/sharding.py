"""Running one job as several processes started by ``accelerate launch`` (or torchrun).

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK; :func:`launch_group` then joins the
process group through accelerate's :class:`~accelerate.PartialState` (gloo on CPU, NCCL with
one GPU per process). Without a launcher (WORLD_SIZE unset or 1) there is no group and
callers run exactly as a single process does.

Every step that can fail goes through :meth:`Group.everywhere`: each process runs its part,
then all exchange outcomes, so an error on one process stops all of them with the same
message instead of leaving the others waiting in a collective until the timeout.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable

from .errors import UnlearnError

#: collectives wait this long for slow peers (an unbalanced CUD anchor run can take hours);
#: torch's default (10 min NCCL, 30 min gloo) would abort long shards.
TIMEOUT = timedelta(hours=24)
_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def shard_indices(n: int, index: int, count: int) -> list[int]:
    """Positions 0..n-1 of process ``index`` of ``count``: contiguous, in order, sizes differing
    by at most one, the larger shards first (as accelerate's ``split_between_processes``)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"process {index} of {count}")
    size, extra = divmod(n, count)
    start = index * size + min(index, extra)
    return list(range(start, start + size + (1 if index < extra else 0)))


def launched_processes() -> int:
    """How many processes the launcher started (1 without a launcher)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return 1


def single_process_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment without the launcher's variables: a child started with it
    runs as a plain single process (the Trainer does not join the group)."""
    env = dict(os.environ if env is None else env)
    for name in list(env):
        if name in _LAUNCH_VARS or name.startswith(("TORCHELASTIC_", "ACCELERATE_", "TORCH_NCCL_")):
            del env[name]
    return env


class Group:
    """This process's place among the launched ones (wraps accelerate's PartialState)."""

    def __init__(self, state, run_id: str):
        self.state = state
        self.index = state.process_index
        self.count = state.num_processes
        self.is_main = state.is_main_process
        #: the same random id on every process of this launch (names files they exchange)
        self.run_id = run_id

    @property
    def device(self):
        return self.state.device

    def shard(self, n: int) -> list[int]:
        return shard_indices(n, self.index, self.count)

    def barrier(self) -> None:
        self.state.wait_for_everyone()

    def everywhere(self, fn: Callable[[], Any], what: str) -> list[Any]:
        """Run ``fn`` here, then collect every process's result (in process order, on every
        process). When ``fn`` failed anywhere, raise everywhere: the failing process its own
        error, the others an UnlearnError naming the process and its message."""
        from accelerate.utils import gather_object

        try:
            outcome = ("ok", fn())
            error = None
        except BaseException as exc:  # noqa: BLE001 - reported to the peers, then re-raised
            error = exc
            outcome = ("error", f"{type(exc).__name__}: {exc}")
        outcomes = gather_object([outcome])
        if error is not None:
            raise error
        failed = [(i, msg) for i, (status, msg) in enumerate(outcomes) if status == "error"]
        if failed:
            i, msg = failed[0]
            raise UnlearnError(f"{what} failed on process {i} of {self.count}: {msg}")
        return [value for _, value in outcomes]


def launch_group(*, cpu: bool) -> Group | None:
    """Join the launcher's process group, or None when this is the only process.

    ``cpu``: use gloo and the CPU even when CUDA is present (``--device cpu``); on a machine
    without CUDA the group is always a CPU one (accelerate needs to be told: its PartialState
    would otherwise fall back to a single process)."""
    if launched_processes() <= 1:
        return None
    import torch
    from accelerate import PartialState

    cpu = (
        cpu or not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    )
    try:
        state = PartialState(cpu=cpu, timeout=TIMEOUT)
    except (RuntimeError, ValueError) as exc:
        raise UnlearnError(f"cannot join the {launched_processes()}-process group of the launcher: {exc}") from None
    if state.num_processes <= 1:
        return None
    from uuid import uuid4

    from accelerate.utils import broadcast_object_list

    run_id = broadcast_object_list([uuid4().hex if state.is_main_process else None], from_process=0)[0]
    return Group(state, run_id)


def process_device(group: Group | None, requested: str | None) -> str | None:
    """The device this process loads the model on: under a launcher, each process takes its
    own GPU (``cuda:LOCAL_RANK``) unless a specific one was asked for; otherwise ``requested``."""
    if group is None:
        return requested
    if requested in (None, "cuda") and group.device.type == "cuda":
        return str(group.device)
    if requested is None:
        return "cpu"
    return requested
