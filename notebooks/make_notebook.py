"""Writes compare_runs.ipynb from the cells below (edit here, then run: python make_notebook.py)."""

import os

import nbformat

CELLS = [
    ("markdown", """# normstudy: compare runs

The comparison figure, the summary table, the generated observations, the per-layer telemetry,
and an overlay of any metrics you pick. Point `WORKDIR` at a study or sweep directory (local or
`gs://`)."""),
    ("code", """# In Colab: install normstudy's analysis without touching Colab's own jax and TensorFlow
# (`--no-deps`: the analysis needs numpy, pandas, scipy and matplotlib, which Colab has, and
# ml-collections and absl-py, which it installs here).
# Elsewhere, install it with `pip install -e .` from a checkout.
import os
import sys

NORMSTUDY_REPO = os.environ.get("NORMSTUDY_REPO", "")  # e.g. git+https://github.com/<you>/normstudy.git
IN_COLAB = "google.colab" in sys.modules
if IN_COLAB:
  if not NORMSTUDY_REPO:
    raise SystemExit("Set NORMSTUDY_REPO to the pip URL of your normstudy repository first.")
  get_ipython().run_line_magic("pip", f"install -q --no-deps {NORMSTUDY_REPO}")
  get_ipython().run_line_magic("pip", "install -q ml-collections absl-py")"""),
    ("code", """# Reading gs:// from Colab needs your Google credentials (skipped outside Colab).
if IN_COLAB:
  from google.colab import auth
  auth.authenticate_user()"""),
    ("code", """# Parameters: a directory written by `normstudy.study` or `normstudy.sweep` (local or gs://).
WORKDIR = os.environ.get("NORMSTUDY_WORKDIR", "runs/seed_figure")
SMOOTHING = 0.8  # EMA weight of the loss curves; 0 draws raw losses"""),
    ("code", """import tempfile

import matplotlib.pyplot as plt
from IPython.display import Image, Markdown, display

from normstudy import analysis

local = analysis.localize(WORKDIR)  # gs:// is copied (run files only, no checkpoints)
if not os.path.isdir(local):
  raise SystemExit(f"{WORKDIR} does not exist: run `make study` first, or set WORKDIR.")
loaded = analysis.load_runs(local)  # .table: run, label, step, metric, value; .runs: each run
if not len(loaded):
  raise SystemExit(f"{WORKDIR} holds no run with a metrics.jsonl yet.")
out = tempfile.mkdtemp(prefix="normstudy_nb_")
print(f"{len(loaded)} runs, {len(loaded.table)} values from {WORKDIR}")"""),
    ("markdown", "## Training Loss Comparison"),
    ("code", """display(Image(analysis.plot_comparison(loaded, os.path.join(out, "loss_comparison.png"),
                                      SMOOTHING)))"""),
    ("markdown", "## Summary"),
    ("code", """summary = analysis.summarize(loaded)
summary"""),
    ("markdown", "## Learning-rate sensitivity\n\nFor a sweep over "
                 "`optimizer.learning_rate`: final loss against learning rate per arm over seeds "
                 "(Wortsman et al. 2023), attention logits, and where halted runs died."),
    ("code", """if analysis.sensitivity.is_sweep(loaded):
  sweep_runs = analysis.sensitivity.table(loaded, summary)
  died = analysis.sensitivity.deaths(sweep_runs)
  display(analysis.sensitivity.summarize(sweep_runs))
  for path in analysis.sensitivity_plots.plot_all(sweep_runs, died, out).values():
    display(Image(path))
else:
  print("not a learning-rate sweep: no sensitivity analysis")"""),
    ("markdown", "## Observations"),
    ("code", """path = analysis.write_observations(loaded, summary, os.path.join(out, "observations.md"))
display(Markdown(open(path, encoding="utf-8").read()))"""),
    ("markdown", "## Per-layer telemetry"),
    ("code", """figures = analysis.plot_layers(loaded, out)
if not figures:
  print("no telemetry in these runs (set config.train.telemetry_every)")
for name, path in figures.items():
  display(Image(path))"""),
    ("markdown", "## Overlay runs and metrics"),
    ("code", """RUNS = loaded.names                   # pick a subset, e.g. RUNS = ["pre_norm_clip1"]
METRICS = ["loss", "grad_norm"]       # any of: sorted(loaded.table.metric.unique())
print("metrics available:",
      ", ".join(sorted(m for m in loaded.table.metric.unique() if "/" not in m)))

fig, axes = plt.subplots(len(METRICS), 1, figsize=(9, 3 * len(METRICS)), sharex=True,
                         squeeze=False)
for ax, metric in zip(axes[:, 0], METRICS):
  for run in RUNS:
    values = loaded.series(run, metric)
    ax.plot(values.index, values.values, label=loaded[run].label, linewidth=1)
  ax.set_ylabel(metric)
  ax.grid(alpha=0.3)
axes[0, 0].legend(fontsize=8)
axes[-1, 0].set_xlabel("Training Step")
plt.show()"""),
]


def build():
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown"
              else nbformat.v4.new_code_cell(src) for kind, src in CELLS]
  return nb


if __name__ == "__main__":
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare_runs.ipynb")
  nbformat.write(build(), path)
  print(f"wrote {path}")
