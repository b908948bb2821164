"""Failure as a drift: how long each arm lives at each learning rate (`make drift`).

`python -m normstudy.drift --config=configs/drift.py --workdir=DIR` trains and analyses it.

The survival instrument (configs/survival.py: WARMUP steps of warm-up, then a constant rate;
the fp16 loss scale starting at its equilibrium 2^15; the failure rule of
normstudy.records.outcomes), asked a different question: not "which rate fails by step H" for
one arbitrary H, but *when* a run fails at each rate. Every run gives its failure step or is
right-censored at its end, and an accelerated-failure-time law in log lr is fitted to them
(normstudy.analysis.law), from which the critical rate at any horizon follows, lr*(T).

  - the fit: every arm over LEARNING_RATES (1/6 decade apart, 0.0215 to 0.215: where plain
    Pre-LN's runs die between step ~100 and beyond 960), SEEDS seeds, NUM_STEPS = 960 steps;
  - telemetry every TELEMETRY_EVERY steps: the series that kills a run (the last layer's
    residual absmax for Pre-LN, crossing float16's 65,504) is read often enough that its
    log-slope is measured inside the first quarter of a run (normstudy.analysis.drift);
  - weight decay: plain Pre-LN also at weight decay 0 and 0.1 (the recipe's is 0.01,
    decoupled and multiplied by the rate as fairseq's Adam applies it), so that AdamW's
    timescale tau = 1/(lr x weight_decay) (Wang and Aitchison, ICML 2025) ranges from 200
    steps (lr 0.05, wd 0.1) to none;
  - the held-out horizon: HELDOUT_STEPS = 2 x NUM_STEPS, for HELDOUT_ARMS, at HELDOUT_SEEDS
    seeds and three rates chosen from the fitted law (where it predicts 20%, 50% and 80% of
    runs failing by HELDOUT_STEPS), predicted before they are trained (horizon_prediction.csv).
Arms: plain Pre-LN, Pre-LN with MERT's input LayerNorm, Post-LN with it (DeepNorm's wiring
control) and DeepNorm, all clip 1: the survival experiment's arms that separate DeepNorm's
parts.
"""

from configs import seed_figure
from configs import survival
from normstudy.core.experiment import Drift
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Heldout

# The law's arms, and plain Pre-LN at two more weight decays.
ARMS = ("pre_norm_clip1", "pre_norm_input_norm_clip1", "post_norm_input_norm_clip1",
        "post_norm_deepnorm_clip1")
DECAY_BASE = "pre_norm_clip1"  # the recipe's weight decay, 0.01
WEIGHT_DECAYS = {"pre_norm_clip1_wd0": 0.0, "pre_norm_clip1_wd0.1": 0.1}
_ARMS = {name: survival.EXPERIMENT.arms[name] for name in ARMS}
for _name, _decay in WEIGHT_DECAYS.items():
  _label, _settings = survival.EXPERIMENT.arms[DECAY_BASE]
  _ARMS[_name] = (f"{_label} | Weight Decay={_decay:g}",
                     {**_settings, "optimizer.weight_decay": _decay})

NUM_STEPS = 960
TELEMETRY_EVERY = 20
SEEDS = [0, 1, 2]
# 10^(-5/3) to 10^(-2/3), 1/6 decade apart.
LEARNING_RATES = [round(10 ** (e / 6), 6) for e in range(-10, -3)]

HELDOUT_STEPS = 2 * NUM_STEPS
HELDOUT_ARMS = ("pre_norm_clip1", "post_norm_deepnorm_clip1")
HELDOUT_SEEDS = [0, 1, 2]
# The failure fractions by HELDOUT_STEPS at which the held-out rates are placed.
HELDOUT_FRACTIONS = (0.2, 0.5, 0.8)

EXPERIMENT = Experiment(
    base=seed_figure.base_config, arms=_ARMS,
    axes={"optimizer.learning_rate": LEARNING_RATES, "train.seed": SEEDS},
    settings={**survival.EXPERIMENT.settings, "train.num_steps": NUM_STEPS,
              "train.eval_every": NUM_STEPS, "train.checkpoint_every": NUM_STEPS,
              "train.telemetry_every": TELEMETRY_EVERY},
    drift=Drift(law_arms=ARMS, decay_base=DECAY_BASE, weight_decays=WEIGHT_DECAYS,
                num_steps=NUM_STEPS,
                heldout=Heldout(arms=HELDOUT_ARMS, steps=HELDOUT_STEPS, seeds=HELDOUT_SEEDS,
                                fractions=HELDOUT_FRACTIONS)))

get_config = EXPERIMENT.get_config
