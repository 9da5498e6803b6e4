"""vLLM's model-architecture inspection, answered from its own cache.

`ModelConfig` inspects a model's architecture by importing vLLM's whole model stack in a subprocess (xgrammar,
llguidance, triton and more: the GPU side this CPU session does not install) and caches the answer under
`VLLM_CACHE_ROOT/modelinfos`, keyed by a hash of the model module's source. The answer vllm 0.33.0 gives for
`Qwen2ForCausalLM` is committed in `data/modelinfos/`; every session starts from a temporary copy of it, so vLLM reads
what it computed itself, and another vLLM release (another source hash) inspects again and fails loudly instead.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_CACHE = Path(tempfile.mkdtemp(prefix="rl-vllm-cache-"))
shutil.copytree(Path(__file__).parent / "data" / "modelinfos", _CACHE / "modelinfos")
os.environ["VLLM_CACHE_ROOT"] = str(_CACHE)
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
