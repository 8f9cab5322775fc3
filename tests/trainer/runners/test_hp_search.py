"""FederatedTrainer.hyperparameter_search (optuna): each trial a federated run in its own folder with the trial's
FederatedConfig values (the algorithm among them), the objective reported at evaluation rounds (pruning there), an
SQLite study resumed by a second call, and the backends and process layouts it refuses."""

from __future__ import annotations

import json
import os

import optuna
import pytest

from fedhf import FederatedTrainer
from fedhf.metrics import accuracy_metrics
from fedhf.trainer.runners.hp_search import TRIAL_FOLDER

from tests.helpers import config, tiny_resnet


def _search_trainer(digits, tmp_path, **overrides):
    args = config(tmp_path, num_rounds=2, local_steps=1, per_device_train_batch_size=8, eval_every_rounds=1,
                  **overrides)
    return FederatedTrainer(model_init=lambda trial=None: tiny_resnet(), args=args, train_dataset=digits["train"],
                            eval_dataset=digits["test"].select(range(40)), compute_metrics=accuracy_metrics)


def _space(trial):
    return {"algorithm": trial.suggest_categorical("algorithm", ["fedavg", "fedprox"]),
            "learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True)}


def test_a_resumed_sqlite_study_adds_trials_each_a_federated_run(digits, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    reported = []

    def objective(metrics):
        reported.append(metrics)
        return metrics["eval_loss"]

    for call in range(2):  # the second call: a new trainer, the same study (as after Ctrl-C and a restart)
        trainer = _search_trainer(digits, tmp_path)
        best = trainer.hyperparameter_search(hp_space=_space, compute_objective=objective, n_trials=2,
                                             direction="minimize", storage=storage, study_name="s",
                                             load_if_exists=True)
        assert best.hyperparameters.keys() == {"algorithm", "learning_rate"}
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    for t in study.trials:  # each trial its own run, with its values reaching the run's config
        folder = tmp_path / "run" / TRIAL_FOLDER.format(t.number)
        history = json.loads((folder / "federated_history.json").read_text())
        evaluated = [h for h in history if "eval_loss" in h]
        assert [h["round"] for h in evaluated] == [1, 2]
        assert t.intermediate_values == {1: evaluated[0]["eval_loss"], 2: evaluated[1]["eval_loss"]}
        assert t.value == evaluated[-1]["eval_loss"]
        assert history[0]["learning_rate"] <= t.params["learning_rate"] * (1 + 1e-9)  # the trial's peak lr
    assert len(reported) == 8 and all("train_loss" not in m for m in reported)  # evaluation metrics only


def test_the_algorithm_reaches_the_trial_trainer(digits, tmp_path):
    trainer = _search_trainer(digits, tmp_path)
    trainer.hyperparameter_search(hp_space=lambda trial: {"algorithm": "fedprox", "num_rounds": 1}, n_trials=1,
                                  compute_objective=lambda m: m["eval_loss"])
    assert trainer.trial_trainer.algorithm.name == "fedprox" and trainer.trial_trainer.args.num_rounds == 1
    assert trainer.trial_trainer.args.output_dir == os.path.join(trainer.args.output_dir, "trial-0")


def test_a_pruned_trial_stops_at_its_first_evaluation_round(digits, tmp_path):
    class PruneAll(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return True

    trainer = _search_trainer(digits, tmp_path)
    study_kwargs = {"pruner": PruneAll(), "study_name": "p", "storage": f"sqlite:///{tmp_path / 'p.db'}"}
    with pytest.raises(ValueError):  # optuna's best_trial of a study without a completed trial
        trainer.hyperparameter_search(hp_space=lambda trial: {}, n_trials=1, **study_kwargs)
    (t,) = optuna.load_study(study_name="p", storage=study_kwargs["storage"]).trials
    assert t.state == optuna.trial.TrialState.PRUNED and list(t.intermediate_values) == [1]


def test_ray_and_unknown_fields_are_refused(digits, tmp_path):
    trainer = _search_trainer(digits, tmp_path)
    with pytest.raises(ValueError, match="Ray Tune"):
        trainer.hyperparameter_search(hp_space=lambda trial: {}, backend="ray")
    with pytest.raises(ValueError, match="not FederatedConfig fields"):
        trainer.hyperparameter_search(hp_space=lambda trial: {"learning_rat": 0.1}, n_trials=1)


def test_the_default_space_sets_only_fields_a_federated_config_takes(tmp_path):
    """hp_space=None: Trainer's default would draw num_train_epochs, which a federated run refuses."""
    import optuna

    from fedhf.trainer.runners.hp_search import default_hp_space, trial_config
    from tests.helpers import config

    values = default_hp_space(optuna.trial.FixedTrial({"learning_rate": 3e-3, "seed": 7}))
    args = trial_config(config(tmp_path), values, 0)
    assert (args.learning_rate, args.seed) == (3e-3, 7) and args.output_dir.endswith("trial-0")
