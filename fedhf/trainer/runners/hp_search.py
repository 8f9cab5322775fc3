"""``FederatedTrainer.hyperparameter_search``: Trainer's search, each trial a federated run of its own.

Trainer's optuna search calls ``train(trial=trial)`` once per trial on the same trainer, after setting the trial's
values on ``args`` one attribute at a time. A federated trainer is built from its config -- the algorithm, the
client split, the sharing plan, the runner -- so values set afterwards would not reach it, and every trial would
write into the same ``output_dir`` (the second is refused there as "an earlier federated run"). Here each trial is
a fresh trainer of the same class, built with the arguments the searching trainer was built with, except:

* ``args``: the searching config with the values ``hp_space(trial)`` returns (any FederatedConfig field, the
  algorithm and its kwargs among them; the config validates them as it validates any config) and ``output_dir``
  ``<output_dir>/trial-<trial.number>`` (optuna numbers a study's trials once, so a resumed study writes new
  folders); ``run_name`` from ``hp_name(trial)`` when given;
* the model: ``model_init(trial)`` (or ``model_init()``), a new model per trial, as Trainer does.

At every evaluation round the trial trainer reports the objective (``compute_objective`` of the evaluation's
metrics) to optuna at that round, and optuna's pruner may stop the trial there (``optuna.TrialPruned``). What the
trial returns is the objective of its last evaluation (an evaluation after the last round when none ran). The
keyword arguments reach ``optuna.create_study`` as under Trainer, so ``storage="sqlite:///study.db"``,
``study_name`` and ``load_if_exists=True`` resume a stored study: a second call adds its trials to the first's.

Refused before any trial: the ray backend (Ray Tune runs each trial in a worker process of its own, which would
have to rebuild the trainer, its datasets and its model_init there; fedhf does not ship them), and more than one
process (client_parallel, FSDP or any torchrun world: Trainer hands the other processes only the trial's values,
and a federated trial needs every process to build the same trial trainer; run the search in one process and train
the chosen config after).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict

from transformers.trainer_utils import HPSearchBackend

TRIAL_FOLDER = "trial-{}"


def check_search(trainer, backend) -> None:
    """Refuse what a federated search cannot do, before any trial (the module docstring says why)."""
    if backend is not None and HPSearchBackend(backend) != HPSearchBackend.OPTUNA:
        raise ValueError(
            f"hyperparameter_search(backend={HPSearchBackend(backend).value!r}) is not supported for federated runs: "
            "Ray Tune (and W&B sweeps) run each trial in a worker process that would have to rebuild the trainer, "
            "its datasets and model_init there, which fedhf does not ship. Use backend='optuna' (pip install "
            "'fedhf[tune]').")
    if trainer.world.size > 1 or trainer.args.client_parallel:
        raise ValueError(
            "hyperparameter_search runs in one process: under client_parallel (or any multi-process run) optuna's "
            "study lives on process 0 and Trainer sends the other processes only the trial's values, while each "
            "federated trial builds a trainer of its own on every process. Search in one process "
            "(client_parallel=False, no torchrun), then train the chosen config under client_parallel.")
    if trainer.model_init is None:
        raise RuntimeError("To use hyperparameter search, pass the model through `model_init` (a function returning "
                           "a fresh model, optionally taking the trial): every trial trains a new one.")


def default_hp_space(trial) -> Dict[str, Any]:
    """The search space when ``hp_space`` is None. Trainer's default also draws ``num_train_epochs``, which a
    federated run refuses (its length is ``num_rounds``), and an lr range (1e-6 to 1e-4) below every algorithm's
    default: here the local learning rate over the algorithms' range and the seed."""
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-1, log=True),
            "seed": trial.suggest_int("seed", 1, 40)}


def trial_config(args, values: Dict[str, Any], number: int, run_name=None):
    """The searching config with the trial's values and its own output folder (validated as a new config)."""
    fields = {f.name for f in dataclasses.fields(args) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"hp_space returned {unknown}, which are not {type(args).__name__} fields.")
    changes = {**values, "output_dir": os.path.join(args.output_dir, TRIAL_FOLDER.format(number))}
    if run_name is not None:
        changes["run_name"] = run_name
    return dataclasses.replace(args, **changes)  # a new config: its __post_init__ checks the values


def run_trial(trainer, trial):
    """One trial: a fresh trainer of the searching trainer's class, its federated run, and its objective
    (set on the searching trainer, where Trainer's optuna loop reads it)."""
    values = trainer.hp_space(trial)
    run_name = trainer.hp_name(trial) if trainer.hp_name is not None else None
    args = trial_config(trainer.args, values, trial.number, run_name)
    positional, keywords = trainer.construction
    keywords = {k: v for k, v in keywords.items() if k != "model_init"}
    trial_trainer = type(trainer)(trainer.call_model_init(trial), args, *positional, **keywords)
    trial_trainer.hp_search_backend = HPSearchBackend.OPTUNA
    trial_trainer.compute_objective = trainer.compute_objective
    trial_trainer.search_trial = trial
    trial_trainer.objective = None
    output = trial_trainer.train()
    if trial_trainer.objective is None:  # no evaluation round: evaluate the final model once
        trial_trainer.objective = trainer.compute_objective(trial_trainer.evaluate())
    trainer.objective = trial_trainer.objective
    trainer.trial_trainer = trial_trainer  # the last trial's trainer (its model, history, output folder)
    return output
