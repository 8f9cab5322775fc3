"""The ``fedhf`` command: run a recipe, list the algorithms, or write a dataset's partition report.

    fedhf train --config recipes/X.yaml [--field value ...]   # --field: any FederatedConfig field
    fedhf algorithms
    fedhf partition --config recipes/X.yaml [--field value ...]

Recipes are described in :mod:`fedhf.recipes`. ``python -m fedhf`` is the same command.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedhf", description="Federated fine-tuning as a Hugging Face workflow.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "Train a recipe; --field value overrides a FederatedConfig field of its train:."),
                       ("partition", "Write partition.json/png of a recipe's data to output_dir, without training.")):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("--config", required=True, help="The recipe (YAML with model/lora/data/train sections).")
    commands.add_parser("algorithms", help="List the named algorithms and their four axes.")
    return parser


def algorithms_table() -> List[str]:
    """One row per named algorithm: its local optimizer, state sync, correction and server rule, and whether it
    survives secure aggregation (found by running its server halves on sums only: fedhf/trainer/secagg_check.py)."""
    from .algorithms import get_algorithm, list_algorithms
    from .trainer.secagg_check import secagg_compatibility

    rows = [("algorithm", "local optimizer", "state sync", "correction", "server rule", "secure aggregation")]
    for name in list_algorithms():
        algo = get_algorithm(name)
        rows.append((name, algo.local_optimizer.cls.__name__, algo.state_sync.name, algo.correction.name,
                     algo.server_rule.name, "yes" if secagg_compatibility(algo)[0] else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def train(config: str, overrides: List[str]) -> dict:
    """Run the recipe; returns the last history record (written to output_dir with the final model)."""
    import torch

    from . import FederatedTrainer
    from .recipes import TASKS, load_recipe, load_splits

    recipe = load_recipe(config)
    args = recipe.training_arguments(overrides)
    torch.manual_seed(args.seed)  # a fresh head's (or a model from a config's) initialisation follows the seed
    built = TASKS[recipe.model.task](recipe, load_splits(recipe.data, args.seed))
    trainer = FederatedTrainer(model=built.model, args=args, train_dataset=built.train_dataset,
                               eval_dataset=built.eval_dataset, data_collator=built.data_collator,
                               processing_class=built.processing_class, compute_metrics=built.compute_metrics,
                               callbacks=built.callbacks)
    trainer.train()
    trainer.save_model(os.path.join(args.output_dir, "final"))
    last = trainer.federated_history[-1]
    shown = ("eval_loss", "eval_accuracy", "eval_perplexity", "eval_generation_accuracy")
    summary = ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k in shown)
    print(f"round {last['round']}: {summary or 'no evaluation'} -- outputs in {args.output_dir}")
    return last


def partition(config: str, overrides: List[str]) -> List[str]:
    """Split the recipe's training data over its clients and write the report; loads no model."""
    from .data import partition_dataset, save_partition_report
    from .recipes import load_recipe, load_splits

    recipe = load_recipe(config)
    args = recipe.training_arguments(overrides)
    algorithm = args.built_algorithm()  # built (and checked) with the config, before the data is read
    _, report = partition_dataset(load_splits(recipe.data, args.seed)["train"], args)
    paths = save_partition_report({**report, "algorithm": algorithm.describe()}, args.output_dir)
    print("\n".join(paths))
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.command == "algorithms":
        if rest:
            parser.error(f"`fedhf algorithms` takes no arguments, got {rest}")
        print("\n".join(algorithms_table()))
    elif known.command == "train":
        train(known.config, rest)
    else:
        partition(known.config, rest)
    return 0
