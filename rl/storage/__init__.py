"""What a run keeps: the safe filesystem (`safe_fs`, `dead_writers`), the run directory (`run_dir`, `run_layout`,
`run_lock`), the rollout volumes (`volumes`), the artifact store (`artifacts`) and checkpoints (`checkpoint`)."""
