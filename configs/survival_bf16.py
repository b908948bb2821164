"""Survival in bfloat16 (`make survival-bf16`): configs/survival.py's search with
model.dtype=bfloat16 (no loss scaling: is Post-LN's higher critical learning rate float16's
headroom?), then its interaction with the float16 search in the sibling directory `survival`
(runs/survival: `make survival` first; interaction.csv says whether an arm's margin in float16
is the dtype's)."""

from configs import survival

EXPERIMENT = survival.in_dtype("bfloat16")

get_config = EXPERIMENT.get_config
