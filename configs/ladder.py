"""The size ladder on real text: how each arm's critical learning rate moves with width and depth
(`make ladder`: `python -m normstudy.ladder --config=configs/ladder.py` trains and analyses it).

Each rung is the survival instrument (configs/survival.py: fixed warm-up then a constant rate,
the fp16 loss scale starting at its equilibrium, the failure rule of normstudy.records.outcomes,
the critical learning rate by search and a logistic transition fitted to every probe) on
Shakespeare's plays as bytes (configs/shakespeare.py), at one model size (LADDER_RUNGS), in
each of LADDER_DTYPES.
Arms: the seed figure's Pre-LN clip 1, DeepNorm clip 1 and Pre-LN attention relax clip 1, and
DeepNorm's wiring control (Post-LN with the input norm: DeepNorm without its alpha and beta).

What `make ladder` trades for its hour on 2 cores (docs/results.md, "Does it transfer?"):
NUM_STEPS steps a run (survival's is 480: a shorter horizon puts the critical rate higher and
decides near-critical runs by whether their overflow comes first), SEEDS seeds a point, and a
search of 3 rounds and a probe round (LADDER_SEARCH), no telemetry.
"""

from configs import shakespeare
from configs import survival
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Ladder
from normstudy.core.experiment import Search

_ARMS = {name: survival.EXPERIMENT.arms[name] for name in (
    "pre_norm_clip1", "post_norm_deepnorm_clip1", "pre_norm_attn_relax_clip1",
    "post_norm_input_norm_clip1")}

NUM_STEPS = 120
SEEDS = [0, 1]
HEAD_DIM = 16  # heads stay 16 wide (the miniature's 64 / 4), the MLP 4x the width
# The rungs, (num_layers, d_model): a width ladder at 4 layers and a depth ladder at width 32,
# sharing the rung 4 x 32. Each rung's largest member is the held-out test's (normstudy.ladder).
LADDER_RUNGS = [(4, 16), (4, 32), (4, 64), (4, 128), (2, 32), (8, 32), (16, 32)]
LADDER_DTYPES = ("float16", "float32")
# Round 1 checks that 0.03 survives and 3 fails, 2 more rounds halve the bracket (to half a
# decade), then a probe round 1/8 decade either side of each midpoint (normstudy.experiments.search).
LADDER_SEARCH = Search("optimizer.learning_rate", 0.03, 3.0, rounds=3, probe_decades=0.125)


def rung_overrides(num_layers: int, d_model: int) -> dict:
  """The fields one rung sets (what `make ladder` passes as --config.X=Y)."""
  return {"model.num_layers": num_layers, "model.d_model": d_model,
          "model.d_ff": 4 * d_model, "model.num_heads": max(1, d_model // HEAD_DIM)}


def base_config():
  """configs/shakespeare.py's recipe (the seed figure's on Shakespeare, as bytes)."""
  return shakespeare.base_config()


EXPERIMENT = Experiment(
    base=base_config, arms=_ARMS, axes={"train.seed": SEEDS},
    settings=survival.settings_at(NUM_STEPS),
    ladder=Ladder(rungs=LADDER_RUNGS, dtypes=LADDER_DTYPES, rung_overrides=rung_overrides,
                  search=LADDER_SEARCH))

get_config = EXPERIMENT.get_config
