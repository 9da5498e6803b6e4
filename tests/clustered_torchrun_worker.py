"""One torchrun worker of `tests/test_clustered_torchrun.py` and `gpu_tests/clustered_step.py` (NCCL on a GPU):
runs `rl.deploy.flyte.clustered.train_step_clustered` through Flyte's own task runner, as the `clustered` launcher's
`a0` worker does in a pod.

`flyte._bin.clustered` execs torchrun with `a0 ...` per worker, and `a0` (with no controller, since torchrun marks the
worker clustered through `TORCHELASTIC_RUN_ID`) calls `load_and_run_task`: it loads the inputs file, runs the task
body, and uploads outputs from global rank 0 only (errors likewise), exiting non-zero on a clustered worker's failure.
We call `load_and_run_task` directly because `a0` first runs `init_in_cluster`, which needs a control plane.

Instrumented, without changing what runs: each rank appends one JSON line to `events.jsonl` when it has joined the
process group (its world size, device and backend), when it downloads a Dir (which one) and when it publishes a Dir.
`RL_TEST_KILL_RANK=N` SIGKILLs global rank N inside its DDP shard step (after the forward-backwards of its samples,
before the synchronising all-reduce).

Usage: python clustered_torchrun_worker.py INPUTS_PB OUTPUT_PREFIX RAW_DATA_PATH EVENTS_JSONL
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


def _log(events: Path, **event: Any) -> None:
    event.update(rank=int(os.environ["RANK"]), local_rank=int(os.environ["LOCAL_RANK"]))
    with events.open("a") as f:  # one short line per write: O_APPEND keeps the ranks' lines whole
        f.write(json.dumps(event) + "\n")


def _instrument(events: Path) -> None:
    import torch.distributed as dist
    from flyte.io import Dir

    import rl.deploy.flyte.clustered as clustered
    import rl.trainer.ddp as ddp

    join, upload, download = clustered.join_process_group, clustered.upload_dir, Dir.download

    def logged_join() -> tuple[int, int, str, bool]:
        joined = join()
        _log(events, event="joined", world_size=joined[1], device=joined[2], backend=str(dist.get_backend()))
        return joined

    async def logged_upload(path: Path, name: str) -> Dir:
        _log(events, event="publish", name=name)
        return await upload(path, name)

    async def logged_download(self: Dir, local_path: Any = None) -> str:
        _log(events, event="download", path=self.path)
        return await download(self, local_path)

    clustered.join_process_group = logged_join
    clustered.upload_dir = logged_upload
    Dir.download = logged_download  # type: ignore[method-assign]

    kill_rank = os.environ.get("RL_TEST_KILL_RANK")
    if kill_rank is not None and int(kill_rank) == int(os.environ["RANK"]):

        def killed_shard_step(ddp_model: Any, fns: Any, sync_forward: Any) -> None:
            with ddp_model.no_sync():
                for fn in fns:
                    fn().backward()
            _log(events, event="killed")
            os.kill(os.getpid(), signal.SIGKILL)

        ddp.ddp_shard_step = killed_shard_step


def main() -> None:
    inputs, output_prefix, raw_data_path, events = sys.argv[1:5]
    import torch

    torch.set_num_threads(1)  # four ranks on a small machine
    _instrument(Path(events))

    from flyte._internal.runtime.entrypoints import load_and_run_task
    from flyte.models import ActionID, RawDataPath

    asyncio.run(
        load_and_run_task(
            action=ActionID(name="a0", run_name="torchrun-test", project="p", domain="d", org="o"),
            raw_data_path=RawDataPath(path=raw_data_path),
            output_path=output_prefix,
            run_base_dir=output_prefix,
            version="v0",
            controller=None,
            resolver="flyte._internal.resolvers.default.DefaultTaskResolver",
            resolver_args=["mod", "rl.deploy.flyte.clustered", "instance", "train_step_clustered"],
            input_path=inputs,
        )
    )


if __name__ == "__main__":
    main()
