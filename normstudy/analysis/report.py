"""The summary table and the written observations, generated from the records."""

import numpy as np
import pandas as pd

from normstudy.analysis import detectors
from normstudy.analysis import runs as runs_lib
from normstudy.records import keys
from normstudy.records import schema


def steps_taken(facts: runs_lib.Run, loss: pd.Series) -> int:
  """Train steps a run really took: up to the last record, minus the step that halted it (its
  update was never applied)."""
  last = int(loss.index.max()) if len(loss) else 0
  if facts.status == schema.HALTED and facts.info.halt_step:
    return int(facts.info.halt_step) - 1
  return last


def _last(values: pd.Series):
  return values.iloc[-1] if len(values) else np.nan


# What arms.csv gives per arm over its seeds: the median, the lowest and the highest.
ARM_SPREAD_COLUMNS = ("final_eval_loss", "loss_spikes", "scale_halvings", "clipped_fraction",
                      "skipped_steps")


def arm_spread(summary: pd.DataFrame, loaded: runs_lib.Runs, groups: dict) -> pd.DataFrame:
  """One row per arm of runs over seeds (arms.csv; `groups`: runs.seed_groups): arm, label,
  seeds, runs that finished, and for each of ARM_SPREAD_COLUMNS its median over the arm's runs
  with `<column>_min` and `<column>_max` (a halted run's final eval loss is missing: the
  others' are used)."""
  rows = []
  by_run = summary.set_index("run")
  for arm, members in groups.items():
    part = by_run.loc[members]
    facts = loaded.runs[members[0]]
    row = {"arm": arm, "label": facts.info.arm_label or facts.label, "seeds": len(members),
           "finished": int((part.status == schema.FINISHED).sum())}
    for column in ARM_SPREAD_COLUMNS:
      values = pd.to_numeric(part[column], errors="coerce").dropna()
      row[column] = values.median() if len(values) else np.nan
      row[f"{column}_min"] = values.min() if len(values) else np.nan
      row[f"{column}_max"] = values.max() if len(values) else np.nan
    rows.append(row)
  return pd.DataFrame(rows)


def summarize(loaded: runs_lib.Runs) -> pd.DataFrame:
  """One row per run: label, status (finished | halted | diverged | preempted | running), outcome
  and recoveries by the failure rule (normstudy.records.outcomes), steps taken, halt step and reason, final/min loss, max loss after warm-up, final eval loss, skipped
  steps, lowest loss scale from its first fall on (detectors.lowest_scale_after_first_fall) and final
  loss scale, updates skip-step withheld (spike_skips), and the observation counts
  (detectors.observe)."""
  rows = []
  for run, facts in loaded.runs.items():
    loss = loaded.series(run, "loss")
    finite_loss = loss[np.isfinite(loss.to_numpy(dtype=float))]
    after_warmup = finite_loss[finite_loss.index > facts.warmup_steps]
    scale = loaded.series(run, "loss_scale")
    skipped = loaded.series(run, "skipped_total")
    spike_skips = loaded.series(run, keys.SPIKE_SKIPS)
    seen = detectors.observe(loaded, run)
    rows.append({
        "run": run,
        "label": facts.label,
        "status": seen["status"],
        "outcome": seen["outcome"],
        "recoveries": seen["recoveries"],
        "steps": steps_taken(facts, loss),
        "halt_step": facts.info.halt_step,
        "halt_reason": facts.info.halt_reason,
        "nonfinite_at": facts.info.nonfinite_at,
        "final_loss": _last(loss),
        "min_loss": finite_loss.min() if len(finite_loss) else np.nan,
        "max_loss_after_warmup": after_warmup.max() if len(after_warmup) else np.nan,
        "final_eval_loss": _last(loaded.series(run, "eval_loss")),
        "skipped_steps": int(_last(skipped) or 0) if len(skipped) else 0,
        # Updates skip-step (optimizer.skip_spikes) withheld as spikes; 0 without it.
        "spike_skips": int(_last(spike_skips) or 0) if len(spike_skips) else 0,
        "min_loss_scale": detectors.lowest_scale_after_first_fall(scale),
        "final_loss_scale": _last(scale),
        "entropy_floor": facts.info.entropy_floor,
        "loss_spikes": seen["loss_spikes"],
        "first_spike_step": seen["first_spike_step"],
        "largest_spike": seen["largest_spike"],
        "diverged_at": seen["diverged_at"],
        "scale_halvings": seen["scale_halvings"],
        "halvings_per_1k": seen["halvings_per_1k"],
        "grad_norm_spikes": seen["grad_norm_spikes"],
        "clipped_fraction": seen["clipped_fraction"],
    })
  return pd.DataFrame(rows)


def _times(count: int) -> str:
  return "once" if count == 1 else f"{count} times"


def steps_text(step) -> str:
  return f"{step / 1000:.1f}K" if step >= 1000 else str(int(step))


def power_of_two(value: float) -> str:
  exponent = np.log2(value) if value > 0 else np.nan
  return f"2^{int(exponent)}" if np.isfinite(exponent) and exponent == int(exponent) \
      else f"{value:g}"


def describe_run(loaded: runs_lib.Runs, run: str) -> str:
  """A few sentences with numbers and steps about one run, generated from its records."""
  facts, info = loaded[run], loaded[run].info
  seen = detectors.observe(loaded, run)
  loss = loaded.series(run, "loss")
  eval_loss = loaded.series(run, "eval_loss")
  finite_eval = eval_loss[np.isfinite(eval_loss.to_numpy(dtype=float))]
  parts = [f"Trained {steps_text(steps_taken(facts, loss))} steps"]
  if facts.status == schema.HALTED:
    parts[0] += (f", then halted at step {steps_text(info.halt_step)}: "
                 f"{info.halt_reason or 'stopped'}"
                 + (f" (first non-finite: {info.nonfinite_at})" if info.nonfinite_at else ""))
  parts[0] += f"; last loss {loss.iloc[-1]:.3f}" + (
      f", last eval loss {finite_eval.iloc[-1]:.3f} (step {steps_text(finite_eval.index[-1])})"
      if len(finite_eval) else "") + (
          f" (entropy floor {info.entropy_floor:.3f})" if info.entropy_floor else "")
  parts[0] += "."
  if seen["loss_spikes"]:
    parts.append(f"Loss spiked {_times(seen['loss_spikes'])}, "
                 f"first at step {steps_text(seen['first_spike_step'])}, largest "
                 f"+{seen['largest_spike']:.2f} above trend.")
  else:
    parts.append("No loss spikes.")
  if seen["diverged_at"] is not None and facts.status != schema.HALTED:
    parts.append(f"It diverged at step {steps_text(seen['diverged_at'])}.")
  scale = loaded.series(run, "loss_scale")
  if len(scale) and scale.max() > 1 and seen["scale_halvings"]:
    parts.append(f"The fp16 loss scale was halved {_times(seen['scale_halvings'])} "
                 f"({seen['halvings_per_1k']:.1f} per 1K steps) and fell as low as "
                 f"{power_of_two(seen['lowest_scale'])} at step "
                 f"{steps_text(seen['lowest_scale_step'])}; final {power_of_two(scale.iloc[-1])}.")
  elif len(scale) and scale.max() > 1:
    parts.append(f"The fp16 loss scale never fell (final {power_of_two(scale.iloc[-1])}).")
  skipped = loaded.series(run, "skipped_total")
  if len(skipped) and skipped.iloc[-1]:
    parts.append(f"{int(skipped.iloc[-1])} updates were skipped for non-finite gradients.")
  parts.append(f"Gradient clipping acted on {seen['clipped_fraction']:.0%} of logged steps"
               + (f"; the gradient norm spiked {_times(seen['grad_norm_spikes'])}, first at step "
                  f"{steps_text(seen['first_grad_spike_step'])}." if seen["grad_norm_spikes"]
                  else "; no gradient-norm spikes."))
  logits = loaded.layer_values(run, "attn_logit_max")
  if not logits.empty and np.isfinite(logits.to_numpy()).any():
    layer, step = np.unravel_index(np.nanargmax(logits.to_numpy()), logits.shape)
    parts.append(f"The largest attention logit was {logits.to_numpy()[layer, step]:.1f} "
                 f"(layer {logits.index[layer]}, step {steps_text(logits.columns[step])}).")
  rms = loaded.layer_values(run, "act_rms")
  if not rms.empty and rms.shape[1] > 1:
    last = rms.iloc[-1]
    parts.append(f"Activation RMS after the last layer went from {last.iloc[0]:.2f} to "
                 f"{last.iloc[-1]:.2f}.")
  return " ".join(parts)


def compare_runs(summary: pd.DataFrame) -> str:
  """Sentences comparing runs, from the summary table."""
  if len(summary) < 2:
    return "Only one run; nothing to compare."
  parts = []
  by_eval = summary.dropna(subset=["final_eval_loss"]).sort_values("final_eval_loss")
  if len(by_eval) >= 2:
    best, worst = by_eval.iloc[0], by_eval.iloc[-1]
    parts.append(f"Lowest final eval loss: {best.label} ({best.final_eval_loss:.3f}); highest: "
                 f"{worst.label} ({worst.final_eval_loss:.3f}), a gap of "
                 f"{worst.final_eval_loss - best.final_eval_loss:.3f}.")
  halted = summary[summary.status == schema.HALTED]
  if len(halted):
    parts.append("Halted: " + "; ".join(
        f"{row.label} at step {int(row.halt_step)} ({row.halt_reason}"
        + (f", first non-finite: {row.nonfinite_at}" if isinstance(row.nonfinite_at, str)
           else "") + ")" for row in halted.itertuples()) + ".")
  else:
    parts.append("No run halted.")
  most, fewest = summary.loss_spikes.max(), summary.loss_spikes.min()
  if most == fewest:
    parts.append("No run had a loss spike." if most == 0 else
                 f"Every run had {int(most)} loss spike{'s' if most > 1 else ''}.")
  else:
    parts.append(f"Most loss spikes ({int(most)}): {_tied(summary, summary.loss_spikes == most)}"
                 f"; fewest ({int(fewest)}): {_tied(summary, summary.loss_spikes == fewest)}.")
  diverged = summary[summary.status == schema.DIVERGED]
  parts.append(f"Diverged: {', '.join(diverged.label)}." if len(diverged) else
               "No run diverged." if not len(halted) else "No other run diverged.")
  if (summary.scale_halvings > 0).any():
    most = summary.scale_halvings.max()
    lowest = summary.final_loss_scale.min()
    parts.append(f"Most loss-scale halvings ({int(most)}): "
                 f"{_tied(summary, summary.scale_halvings == most)}; lowest final loss scale "
                 f"({power_of_two(lowest)}): {_tied(summary, summary.final_loss_scale == lowest)}.")
  clipped = summary.sort_values("clipped_fraction", ascending=False)
  parts.append("Share of steps clipped: " + ", ".join(
      f"{row.label} {row.clipped_fraction:.0%}" for row in clipped.itertuples()) + ".")
  return " ".join(parts)


def _tied(summary: pd.DataFrame, where) -> str:
  """The labels of the runs `where` selects: one, or every tied one, said as a tie."""
  labels = list(summary.label[where])
  if len(labels) == 1:
    return labels[0]
  if len(labels) == len(summary):
    return "every run, tied"
  return ", ".join(labels[:-1]) + f" and {labels[-1]}, tied"


def write_observations(loaded: runs_lib.Runs, summary: pd.DataFrame, path: str,
                       extra_sections=(), per_run: bool = True) -> str:
  """observations.md: any extra (title, text) sections first, then, unless `per_run` is False
  (a sweep of many runs), each run and the comparison."""
  lines = ["# Observations", "",
           f"Generated by normstudy.analysis from {len(summary)} run(s). A loss spike is a "
           f"step more than max({detectors.SPIKE_MIN_MARGIN}, "
           f"{detectors.SPIKE_NOISE_FACTOR:g} sigma) above the median of up to "
           f"{detectors.SPIKE_WINDOW} earlier logged steps (at least "
           f"{detectors.SPIKE_MIN_HISTORY}), sigma the step-to-step noise; consecutive such "
           "steps count once.", ""]
  for title, text in extra_sections:
    lines += [f"## {title}", "", text, ""]
  for run, label in zip(summary.run, summary.label) if per_run else ():
    lines += [f"## {label}", "", describe_run(loaded, run), ""]
  if per_run:  # a sweep's comparison is its sensitivity section
    lines += ["## Comparison", "", compare_runs(summary), ""]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return path
