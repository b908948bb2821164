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

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.records import names
from normstudy.records import schema

LR = "optimizer.learning_rate"
SEED = "train.seed"
# A learning-rate range "within reach" of the best: Wortsman et al.'s plots read 0.1 nats.
NEAR_BEST_NATS = 0.1
FAILED = schema.FAILED
# Where a run first went non-finite: the words of normstudy.records.schema.SITE_WORDS, in the order
# the forward pass computes them; "residual stream" for runs recorded before the two residual sites
# were told apart (their run.json stored the words, not the id).
LEGACY_RESIDUAL = "residual stream"
DEATH_KINDS = (*(schema.SITE_WORDS[s] for s in ("attn_scores", "attn_out", "resid_attn",
                                              "mlp_preact", "mlp_out", "resid_mlp")),
               LEGACY_RESIDUAL, schema.SITE_WORDS["logits"], schema.SITE_WORDS["embedding"],
               schema.SITE_WORDS["backward"], "not located")


def is_sweep(loaded: runs_lib.Runs) -> bool:
  """Whether the runs below a directory vary the learning rate (a sensitivity sweep)."""
  lrs = {facts.info.point.get(LR) for facts in loaded.runs.values()}
  return len(lrs - {None}) > 1


def _max_finite(values) -> float:
  values = np.asarray(values, dtype=float)
  values = values[np.isfinite(values)]
  return float(values.max()) if values.size else np.nan


def _group_of(point: dict) -> str:
  """The sweep's other axes (not learning rate, not seed) as text: "" or "layers=12"."""
  rest = {k: v for k, v in point.items() if k not in (LR, SEED)}
  return names.point_label(rest)


def death_kind(site) -> str:
  """The kind of place a run first went non-finite, from run.json's `nonfinite_site`: the words
  of its site id ({"layer": 3, "site": "resid_attn"} -> "residual stream after attention"; an
  older run.json's words are taken as they are); "not located" without one."""
  if not isinstance(site, dict):
    return "not located"
  kind = schema.SITE_WORDS.get(site.get("site"), site.get("site"))
  return kind if kind in DEATH_KINDS else "not located"


def death_layer(site):
  """The layer index of run.json's `nonfinite_site`, or None."""
  return site.get("layer") if isinstance(site, dict) else None


def table(loaded: runs_lib.Runs, summary: pd.DataFrame) -> pd.DataFrame:
  """One row per run of the sweep: run, arm, arm_label, group, learning_rate, seed, status,
  final_eval_loss, loss_init (its first recorded train loss: the loss at initialisation),
  effective_loss (final eval loss, or loss_init if the run failed), max_attn_logit (over layers
  and telemetry steps; NaN without telemetry), nonfinite_at, halt_reason, entropy_floor,
  dtype, and by the failure rule (normstudy.records.outcomes) its outcome, the step it did not
  recover from and its recoveries."""
  status = dict(zip(summary.run, summary.status))
  rows = []
  for run, facts in loaded.runs.items():
    info = facts.info
    if LR not in info.point:
      continue
    loss = loaded.series(run, "loss")
    eval_loss = loaded.series(run, "eval_loss")
    final = float(eval_loss.iloc[-1]) if len(eval_loss) else np.nan
    init = float(loss.iloc[0]) if len(loss) else np.nan
    failed = status.get(run) in FAILED or not np.isfinite(final)
    logits = loaded.layer_values(run, "attn_logit_max").to_numpy().ravel()
    rows.append({
        "run": run, "arm": info.arm or run, "arm_label": facts.arm_label,
        "group": _group_of(info.point), "learning_rate": float(info.point[LR]),
        "seed": info.point.get(SEED), "status": status.get(run, facts.status),
        "final_eval_loss": final, "loss_init": init,
        "effective_loss": init if failed else min(final, init),
        "max_attn_logit": _max_finite(logits), "nonfinite_at": info.nonfinite_at,
        "nonfinite_kind": death_kind(info.nonfinite_site),
        "nonfinite_layer": death_layer(info.nonfinite_site),
        "halt_reason": info.halt_reason, "entropy_floor": info.entropy_floor,
        "unigram_entropy": info.unigram_entropy,
        "floor": facts.floor,
        "dtype": facts.dtype,
        "outcome": facts.outcome.kind, "failed_at": facts.outcome.failed_at,
        "recoveries": facts.outcome.recoveries,
    })
  return pd.DataFrame(rows, columns=[
      "run", "arm", "arm_label", "group", "learning_rate", "seed", "status", "final_eval_loss",
      "loss_init", "effective_loss", "max_attn_logit", "nonfinite_at", "nonfinite_kind",
      "nonfinite_layer", "halt_reason",
      "entropy_floor", "unigram_entropy", "floor", "dtype", "outcome", "failed_at",
      "recoveries"])


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
        "halted": int((curve.status == schema.HALTED).sum()),
        "diverged": int((curve.status == schema.DIVERGED).sum()),
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
              "runs": len(at_lr), "halted": int((at_lr.status == schema.HALTED).sum()),
              "diverged": int((at_lr.status == schema.DIVERGED).sum())}
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


def per_seed_sensitivity(curve: pd.DataFrame, loss_init: float) -> list:
  """The LR sensitivity of each seed's own curve (seeds that ran the whole grid)."""
  lrs = curve.learning_rate.nunique()
  return [lr_sensitivity(rows.learning_rate, rows.effective_loss, loss_init)["lr_sensitivity"]
          for _, rows in curve.groupby("seed") if rows.learning_rate.nunique() == lrs]


def _ranking(runs, arms, group, threshold) -> list:
  """Sentences ranking the arms that learned by LR sensitivity, the two least sensitive
  compared by Welch's t-test over their seeds' values; arms that did not learn named apart."""
  learned = arms[arms.best_loss < threshold] if np.isfinite(threshold) else arms
  out = []
  head = f"With {group}: " if group else ""
  if np.isfinite(threshold):
    idle = arms[~arms.index.isin(learned.index)]
    if len(idle):
      out.append(head + "Did not learn in this grid (best final eval loss at or above "
                 f"{threshold:.3f}, halfway from the unigram entropy to the loss floor): "
                 + ", ".join(f"{r.label} ({r.best_loss:.3f})" for r in idle.itertuples())
                 + ". Their LR sensitivity measures when they die, not how well they train, "
                 "and is not ranked.")
  if learned.empty:
    return out
  ranked = learned.sort_values("lr_sensitivity")
  first = ranked.iloc[0]
  text = head + "LR sensitivity of the arms that learned: " + ", ".join(
      f"{r.label} {r.lr_sensitivity:.3f}" for r in ranked.itertuples()) + "."
  if len(ranked) > 1:
    second = ranked.iloc[1]
    seeds = [per_seed_sensitivity(runs[(runs.arm == r.arm) & (runs.group == group)],
                                  r.loss_init) for r in (first, second)]
    _, _, p = stats.welch(seeds[0], seeds[1])
    text += (f" {first.label} against {second.label} (per-seed sensitivities): "
             + stats.verdict("Welch's t-test", f"{len(seeds[0])} and {len(seeds[1])}", p) + ".")
  out.append(text)
  return out


def _bracketing(arms: pd.DataFrame, lrs) -> str:
  edge = arms[arms.best_lr.isin([min(lrs), max(lrs)])]
  if edge.empty:
    return ""
  return ("Optimum not bracketed: the best learning rate is at the grid's edge for "
          + ", ".join(f"{r.label} ({r.best_lr:g})" for r in edge.itertuples())
          + "; the grid does not show where their loss turns up again.")


def observations(runs: pd.DataFrame, by_arm: pd.DataFrame, died: pd.DataFrame) -> str:
  """Sentences with the numbers: the arms that learned ranked by LR sensitivity, with the test
  that compares the two least sensitive; the arms that did not learn; where each arm's best is
  and whether the grid brackets it; what kills each arm."""
  threshold = runs_lib.learning_threshold(runs)
  lrs = sorted(runs.learning_rate.unique())
  parts = [f"{len(runs)} runs: {len(lrs)} learning rates ({_lr_text(lrs[0])} to "
           f"{_lr_text(lrs[-1])}) x {runs.seed.nunique()} seed(s) per arm. LR sensitivity "
           "(Wortsman et al. 2023) is the mean over the grid of min(loss, loss at init) - best "
           "loss, with a halted or diverged run counted at its loss at init; lower is more "
           f"robust. A difference is claimed only at p < {stats.ALPHA}."]
  for group, arms in by_arm.groupby("group", sort=False):
    parts += _ranking(runs, arms, group, threshold)
    bracket = _bracketing(arms, lrs)
    if bracket:
      parts.append(bracket)
    for row in arms.sort_values("lr_sensitivity").itertuples():
      parts.append(_arm_line(runs, died, row))
  return "\n\n".join(parts)


def _arm_line(runs, died, row) -> str:
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
    reasons = failed.halt_reason.fillna(schema.DIVERGED).value_counts()
    line += "; halted by: " + ", ".join(f"{reason} ({count})"
                                         for reason, count in reasons.items())
  return line + "."
