"""One torchrun worker of `clustered_step.py`: production's clustered train step,
`rl.flyte.clustered.train_step_clustered`, through Flyte's own task runner, as the `clustered` launcher's `a0` worker
runs it in a pod (tests/clustered_torchrun_worker.py says why `load_and_run_task` is called directly).

Instrumented without changing what runs: each rank appends one JSON line to EVENTS_JSONL when it has joined the process
group (its world size, device and backend: NCCL on a GPU, gloo on a CPU), when it downloads a Dir and when it publishes
one.

Usage: python clustered_nccl_worker.py INPUTS_PB OUTPUT_PREFIX RAW_DATA_PATH EVENTS_JSONL
"""

from __future__ import annotations

import asyncio
import json
import os
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

    import rl.flyte.clustered as clustered

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


def main() -> None:
    inputs, output_prefix, raw_data_path, events = sys.argv[1:5]
    _instrument(Path(events))

    from flyte._internal.runtime.entrypoints import load_and_run_task
    from flyte.models import ActionID, RawDataPath

    asyncio.run(
        load_and_run_task(
            action=ActionID(name="a0", run_name="device-check", project="p", domain="d", org="o"),
            raw_data_path=RawDataPath(path=raw_data_path),
            output_path=output_prefix,
            run_base_dir=output_prefix,
            version="v0",
            controller=None,
            resolver="flyte._internal.resolvers.default.DefaultTaskResolver",
            resolver_args=["mod", "rl.flyte.clustered", "instance", "train_step_clustered"],
            input_path=inputs,
        )
    )


if __name__ == "__main__":
    main()
