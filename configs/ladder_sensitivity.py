"""Wortsman's learning-rate sensitivity on the ladder's rungs, on real text (`make
ladder-sensitivity`: `python -m normstudy.ladder --config=configs/ladder_sensitivity.py`).

Where configs/ladder.py asks at which learning rate each arm stops surviving, this file asks how
well each arm learns across the rates: at every rung, a grid of LADDER_LEARNING_RATES (from
under the recipe's optimum to past the cliff) x SEEDS, each run the seed figure's recipe on
Shakespeare's plays as bytes (configs/shakespeare.py: warm-up, then a polynomial decay to 0 at
the run's end, clip 1, the float16 loss scaler), trained NUM_STEPS steps and judged by its final
eval loss. normstudy.analysis.sensitivity then computes the LR sensitivity of Wortsman et al.
(2023, section 3.1) per arm, rung and seed, and normstudy.ladder collects it into
ladder_sensitivity.csv with intervals over seeds (normstudy.analysis.ladder_sensitivity).

What the hour on 2 cores buys (docs/results.md, "Does it transfer?"): the width ladder's three
narrowest rungs at 4 layers (the 128-wide rung costs as much as the other three together), the
study's dtype (float16; `--dtypes` adds none, `LADDER_DTYPES` is the one place to add float32),
3 seeds and 400-step runs (at 200 steps the 16-wide rung ends within 0.15 nats of the plays'
unigram entropy, at 400 the 64-wide rung's best runs are 0.5-0.8 nats below it), 7 learning
rates; no telemetry.
"""

from configs import ladder
from configs import seed_figure
from configs import shakespeare
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Ladder

NUM_STEPS = 400
SEEDS = [0, 1, 2]
LADDER_RUNGS = [(4, 16), (4, 32), (4, 64)]
LADDER_DTYPES = ("float16",)
# Half-decade steps from a decade under the recipe's 3e-3 (a pilot at 4 x 64 learned less at
# 3e-2 than at 3e-3) to 3e-1, past the 120-step critical rates of these rungs (0.1-0.5, make
# ladder), so each curve spans its optimum and its cliff.
LADDER_LEARNING_RATES = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]

# The sensitivity sweep's settings (configs/seed_figure.py) at NUM_STEPS, judged at the end.

def base_config():
  """configs/shakespeare.py's recipe: the seed figure's, on Shakespeare's plays as bytes."""
  return shakespeare.base_config()


EXPERIMENT = Experiment(base=base_config,
    arms=ladder.EXPERIMENT.arms, axes={"train.seed": SEEDS},
    settings={**seed_figure.EXPERIMENT.settings, "train.num_steps": NUM_STEPS,
              "optimizer.warmup_steps": NUM_STEPS // 10, "train.eval_every": NUM_STEPS,
              "train.checkpoint_every": NUM_STEPS, "train.telemetry_every": 0},
    ladder=Ladder(rungs=LADDER_RUNGS, dtypes=LADDER_DTYPES, rung_overrides=ladder.rung_overrides,
                  learning_rates=LADDER_LEARNING_RATES))

get_config = EXPERIMENT.get_config
