"""`vllm.lora` stand-in: only `vllm.lora.request` is provided."""
