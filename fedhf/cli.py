"""The ``fedhf`` command: run a recipe, list the algorithms, or write a dataset's partition report.

    fedhf train --config recipes/X.yaml [--field value ...] [--resume [PATH]]   # --field: a FederatedConfig field
    fedhf algorithms
    fedhf partition --config recipes/X.yaml [--field value ...]
    fedhf --version

Recipes are described in :mod:`fedhf.recipes`. ``python -m fedhf`` is the same command. An input error is one
line (``fedhf: error: ...``, exit status 2; ``--debug`` shows the traceback), before any work; Ctrl-C ends with
the last checkpoint and the command that resumes from it (exit status 130).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
from typing import List, Optional, Tuple, Union

INTERRUPTED = 130  # the shell's status for a run ended by SIGINT


class NetworkError(Exception):
    """The Hub could not be reached (push_to_hub's repository creation): fedhf's message, not a transport traceback."""


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose epilog is built only when its help is printed: the field list reads
    FederatedConfig, which imports transformers (seconds), and ``fedhf --help`` or a parse must not pay for it."""

    def __init__(self, *args, epilog_from=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.epilog_from = epilog_from

    def format_help(self) -> str:
        if self.epilog_from is not None:
            self.epilog = self.epilog_from()
        return super().format_help()


def _parser() -> argparse.ArgumentParser:
    from .trainer.config.field_help import fields_help
    from .version import __version__

    parser = argparse.ArgumentParser(prog="fedhf", allow_abbrev=False,
                                     description="Federated fine-tuning as a Hugging Face workflow. Add --debug to "
                                                 "any command to see the traceback of an error.")
    parser.add_argument("--version", action="version", version=f"fedhf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for name, text in (("train", "Train a recipe; --field value overrides a FederatedConfig field of its train:."),
                       ("partition", "Write partition.json/png of a recipe's data to output_dir, without training.")):
        sub = commands.add_parser(name, help=text, description=text, allow_abbrev=False,
                                  epilog_from=fields_help, formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--config", required=True, help="The recipe (YAML with model/lora/data/train sections).")
        if name == "train":
            sub.add_argument("--resume", nargs="?", const=True, default=None, metavar="PATH",
                             help="Resume from a checkpoint-N folder (default: the newest in output_dir); the "
                                  "run's checkpoints are kept, whatever overwrite_output_dir says.")
    commands.add_parser("algorithms", help="List the named algorithms and their four axes (names --algorithm, "
                                           "--local_optimizer, --state_sync, --correction, --server_rule accept).")
    return parser


def _registry_name(registry, component, keys=()) -> str:
    """The registry name that builds ``component``'s class (and the values its partial fixes): what the config
    accepts, rather than the component's display name."""
    for name in registry.names():
        factory = registry.get(name)
        fixed = getattr(factory, "keywords", {})
        if getattr(factory, "func", factory) is type(component) and all(
                getattr(component, k, None) == v for k, v in fixed.items()):
            return name
    raise LookupError(f"{type(component).__name__} is built by no {registry.kind} of the registry")


def _server_rule_name(rule) -> str:
    """``mean+lr`` -> ``mean``, ``mean+adam`` -> ``adam``, ``fedex_lora+lr`` -> ``fedex_lora``: SERVER_RULES' names."""
    aggregator, _, transform = rule.name.partition("+")
    return transform if aggregator == "mean" and transform not in ("lr", "") else aggregator


def default_lrs(algo) -> Tuple[str, str, str]:
    """The algorithm's default learning rates: the clients' (``learning_rate``), the one Muon's matrices step at
    (``learning_rate x muon_lr_mult``; "-" for other optimizers) and the server rule's step size(s)."""
    local = algo.local_optimizer
    matrices = local.lr * local.kwargs["muon_lr_mult"] if "muon_lr_mult" in local.kwargs else None
    server = [vars(t)["lr"] for t in algo.server_rule.transforms if "lr" in vars(t)]
    return f"{local.lr:g}", "-" if matrices is None else f"{matrices:g}", ",".join(f"{lr:g}" for lr in server)


def algorithms_table() -> List[str]:
    """One row per named algorithm: the registry names of its local optimizer, state sync, correction and server
    rule (each accepted by the same FederatedConfig field), its default learning rates, and whether it survives secure aggregation (found by
    running its server halves on sums only: fedhf/privacy/secagg_check.py)."""
    from .algorithms import get_algorithm, list_algorithms
    from .corrections import CORRECTIONS
    from .privacy.secagg_check import secagg_compatibility

    rows = [("algorithm", "local_optimizer", "state_sync", "correction", "server_rule", "lr", "muon_matrix_lr",
             "server_lr", "secure_aggregation")]
    for name in list_algorithms():
        algo = get_algorithm(name)
        rows.append((name, algo.local_optimizer.optimizer, algo.state_sync.name,
                     _registry_name(CORRECTIONS, algo.correction), _server_rule_name(algo.server_rule),
                     *default_lrs(algo), "yes" if secagg_compatibility(algo)[0] else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _recipe_arguments(config: str, overrides: List[str], ignored: Tuple[str, ...] = ()):
    """The recipe and its FederatedConfig, every ``--field`` checked first (exact names, "did you mean"); the
    recipe's ``ignored`` training keys are left at their defaults."""
    from .trainer.config.field_help import check_flags
    from .recipes import DataSection, ModelSection, load_recipe

    recipe = load_recipe(config)
    recipe = dataclasses.replace(recipe, train={k: v for k, v in recipe.train.items() if k not in ignored})
    sections = {"data": [f.name for f in dataclasses.fields(DataSection)],
                "model": [f.name for f in dataclasses.fields(ModelSection)]}
    problem = check_flags(overrides, sections)
    if problem:
        raise ValueError(problem)
    return recipe, recipe.training_arguments(overrides)


def _is_network_error(err: BaseException) -> bool:
    module = type(err).__module__.split(".")[0]
    return isinstance(err, ConnectionError) or module.startswith(("httpx", "httpcore", "requests", "urllib3"))


def _resume_hint(output_dir: str, command: List[str]) -> str:
    from .state.checkpoint import latest_checkpoint

    last = latest_checkpoint(output_dir)
    if last is None:
        return "no checkpoint was written (set --save_every_rounds N to make a run resumable)"
    return (f"last checkpoint {last}; resume with: {shlex.join([*command, '--resume'])}  "
            f"(Python: trainer.train(resume_from_checkpoint={last!r}))")


def train(config: str, overrides: List[str], resume: Union[str, bool, None] = None) -> dict:
    """Run the recipe (from a checkpoint with ``resume``: a path, or True for the newest in output_dir); returns
    the last history record (written to output_dir with the final model)."""
    import torch

    from . import FederatedTrainer
    from .recipes import TASKS, load_splits
    from .state.run import resolve_checkpoint

    recipe, args = _recipe_arguments(config, overrides)
    checkpoint = resolve_checkpoint(args.output_dir, resume)  # checked before the model and data load
    if checkpoint is not None and args.process_index == 0:  # every process resumes; one says so
        done = re.search(r"(\d+)$", os.path.normpath(checkpoint))
        print(f"resuming from {checkpoint} ({done.group(1) if done else '?'}/{args.num_rounds} rounds done)")
    torch.manual_seed(args.seed)  # a fresh head's (or a model from a config's) initialisation follows the seed
    built = TASKS[recipe.model.task](recipe, load_splits(recipe.data, args.seed))
    try:
        trainer = FederatedTrainer(model=built.model, args=args, train_dataset=built.train_dataset,
                                   eval_dataset=built.eval_dataset, data_collator=built.data_collator,
                                   processing_class=built.processing_class, compute_metrics=built.compute_metrics,
                                   callbacks=built.callbacks)
    except Exception as err:
        if args.push_to_hub and _is_network_error(err):
            raise NetworkError(
                f"push_to_hub=True could not reach the Hub to create {args.hub_model_id or 'the repository'} "
                f"({type(err).__name__}); nothing was written. Set --push_to_hub false to train offline "
                "(save_model writes the card and weights locally) and push later, or check the network.") from err
        raise
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except KeyboardInterrupt:
        command = ["fedhf", "train", "--config", config, *overrides]
        raise KeyboardInterrupt(f"interrupted; {_resume_hint(args.output_dir, command)}") from None
    trainer.save_model(os.path.join(args.output_dir, "final"))
    last = trainer.federated_history[-1]
    if trainer.is_world_process_zero():  # one line for the run, not one per process
        print(summary_line(last, args))
    return last


def summary_line(last: dict, args) -> str:
    """The run's last line: the final round's eval metrics, the privacy spent under DP, where the outputs are."""
    from .trainer.config.privacy_settings import dp_delta

    shown = ("eval_loss", "eval_accuracy", "eval_perplexity", "eval_generation_accuracy")
    parts = [", ".join(f"{k} {v:.4f}" for k, v in last.items() if k in shown) or "no evaluation"]
    if "dp_epsilon" in last:
        parts.append(f"epsilon {last['dp_epsilon']:.3g} at delta {dp_delta(args):.2g} (client-level DP)")
    return f"round {last['round']}: {'; '.join(parts)} -- outputs in {args.output_dir}"


def partition(config: str, overrides: List[str]) -> List[str]:
    """Split the recipe's training data over its clients and write the report; loads no model."""
    from .data import partition_dataset, save_partition_report
    from .recipes import load_splits

    # the split does not depend on how a launch shards the model, so a recipe written for an FSDP launch reports
    # from one process too
    recipe, args = _recipe_arguments(config, overrides, ignored=("fsdp", "fsdp_config"))
    algorithm = args.built_algorithm()  # built (and checked) with the config, before the data is read
    _, report = partition_dataset(load_splits(recipe.data, args.seed)["train"], args)
    paths = save_partition_report({**report, "algorithm": algorithm.describe()}, args.output_dir)
    print("\n".join(paths))
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = _parser()
    known, rest = parser.parse_known_args(argv)
    try:
        if known.command == "algorithms":
            if rest:
                parser.error(f"`fedhf algorithms` takes no arguments, got {rest}")
            print("\n".join(algorithms_table()))
        elif known.command == "train":
            train(known.config, rest, known.resume)
        else:
            partition(known.config, rest)
    except KeyboardInterrupt as err:
        if debug:
            raise
        print(f"fedhf: {err or 'interrupted'}", file=sys.stderr)
        return INTERRUPTED
    except (ValueError, OSError, argparse.ArgumentError, NetworkError) as err:
        if debug:
            raise
        print(f"fedhf: error: {err}", file=sys.stderr)
        return 2
    return 0
