"""`flyte deploy --dry-run` of the three driver environments in one process, for the tiers `RL_FLYTE_TIERS` names.

    python .ci/deploy_dry_run.py CONFIG.yaml

The environments read their tiers at import time, so `nox -s deploy-dry-run` runs this once per tier. One process per
tier instead of one `flyte deploy` per environment: each of those re-imports flyte, torch and the package.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import flyte


def main(config: str) -> int:
    import rl.deploy.flyte.agentic_faults
    import rl.deploy.flyte.grpo_faults  # noqa: F401  (the same for the GRPO drivers' failure-injected twins)
    from rl.deploy.flyte.agentic import agentic_driver_env
    from rl.deploy.flyte.clustered import grpo_clustered_driver_env
    from rl.deploy.flyte.envs import PYPROJECT
    from rl.deploy.flyte.grpo import grpo_driver_env

    # The image spec installs the project PYPROJECT names: it must be the directory deployed from (nox -s
    # deploy-dry-run deploys a clean copy, with PYTHONPATH pointing there).
    if PYPROJECT.parent != Path.cwd().resolve():
        sys.exit(f"rl was imported from {PYPROJECT.parent}, but the deploy runs in {Path.cwd()}: set PYTHONPATH")
    flyte.init_from_config(config)
    drivers = (grpo_driver_env, grpo_clustered_driver_env, agentic_driver_env)
    deployments = flyte.deploy(*drivers, dry_run=True)
    tiers = os.environ.get("RL_FLYTE_TIERS", "(default)")
    print(f"RL_FLYTE_TIERS={tiers}: {', '.join(d.name for d in drivers)} serialised ({len(deployments)} deployments)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
