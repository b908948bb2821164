"""How values are written into names: a run directory's point name (`lr0.001_seed1`), a legend's
point label (`lr=0.001, seed=1`), and a number in either or in a label (`number`)."""

import re

# Short names of common axes in run directory names and labels; others use the field's last part.
SHORT_NAMES = {"optimizer.learning_rate": "lr", "optimizer.clip_norm": "clip",
               "optimizer.weight_decay": "wd", "optimizer.warmup_steps": "warmup",
               "train.seed": "seed", "model.num_layers": "layers", "model.d_model": "width"}


def number(value) -> str:
  """A value as names and labels write it: a float in its shortest form (`{:g}`: 0.001, 1e-05,
  10), anything else as str."""
  return f"{value:g}" if isinstance(value, float) else str(value)


def short(field: str) -> str:
  return SHORT_NAMES.get(field, field.split(".")[-1])


def point_name(values: dict) -> str:
  """'lr0.001_seed1' for {"optimizer.learning_rate": 0.001, "train.seed": 1}; a text value is
  joined by a dash ('placement-pre_ln')."""
  parts = []
  for field, value in values.items():
    text = number(value)
    parts.append(f"{short(field)}{text}" if isinstance(value, (int, float)) and not isinstance(
        value, bool) else f"{short(field)}-{text}")
  return "_".join(parts)


def point_label(values: dict) -> str:
  """'lr=0.001, seed=1': a point in a legend."""
  return ", ".join(f"{short(field)}={number(value)}" for field, value in values.items())


# MERT's figure tells its two Pre-Norm runs apart as "Run 1" and "Run 2" (configs/seed_figure.py's
# labels keep that); a run of a grid, or an arm drawn over seeds, is no such single run.
RUN_NUMBER = re.compile(r"\s*\|\s*Run (\d+)$")


def without_run_number(label: str) -> str:
  """`label` without a trailing "| Run N"."""
  return RUN_NUMBER.sub("", label)
