"""`rl bench`'s measurements, one module per section: `sim` (the simulator and the loops on in-memory tiers), `cpu`
(the real stack on the tiny model), `volumes` (a fork against a full copy), `gpu` (`rl bench --gpu`); `figures` holds
what they share; `heldout` a real model's held-out accuracy (the peers' bench, scripts/real_model_learning.py).
Above the simulator in the layers: the core never imports a benchmark."""
