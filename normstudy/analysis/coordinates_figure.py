"""coordcheck.png: the coordinate check's curves (normstudy.experiments.coordinates), as the `mup`
package draws them: per parametrization (rows) and quantity (columns: a layer's output, its
change since initialisation), the RMS against width on log axes, one colour per layer, the last
step solid and the first dashed. Flat curves: the parametrization keeps the coordinates' scale as
the model widens."""

import numpy as np
import pandas as pd


def figure(table: pd.DataFrame):
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  parametrizations = list(dict.fromkeys(table.parametrization))
  quantities = ["output", "update"]
  last = int(table.step.max())
  fig = Figure(figsize=(9, 3.2 * len(parametrizations)), layout="constrained")
  panels = np.atleast_2d(fig.subplots(len(parametrizations), 2, squeeze=False))
  layers = list(dict.fromkeys(table.layer))
  for row, name in zip(panels, parametrizations):
    for ax, quantity in zip(row, quantities):
      part = table[(table.parametrization == name) & (table.quantity == quantity)]
      for i, layer in enumerate(layers):
        look = style(i)
        for step, line in ((last, "-"), (1, "--")):
          points = part[(part.layer == layer) & (part.step == step)].sort_values("width")
          ax.plot(points.width, points.rms, line, color=look["color"], marker="o",
                  markersize=3, label=f"{layer}" if step == last else None)
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_xlabel("width (d_model)")
      ax.set_ylabel(f"RMS of the {quantity}")
      ax.set_title(f"{name}: {quantity} after step {last} (dashed: step 1)", fontsize=9)
      ax.grid(alpha=0.3)
  panels[0][0].legend(fontsize=6)
  fig.suptitle("Coordinate check: RMS against width")
  return fig
