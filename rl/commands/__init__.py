"""The `rl` command's sub-commands, one module each; their argparse types are in `rl.argtypes`."""
