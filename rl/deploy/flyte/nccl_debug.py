"""NCCL and torch.distributed diagnostics behind one switch, `RL_NCCL_DEBUG=1`.

Set in the deploying shell, it travels into every task's container with the other sizing variables
(`rl.deploy.flyte.envs.ENV_VARS`); `rl.deploy.flyte.clustered.join_process_group` applies it before the process group
starts, since NCCL and torch read these variables when a communicator is made. A value the user set for one of them is
kept. Names checked against torch 2.11 and 2.13 (`TORCH_FR_*` are the flight recorder's names;
`TORCH_NCCL_TRACE_BUFFER_SIZE` is their older alias). What each shows: docs/gpu.md#nccl-diagnostics.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["NCCL_DEBUG_ENV", "apply_nccl_diagnostics", "nccl_diagnostics"]

NCCL_DEBUG_ENV = "RL_NCCL_DEBUG"


def nccl_diagnostics() -> dict[str, str]:
    """The variables `RL_NCCL_DEBUG=1` sets, and their values."""
    return {
        "NCCL_DEBUG": "INFO",  # NCCL's own log: version, topology, transports, each communicator's init
        "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",  # the subsystems that say why a communicator did not form
        "TORCH_CPP_LOG_LEVEL": "INFO",  # torch's C++ distributed logs (the two below write through it)
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",  # every collective's shapes checked across ranks: a desync named
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # on an NCCL error or timeout, abort and end the process
        "TORCH_NCCL_DESYNC_DEBUG": "1",  # on a timeout, which rank did not join which collective
        "TORCH_FR_BUFFER_SIZE": "2000",  # the flight recorder: the last 2,000 collectives per rank
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # ... written out when a collective times out
        "TORCH_FR_DUMP_TEMP_FILE": str(Path(tempfile.gettempdir()) / "rl-nccl-trace-rank-"),  # ... here, per rank
    }


def apply_nccl_diagnostics(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Under `RL_NCCL_DEBUG=1` (in `environ`, this process's environment by default), set `nccl_diagnostics()` in it
    where the user has not; return what was set (empty when the switch is off)."""
    env = os.environ if environ is None else environ
    if env.get(NCCL_DEBUG_ENV, "0").strip() not in ("1", "true", "yes"):
        return {}
    added = {name: value for name, value in nccl_diagnostics().items() if name not in env}
    env.update(added)
    return added
