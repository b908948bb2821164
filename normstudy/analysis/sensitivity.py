"""Learning-rate sensitivity of a sweep: final loss against learning rate, per arm, over seeds.

The method is Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities" (arXiv:2309.14322), section 3.1: with l(eta) the final loss at learning rate eta
and l0 the loss at initialisation,

    LR sensitivity = mean over the grid of [min(l(eta), l0) - min over the grid of l(eta)]

so a design whose loss stays near its best over a wide range of learning rates scores near 0, and a
learning rate at which it fails counts as the whole distance from init to best. Here l(eta) is the
final eval loss averaged over seeds, and a run that halted, diverged or ended non-finite counts
as l0 (it did not train; Wortsman et al. count diverged runs the same way through the min).

A run belongs to a curve by its arm (the config variant) and the sweep's axes other than the
learning rate and the seed (a depth axis, say: one panel per value). Everything here reads the
table `table(df, summary)` builds, one row per run, so a notebook can recompute any of it.
"""

import math

import numpy as np
import pandas as pd

from normstudy import grid
from normstudy.analysis import runs as runs_lib

LR = "optimizer.learning_rate"
SEED = "train.seed"
# A learning-rate range "within reach" of the best: Wortsman et al.'s plots read 0.1 nats.
NEAR_BEST_NATS = 0.1
FAILED = ("halted", "diverged")
# Where a run first went non-finite, in coarse kinds (telemetry.first_nonfinite's words).
DEATH_KINDS = ("attention scores", "attention output", "residual stream", "MLP pre-activation",
               "MLP output", "output logits", "embedding", "backward pass only", "not located")


def is_sweep(df: pd.DataFrame) -> bool:
  """Whether the runs below a directory vary the learning rate (a sensitivity sweep)."""
  lrs = {info["point"].get(LR) for info in df.attrs.get("runs", {}).values()}
  return len(lrs - {None}) > 1


def _max_finite(values) -> float:
  values = np.asarray(values, dtype=float)
  values = values[np.isfinite(values)]
  return float(values.max()) if values.size else np.nan


def _group_of(point: dict) -> str:
  """The sweep's other axes (not learning rate, not seed) as text: "" or "layers=12"."""
  rest = {k: v for k, v in point.items() if k not in (LR, SEED)}
  return grid.point_label(rest)


def death_kind(site) -> str:
  """The kind of place a run first went non-finite, from run.json's `nonfinite_site`
  ({"layer": 3, "site": "residual stream"} -> "residual stream"); "not located" without one."""
  if not isinstance(site, dict) or site.get("site") not in DEATH_KINDS:
    return "not located"
  return site["site"]


def death_layer(site):
  """The layer index of run.json's `nonfinite_site`, or None."""
  return site.get("layer") if isinstance(site, dict) else None


def table(df: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
  """One row per run of the sweep: run, arm, arm_label, group, learning_rate, seed, status,
  final_eval_loss, loss_init (its first recorded train loss: the loss at initialisation),
  effective_loss (final eval loss, or loss_init if the run failed), max_attn_logit (over layers
  and telemetry steps; NaN without telemetry), nonfinite_at, halt_reason, entropy_floor,
  dtype."""
  infos = df.attrs.get("runs", {})
  status = dict(zip(summary.run, summary.status))
  rows = []
  for run, info in infos.items():
    point = info["point"]
    if LR not in point:
      continue
    loss = runs_lib.series(df, run, "loss")
    eval_loss = runs_lib.series(df, run, "eval_loss")
    final = float(eval_loss.iloc[-1]) if len(eval_loss) else np.nan
    init = float(loss.iloc[0]) if len(loss) else np.nan
    failed = status.get(run) in FAILED or not np.isfinite(final)
    logits = df[(df.run == run) & df.metric.str.startswith("attn_logit_max/layer_")].value
    rows.append({
        "run": run, "arm": info.get("arm") or run, "arm_label": info.get("arm_label", run),
        "group": _group_of(point), "learning_rate": float(point[LR]),
        "seed": point.get(SEED), "status": status.get(run, info.get("status")),
        "final_eval_loss": final, "loss_init": init,
        "effective_loss": init if failed else min(final, init),
        "max_attn_logit": _max_finite(logits), "nonfinite_at": info.get("nonfinite_at"),
        "nonfinite_kind": death_kind(info.get("nonfinite_site")),
        "nonfinite_layer": death_layer(info.get("nonfinite_site")),
        "halt_reason": info.get("halt_reason"), "entropy_floor": info.get("entropy_floor"),
        "dtype": info.get("dtype"),
    })
  return pd.DataFrame(rows, columns=[
      "run", "arm", "arm_label", "group", "learning_rate", "seed", "status", "final_eval_loss",
      "loss_init", "effective_loss", "max_attn_logit", "nonfinite_at", "nonfinite_kind",
      "nonfinite_layer", "halt_reason",
      "entropy_floor", "dtype"])


def lr_sensitivity(lrs, losses, loss_init: float) -> dict:
  """Wortsman et al.'s LR sensitivity of one curve, and what goes with it.

  `losses[i]` is the loss at `lrs[i]` (a failed run already counted as `loss_init`). Returns
  best_loss, best_lr, lr_sensitivity (mean of min(loss, loss_init) - best_loss), and the widest
  contiguous stretch of the grid whose losses are all within NEAR_BEST_NATS of the best:
  lr_range_low, lr_range_high and lr_range_decades (log10 of their ratio; 0 for one point).
  """
  order = np.argsort(np.asarray(lrs, dtype=float))
  lrs = np.asarray(lrs, dtype=float)[order]
  losses = np.asarray(losses, dtype=float)[order]
  capped = np.minimum(losses, loss_init)
  best_i = int(np.argmin(capped))
  best = float(capped[best_i])
  near = capped <= best + NEAR_BEST_NATS
  start, widest = None, (best_i, best_i)
  for i, ok in enumerate(list(near) + [False]):  # the sentinel closes a stretch at the end
    if ok and start is None:
      start = i
    elif not ok and start is not None:
      if lrs[i - 1] / lrs[start] > lrs[widest[1]] / lrs[widest[0]]:
        widest = (start, i - 1)
      start = None
  return {"best_loss": best, "best_lr": float(lrs[best_i]),
          "lr_sensitivity": float(np.mean(capped - best)),
          "lr_range_low": float(lrs[widest[0]]), "lr_range_high": float(lrs[widest[1]]),
          "lr_range_decades": float(math.log10(lrs[widest[1]] / lrs[widest[0]]))}


def _curves(runs: pd.DataFrame):
  """(group, arm) -> that curve's runs, in the order the runs were found (legend order)."""
  return {key: rows for key, rows in runs.groupby(["group", "arm"], sort=False)}


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
  """One row per arm (and value of any other axis): runs, seeds, halted, diverged, halted_share,
  the curve's lr_sensitivity with best_loss and best_lr and the near-best range (lr_sensitivity),
  lr_sensitivity_seed_std (the metric computed per seed, its spread over seeds),
  best_loss_seed_std (the seeds' spread at the best learning rate), loss_init, max_attn_logit
  and the entropy floor."""
  rows = []
  for (group, arm), curve in _curves(runs).items():
    per_lr = curve.groupby("learning_rate").effective_loss.mean()
    loss_init = float(curve.loss_init.mean())
    metric = lr_sensitivity(per_lr.index, per_lr.to_numpy(), loss_init)
    per_seed = [lr_sensitivity(rows_.learning_rate, rows_.effective_loss, loss_init)
                ["lr_sensitivity"] for _, rows_ in curve.groupby("seed")
                if rows_.learning_rate.nunique() == per_lr.size]
    at_best = curve[curve.learning_rate == metric["best_lr"]].effective_loss
    rows.append({
        "arm": arm, "label": curve.arm_label.iloc[0] + (f", {group}" if group else ""),
        "group": group, "runs": len(curve), "seeds": curve.seed.nunique(),
        "halted": int((curve.status == "halted").sum()),
        "diverged": int((curve.status == "diverged").sum()),
        "halted_share": float(curve.status.isin(FAILED).mean()),
        **metric,
        "lr_sensitivity_seed_std": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1
        else np.nan,
        "best_loss_seed_std": float(at_best.std(ddof=1)) if len(at_best) > 1 else np.nan,
        "loss_init": loss_init, "max_attn_logit": _max_finite(curve.max_attn_logit),
        "entropy_floor": curve.entropy_floor.iloc[0],
    })
  return pd.DataFrame(rows)


def deaths(runs: pd.DataFrame) -> pd.DataFrame:
  """How runs die: one row per arm, learning rate and place of death (kind and layer), with
  how many runs there are at that learning rate, how many halted or diverged, and how many
  first went non-finite there. Learning rates where no run died get one row with site "" and
  count 0, so the table covers the whole grid."""
  rows = []
  for (group, arm), curve in _curves(runs).items():
    label = curve.arm_label.iloc[0] + (f", {group}" if group else "")
    for lr, at_lr in curve.groupby("learning_rate"):
      failed = at_lr[at_lr.status.isin(FAILED)]
      base = {"arm": arm, "label": label, "group": group, "learning_rate": lr,
              "runs": len(at_lr), "halted": int((at_lr.status == "halted").sum()),
              "diverged": int((at_lr.status == "diverged").sum())}
      if failed.empty:
        rows.append({**base, "site": "", "kind": "", "layer": None, "count": 0})
        continue
      sites = failed.assign(site=failed.nonfinite_at.where(failed.nonfinite_at.notna(),
                                                           "not located"),
                            layer=failed.nonfinite_layer.astype("Int64"))
      for (site, kind, layer), at in sites.groupby(["site", "nonfinite_kind", "layer"],
                                                   sort=False, dropna=False):
        rows.append({**base, "site": site, "kind": kind,
                     "layer": None if pd.isna(layer) else int(layer), "count": len(at)})
  table_ = pd.DataFrame(rows, columns=["arm", "label", "group", "learning_rate", "runs",
                                       "halted", "diverged", "site", "kind", "layer", "count"])
  table_["layer"] = table_.layer.astype("Int64")
  return table_


def _lr_text(lr: float) -> str:
  return f"{lr:g}"


def _killers(dead: pd.DataFrame) -> str:
  """"residual stream of layer 3 (4 runs), attention scores of layer 0 (1 run)"."""
  parts = []
  for row in dead.sort_values("count", ascending=False).itertuples():
    where = (f"{row.kind} of layer {int(row.layer)}" if row.layer is not None
             and not pd.isna(row.layer) else row.site)
    parts.append(f"{where} ({row.count} run{'s' if row.count != 1 else ''})")
  return ", ".join(parts)


def observations(runs: pd.DataFrame, by_arm: pd.DataFrame, died: pd.DataFrame) -> str:
  """Sentences with the numbers: which arm is least sensitive and by how much, whether the seeds'
  spread makes that meaningful, where each arm's best is, and what kills each arm."""
  parts = [f"{len(runs)} runs: {runs.learning_rate.nunique()} learning rates "
           f"({_lr_text(runs.learning_rate.min())} to {_lr_text(runs.learning_rate.max())}) x "
           f"{runs.seed.nunique()} seed(s) per arm. LR sensitivity (Wortsman et al. 2023) is the "
           f"mean over the grid of min(loss, loss at init) - best loss, with a halted or diverged "
           f"run counted at its loss at init; lower is more robust."]
  for group, arms in by_arm.groupby("group", sort=False):
    ranked = arms.sort_values("lr_sensitivity")
    head = f"With {group}, least" if group else "Least"
    first = ranked.iloc[0]
    text = (f"{head} sensitive: {first.label} ({first.lr_sensitivity:.3f} nats"
            + (f", seeds' std {first.lr_sensitivity_seed_std:.3f}"
               if np.isfinite(first.lr_sensitivity_seed_std) else "") + ")")
    if len(ranked) > 1:
      second = ranked.iloc[1]
      gap = second.lr_sensitivity - first.lr_sensitivity
      spread = np.hypot(first.lr_sensitivity_seed_std, second.lr_sensitivity_seed_std)
      text += (f", then {second.label} ({second.lr_sensitivity:.3f}), a gap of {gap:.3f}; most "
               f"sensitive: {ranked.iloc[-1].label} ({ranked.iloc[-1].lr_sensitivity:.3f}).")
      if np.isfinite(spread) and first.seeds > 1:
        # The gap against the standard error of a difference of two means over the seeds.
        error = spread / math.sqrt(first.seeds)
        text += (f" Over {int(first.seeds)} seeds the gap between the two least sensitive is "
                 + (f"{gap / error:.1f} standard errors: meaningful." if gap > 2 * error else
                    f"within {gap / error:.1f} standard errors ({error:.3f} nats): the seeds' "
                    f"spread does not separate them."))
      else:
        text += " One seed per point: the ordering is not tested against seed noise."
    else:
      text += "."
    lowest = arms.sort_values("best_loss").iloc[0]
    if lowest.arm != first.arm:
      text += (f" Lowest loss: {lowest.label} ({lowest.best_loss:.3f} at lr "
               f"{_lr_text(lowest.best_lr)}), {first.best_loss - lowest.best_loss:.3f} nats below "
               f"the least sensitive arm's best: a flat curve can also mean an arm that learns "
               f"equally little at every learning rate.")
    parts.append(text)
    for row in ranked.itertuples():
      line = (f"{row.label}: best final eval loss {row.best_loss:.3f} at lr "
              f"{_lr_text(row.best_lr)}"
              + (f" (seeds' std {row.best_loss_seed_std:.3f})"
                 if np.isfinite(row.best_loss_seed_std) else "")
              + f"; within {NEAR_BEST_NATS:g} nats of it from lr {_lr_text(row.lr_range_low)} "
              f"to {_lr_text(row.lr_range_high)} ({row.lr_range_decades:.2f} decades); "
              f"{row.halted + row.diverged} of {row.runs} runs halted or diverged")
      if np.isfinite(row.max_attn_logit):
        line += f"; largest attention logit {row.max_attn_logit:.3g}"
      dead = died[(died.arm == row.arm) & (died.group == row.group) & (died["count"] > 0)]
      if len(dead):
        lowest = dead.learning_rate.min()
        line += f"; runs die from lr {_lr_text(lowest)} on, first non-finite at: " + _killers(
            dead.groupby(["site", "kind", "layer"], dropna=False, as_index=False)["count"].sum())
        failed = runs[(runs.arm == row.arm) & (runs.group == row.group)
                      & runs.status.isin(FAILED)]
        reasons = failed.halt_reason.fillna("diverged").value_counts()
        line += "; halted by: " + ", ".join(f"{reason} ({count})"
                                             for reason, count in reasons.items())
      parts.append(line + ".")
  return "\n\n".join(parts)
