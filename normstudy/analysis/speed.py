"""Learning speed: how far and how fast each arm learns at one learning rate, over seeds.

For a sweep whose arms share one learning rate and vary the seed (`make speed`), per arm (and
value of the sweep's other axes):

  speed.csv   arm, label, group, runs, finished, final_eval_loss (mean over seeds) with its 95% t
              interval (final_eval_loss_low/high), threshold (eval loss), steps_to_threshold (the
              mean over seeds of the first eval step below it; reached: how many seeds got there),
              and against the reference arm (the first): the difference of final eval losses,
              its test, n, p and Holm-adjusted p over the group's arms, the sign test's count
              (seeds where the arm ends lower), n, p and Holm-adjusted p, the verdict (judged on
              the Holm-adjusted p of the t-test), and the eval set (eval_set)
  speed_tests.csv  every pair of arms in a group: the same tests, Holm over the pairs, and for a
              pair not separated the margin in nats two one-sided tests bound (`pairwise`)
  speed.png   eval loss against step, one line per seed, the reference lines (the unigram
              entropy, the Bayes-optimal masked loss or the entropy rate) and the threshold

Where every run of two arms was evaluated on the same rows and masks (config.train.eval_seed, the
same for all: normstudy.data.batches.eval_mask_seed), seeds pair the arms' runs and the tests are
the paired t-test and the sign test over the seeds both arms finished; where each seed had its
own eval set (eval_seed -1, and every run before the field existed), the runs of two arms saw
different data, so the comparison is Welch's t-test and the table says so.

The threshold defaults to halfway from the unigram entropy (a model that uses no context) to the
loss floor (the masked loss floor for encoders, the entropy rate for causal models).
"""

import itertools
import os

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.records import names
from normstudy.records import schema

PAIRED = "paired t-test"
UNPAIRED = "Welch's t-test"
SIGN = "sign test"


def is_speed_sweep(loaded: runs_lib.Runs) -> bool:
  """Whether the runs are a sweep of seeds (at one learning rate): some arm has runs of at least
  two seeds."""
  seeds = {}
  for facts in loaded.runs.values():
    point = facts.info.point
    if "train.seed" in point:
      seeds.setdefault(facts.info.arm, set()).add(point["train.seed"])
  return any(len(s) > 1 for s in seeds.values())


def run_table(loaded: runs_lib.Runs, summary: pd.DataFrame) -> pd.DataFrame:
  """One row per run: run, arm, arm_label, group (the point's axes other than the seed), seed,
  status, final eval loss, and the run's reference losses."""
  status = dict(zip(summary.run, summary.status))
  common = common_step(loaded, status)
  rows = []
  for run, facts in loaded.runs.items():
    point = facts.info.point
    eval_loss = loaded.series(run, "eval_loss")
    if common is not None and status.get(run) not in schema.FAILED:
      eval_loss = eval_loss.loc[:common]  # unfinished runs: all compared where all have been
    rest = {k: v for k, v in point.items() if k != "train.seed"}
    rows.append({
        "run": run, "arm": facts.info.arm or run, "arm_label": facts.arm_label,
        "group": names.point_label(rest),
        "seed": point.get("train.seed"), "status": status.get(run),
        "eval_seed": facts.eval_seed, "eval_rows": facts.eval_rows,
        "final_eval_loss": float(eval_loss.iloc[-1]) if len(eval_loss) else np.nan,
        "unigram_entropy": facts.info.unigram_entropy, "floor": facts.floor})
  table_ = pd.DataFrame(rows)
  table_.attrs["common_step"] = common
  return table_


UNFINISHED = (schema.RUNNING, schema.PREEMPTED)


def common_step(loaded: runs_lib.Runs, status: dict):
  """None when every run ended (finished, halted or diverged); else the last evaluated step
  every run that has not failed reached: a stopped study's runs stop at different steps, and
  their final eval losses are no comparison (Pre-LN at step 200 against DeepNorm at 400)."""
  if not any(status.get(run) in UNFINISHED for run in loaded.runs):
    return None
  ends = [int(series.index[-1]) for run in loaded.runs
          if status.get(run) not in schema.FAILED
          and len(series := loaded.series(run, "eval_loss"))]
  return min(ends) if ends else None


def first_step_below(loaded: runs_lib.Runs, run: str, threshold: float):
  """The first eval step whose eval loss is below `threshold`, or None."""
  eval_loss = loaded.series(run, "eval_loss")
  below = eval_loss[eval_loss < threshold]
  return int(below.index[0]) if len(below) else None


def eval_set(rows: pd.DataFrame) -> str:
  """How the runs were evaluated: 'shared (512 rows, eval_seed 0)' when all on one set, else
  'each seed its own'."""
  seeds = set(rows.eval_seed)
  if len(seeds) == 1 and -1 not in seeds:
    return f"shared ({int(rows.eval_rows.iloc[0])} rows, eval_seed {seeds.pop()})"
  return "each seed its own"


def compare(rows: pd.DataFrame, reference: pd.DataFrame) -> dict:
  """An arm's final eval losses against the reference arm's: paired by seed (t-test and sign
  test over the seeds both have) when all their runs share one eval set, else Welch's."""
  both = pd.concat([rows, reference])
  mine = rows.dropna(subset=["final_eval_loss"]).set_index("seed").final_eval_loss
  theirs = reference.dropna(subset=["final_eval_loss"]).set_index("seed").final_eval_loss
  if eval_set(both).startswith("shared"):
    seeds = sorted(set(mine.index) & set(theirs.index))
    a, b = mine[seeds].to_numpy(), theirs[seeds].to_numpy()
    tested = stats.mean_difference(a, b, paired=True)
    lower, differ, sign_p = stats.sign_test(b, a)
    test, n = PAIRED, f"{len(seeds)} seeds"
  else:
    tested = stats.mean_difference(mine.to_numpy(), theirs.to_numpy(), paired=False)
    lower = differ = sign_p = np.nan
    test, n = UNPAIRED, f"{len(mine)} and {len(theirs)}"
  return {"difference": tested["difference"], "test": test, "n": n, "p": tested["p"],
          "sign_lower": lower, "sign_n": differ, "sign_p": sign_p, "eval_set": eval_set(both),
          "se": tested["se"], "df": tested["df"]}


def table(loaded: runs_lib.Runs, runs: pd.DataFrame, threshold: float | None = None
          ) -> pd.DataFrame:
  """The speed table described in the module's docstring; the reference arm is each group's
  first, and each group's comparisons with it are one family for Holm's correction."""
  threshold = runs_lib.learning_threshold(runs) if threshold is None else threshold
  out = []
  for group, in_group in runs.groupby("group", sort=False):
    reference, family = None, []
    for arm, rows in in_group.groupby("arm", sort=False):
      finals = rows.final_eval_loss.dropna().to_numpy()
      mean, low, high = stats.mean_interval(finals)
      steps = [first_step_below(loaded, run, threshold) for run in rows.run]
      reached = [s for s in steps if s is not None]
      row = {"arm": arm, "label": rows.arm_label.iloc[0] + (f", {group}" if group else ""),
             "group": group, "runs": len(rows),
             "finished": int((rows.status == schema.FINISHED).sum()),
             "final_eval_loss": mean, "final_eval_loss_low": low, "final_eval_loss_high": high,
             "threshold": threshold, "reached": len(reached),
             "steps_to_threshold": float(np.mean(reached)) if reached else np.nan}
      if reference is None:
        reference = (row["label"], rows)
        row.update(reference_arm=row["label"], difference=0.0, test="", n="", p=np.nan,
                   p_holm=np.nan, sign_lower=np.nan, sign_n=np.nan, sign_p=np.nan,
                   sign_p_holm=np.nan, verdict="reference", eval_set=eval_set(rows))
      else:
        compared = compare(rows, reference[1])
        compared.pop("se"), compared.pop("df")
        row.update(reference_arm=reference[0], **compared)
        family.append(row)
      out.append(row)
    _holm(family)
    for row in family:
      row["verdict"] = stats.verdict_holm(row["test"], row["n"], row["p"], row["p_holm"])
  return pd.DataFrame(out)


def _holm(family: list) -> None:
  """Adds p_holm and sign_p_holm to each row of a family of comparisons (Holm over the family,
  for the t-test and the sign test apart)."""
  for key in ("p", "sign_p"):
    for row, adjusted in zip(family, stats.holm([r[key] for r in family])):
      row[f"{key}_holm"] = adjusted


def pairwise(runs: pd.DataFrame) -> pd.DataFrame:
  """Every pair of arms in a group (speed_tests.csv): `compare`'s test of arm_a's final eval
  losses against arm_b's (difference a - b in nats), Holm's correction over the group's pairs for
  the t-test and for the sign test, and for each pair the t-test does not separate the margin in
  nats within which two one-sided tests put the two at 95% (stats.equivalence_margin)."""
  out = []
  for group, in_group in runs.groupby("group", sort=False):
    arms = list(dict.fromkeys(in_group.arm))
    family = []
    for arm_a, arm_b in itertools.combinations(arms, 2):
      compared = compare(in_group[in_group.arm == arm_a], in_group[in_group.arm == arm_b])
      se, df = compared.pop("se"), compared.pop("df")
      family.append({"group": group, "arm_a": arm_a, "arm_b": arm_b, **compared,
                     "equivalence_margin": stats.equivalence_margin(
                         compared["difference"], se, df)})
    _holm(family)
    for row in family:
      row["separated"] = bool(row["p_holm"] < stats.ALPHA)
      if row["separated"]:  # a margin is what "not separated" bounds
        row["equivalence_margin"] = np.nan
    out += family
  return pd.DataFrame(out, columns=[
      "group", "arm_a", "arm_b", "test", "n", "difference", "p", "p_holm", "sign_lower",
      "sign_n", "sign_p", "sign_p_holm", "separated", "equivalence_margin", "eval_set"])


def pairwise_observations(pairs: pd.DataFrame) -> str:
  lines = []
  for row in pairs.itertuples():
    text = stats.verdict_holm(row.test, row.n, row.p, row.p_holm)
    margin = (f"; equivalent within {row.equivalence_margin:.3f} nats at 95% (two one-sided "
              "tests)" if np.isfinite(row.equivalence_margin) else "")
    lines.append(f"- {row.arm_a} against {row.arm_b}" + (f" ({row.group})" if row.group else "")
                 + f": {row.difference:+.3f} nats, {text}{margin}.")
  return "\n".join(lines)


def separations(pairs: pd.DataFrame) -> str:
  """The sentence that says which pairs of speed_tests.csv are separated (Holm p < ALPHA), with
  which arm ends lower, and how many are not: the README's sentence under the seed figure is
  this function of the committed CSV (tests/test_docs.py), so it cannot say "the rest not
  separated" while the CSV separates one of the rest."""
  said = []
  for row in pairs.itertuples():
    if row.separated in (True, "True"):
      lower, higher = (row.arm_a, row.arm_b) if row.difference < 0 else (row.arm_b, row.arm_a)
      where = f" in {row.group}" if isinstance(row.group, str) and row.group else ""
      said.append(f"`{lower}` ends below `{higher}`{where} (Holm p = "
                  f"{stats.format_p(row.p_holm)})")
  rest = len(pairs) - len(said)
  if not said:
    return f"none of the {rest} pairs separated"
  return "; ".join(said) + (f"; the other {rest} pair{'s' * (rest != 1)} not separated"
                            if rest else "")


def observations(speed: pd.DataFrame) -> str:
  shared = speed.eval_set.str.startswith("shared").all()
  data = (f"every run was evaluated on the same eval set, {speed.eval_set.iloc[0]}, so arms "
          f"are compared paired by seed ({PAIRED}, and the {SIGN} over the seeds as a check "
          "that does not assume normal differences)" if shared else
          f"each seed was evaluated on its own eval set (runs with train.eval_seed = -1, or "
          f"from before the field existed), so arms are compared unpaired ({UNPAIRED}) and "
          "differences between the eval sets add to the seeds' spread")
  parts = [f"Learning speed: final eval loss per arm, mean over seeds with its 95% t interval; "
           f"{data}. Each arm is compared with the first (two-sided, Holm's correction over the "
           f"arms; a difference only at Holm-adjusted p < {stats.ALPHA}). Steps to threshold: "
           f"the first eval step below {speed.threshold.iloc[0]:.3f} nats (halfway from the "
           "unigram entropy to the loss floor), mean over the seeds that reached it."]
  for row in speed.itertuples():
    interval = (f"95% CI {row.final_eval_loss_low:.3f} to {row.final_eval_loss_high:.3f}, "
                f"{row.runs} runs" if np.isfinite([row.final_eval_loss_low,
                                                   row.final_eval_loss_high]).all()
                else f"{row.runs} run{'s' * (row.runs != 1)}: too few for an interval")
    line = (f"{row.label}: {row.final_eval_loss:.3f} nats ({interval}); reached the threshold in "
            f"{row.reached} of {row.runs}"
            + (f", at step {row.steps_to_threshold:.0f} on average" if row.reached else ""))
    if row.verdict != "reference":
      line += (f"; against {row.reference_arm}: {row.difference:+.3f} nats, "
               f"{row.verdict}")
      if np.isfinite(row.sign_p):
        line += (f"; lower in {row.sign_lower:.0f} of {row.sign_n:.0f} seeds with unequal losses "
                 f"({SIGN}, p = {stats.format_p(row.sign_p)}, Holm-adjusted p = "
                 f"{stats.format_p(row.sign_p_holm)})")
    parts.append(line + ".")
  return "\n\n".join(parts)


def figure(loaded: runs_lib.Runs, runs: pd.DataFrame, threshold: float):
  """Eval loss against step, one colour per arm, one line per seed; reference lines labelled."""
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  fig = Figure(figsize=(8.5, 5.2), layout="constrained")
  ax = fig.subplots()
  for i, (arm, rows) in enumerate(runs.groupby("arm", sort=False)):
    look = style(i)
    for j, run in enumerate(rows.run):
      series = loaded.series(run, "eval_loss")
      ax.plot(series.index, series.to_numpy(), color=look["color"], linestyle=look["linestyle"],
              marker="o", markersize=2.5, linewidth=1,
              label=rows.arm_label.iloc[0] if j == 0 else None)
  draw_reference_lines(ax, runs.unigram_entropy.dropna(), runs.floor.dropna(), threshold)
  ax.set_xlabel("step")
  ax.set_ylabel("eval loss (nats per predicted token)")
  ax.set_title("Learning speed: eval loss of every seed")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return fig


def draw_reference_lines(ax, unigram, floor, threshold=np.nan):
  """The unigram entropy, the loss floor and the threshold, each labelled."""
  if len(unigram):
    ax.axhline(unigram.iloc[0], color="gray", linestyle="--", linewidth=0.8,
               label=f"unigram entropy H(pi) {unigram.iloc[0]:.3f} (no context)")
  if len(floor):
    ax.axhline(floor.iloc[0], color="black", linestyle="--", linewidth=0.8,
               label=f"loss floor {floor.iloc[0]:.3f}")
  if np.isfinite(threshold):
    ax.axhline(threshold, color="gray", linestyle=":", linewidth=0.8,
               label=f"threshold {threshold:.3f}")


def analyze(loaded: runs_lib.Runs, summary: pd.DataFrame, workdir: str) -> tuple[dict, str]:
  """Writes speed.csv and speed.png (+ .svg); returns (paths, observations)."""
  from normstudy.analysis.plots import save
  runs = run_table(loaded, summary)
  speed = table(loaded, runs)
  pairs = pairwise(runs)
  outputs = {"speed": os.path.join(workdir, "speed.csv"),
             "speed_tests": os.path.join(workdir, "speed_tests.csv")}
  speed.to_csv(outputs["speed"], index=False)
  pairs.to_csv(outputs["speed_tests"], index=False)
  outputs["speed_figure"] = save(figure(loaded, runs, speed.threshold.iloc[0]),
                                 os.path.join(workdir, "speed.png"))
  text = observations(speed)
  if runs.attrs.get("common_step") is not None:
    stopped = sorted(r.run for r in runs.itertuples() if r.status in UNFINISHED)
    text = (f"Unfinished: {len(stopped)} of {len(runs)} runs ({', '.join(stopped[:6])}"
            f"{', ...' if len(stopped) > 6 else ''}) stopped before their last step; every run "
            f"is compared at step {runs.attrs['common_step']}, the last evaluation all of them "
            "reached (failed runs at their end).\n\n" + text)
  if len(pairs):
    text += ("\n\nEvery pair of arms (speed_tests.csv; Holm's correction over the pairs):\n\n"
             + pairwise_observations(pairs))
  return outputs, text
