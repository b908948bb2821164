"""Skip-step and update clipping on runs that spike and then fail (`make spike-failure`; issue 43,
item 4: do they change time to failure?).

`make spike-handling` (configs/spike_handling.py) asked it of the recipe's runs, which spike and
recover: none of them failed, so time to failure could not be compared. Here the same runs (the
seed figure's Pre-LN clip 1 on Shakespeare's plays, float16 with fairseq's loss scaler) hold their
learning rate: a warm-up of WARMUP steps, then constant (the survival instrument's schedule,
configs/survival.py), for NUM_STEPS steps, at LEARNING_RATES, placed by a pilot (docs/results.md)
where most baseline runs spike and then fail within the horizon; SEEDS seeds each. Arms as in
configs/spike_handling.py: the baseline; skip-step at OLMo-core's 6 sigma over a 128-step window
(`optimizer.skip_spikes=6`); update clipping at Adafactor's RMS 1 (`optimizer.update_clip=1`).
Each technique is compared with the baseline on the runs of the same rate and seed (same data
order, same initialisation) by FAILURE_MEASURES (normstudy.analysis.techniques_report): the steps each
run lasted, a survivor counted to its end (the restricted mean time to failure), whether it
failed, the time to failure of pairs where both failed, the loss spikes and skip-step's withheld
updates, each with an exact paired permutation test and Holm over the family: `python -m
normstudy.techniques --workdir=DIR --config=configs/spike_failure.py` writes spike_handling.csv.
"""

import dataclasses

from configs import spike_handling

NUM_STEPS = 600
WARMUP = 20
# A pilot (baseline, seeds 0-1, 600 steps; docs/results.md): at 0.01-0.04 every run spikes
# (7-9 nats above trend at 0.02-0.04) and recovers; at 0.08 both spike at step 11 and one halts
# at step 390 (the loss scale at its floor). So 0.08 and twice it.
LEARNING_RATES = [0.08, 0.16]
SEEDS = [0, 1, 2, 3, 4, 5]
# Every step logged (spikes are read from the per-step loss), evaluated at the end, no telemetry.
EXPERIMENT = dataclasses.replace(
    spike_handling.EXPERIMENT,
    axes={"optimizer.learning_rate": LEARNING_RATES, "train.seed": SEEDS},
    settings={**spike_handling.EXPERIMENT.settings, "train.num_steps": NUM_STEPS,
              "train.eval_every": NUM_STEPS, "train.checkpoint_every": NUM_STEPS,
              "optimizer.warmup_steps": WARMUP, "optimizer.schedule": "constant"},
    # the baselines and handlers of spike_handling, judged by time to failure
    techniques=dataclasses.replace(spike_handling.EXPERIMENT.techniques, measures="failure"))

get_config = EXPERIMENT.get_config
