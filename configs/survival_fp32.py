"""Survival in float32 (`make survival-fp32`): configs/survival.py's search with
model.dtype=float32 (float16's range and bfloat16's rounding apart: bfloat16 has float32's range
and coarser rounding), then its interaction with the float16 search in the sibling directory
`survival` (runs/survival: `make survival` first; interaction.csv says whether an arm's margin
in float16 is the dtype's)."""

from configs import survival

EXPERIMENT = survival.in_dtype("float32")

get_config = EXPERIMENT.get_config
