"""Every bad input fedhf refuses before work, as data: what is given, the field the message must name, and how
to build it. tests/trainer/test_bad_inputs.py runs each one (refused, field named, nothing written) and checks that
docs/bad_inputs.md is the table tests/trainer/bad_inputs_table.py generates from this list."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import datasets
import numpy as np
import torch
from transformers import TrainingArguments

from fedhf import FederatedTrainer

from tests.helpers import config, digit_trainer, tiny_resnet, tweet_trainer


@dataclass
class Bad:
    input: str  # what the user gave, in words
    field: str  # the setting or argument the message must name
    build: Callable  # env -> raises; env has tmp_path, digits, tweets, tokenizer, minilm
    error: type = ValueError


def _cfg(**kw):
    return lambda env: config(env["tmp_path"], **kw)


def _digits(**kw):
    return lambda env: digit_trainer(tiny_resnet(), env["digits"], config(env["tmp_path"], **kw))


def _with_train(transform, model=tiny_resnet, **kw):
    def build(env):
        data = {"train": transform(env["digits"]["train"]), "test": env["digits"]["test"]}
        return digit_trainer(model(), data, config(env["tmp_path"], **kw))
    return build


def _with_eval(transform, **kw):
    def build(env):
        data = {"train": env["digits"]["train"], "test": transform(env["digits"]["test"])}
        return digit_trainer(tiny_resnet(), data, config(env["tmp_path"], **kw))
    return build


def _output_dir_is_a_file(env):
    path = env["tmp_path"] / "run"
    path.write_text("not a folder")
    return config(env["tmp_path"])


def _string_labels(ds):
    return ds.cast_column("label", datasets.Value("int64")).cast_column("label", datasets.Value("string"))


def _none_in(column):
    def transform(ds):
        values = list(ds["label"])
        values[3] = None
        ds = ds.remove_columns("label") if column == "label" else ds
        return ds.add_column(column, values, feature=datasets.Value("int64"))
    return transform


def _untokenised(env):
    text = env["tweets"]["train"].remove_columns(["input_ids", "attention_mask", "token_type_ids"])
    from tests.helpers import lora_minilm
    return tweet_trainer(lora_minilm(env["minilm"]), {"train": text, "test": env["tweets"]["test"]},
                         env["tokenizer"], config(env["tmp_path"]))


def _lora_tweets(**kw):
    def build(env):
        from tests.helpers import lora_minilm
        return tweet_trainer(lora_minilm(env["minilm"]), env["tweets"], env["tokenizer"], config(env["tmp_path"], **kw))
    return build


def _frozen(env):
    model = tiny_resnet()
    model.requires_grad_(False)
    return digit_trainer(model, env["digits"], config(env["tmp_path"]))


def _plain_args(env):
    return FederatedTrainer(model=tiny_resnet(), args=TrainingArguments(output_dir=str(env["tmp_path"] / "run"),
                                                                        report_to="none"))


def _no_eval(callbacks=(), **kw):
    """A digits trainer without an eval_dataset (and, as a user would write it, without compute_metrics)."""
    def build(env):
        return FederatedTrainer(model=tiny_resnet(), args=config(env["tmp_path"], **kw),
                                train_dataset=env["digits"]["train"], callbacks=[c() for c in callbacks])
    return build


def _early_stopping():
    from transformers import EarlyStoppingCallback
    return EarlyStoppingCallback(1)


def _generation_eval():
    from fedhf.metrics import GenerationEvalCallback
    return GenerationEvalCallback(None)


def _renamed_classifier(env):
    """A classifier whose class name does not end in 'Classification' (a user's subclass): 10 digit classes for a
    head of 5."""
    from transformers import ResNetForImageClassification

    class DigitNet(ResNetForImageClassification):
        pass

    model = DigitNet(_resnet_with(5).config)
    return digit_trainer(model, env["digits"], config(env["tmp_path"]))


def _partitions(parts, key=None, **kw):
    return lambda env: digit_trainer(tiny_resnet(), env["digits"], config(env["tmp_path"], partition="iid", **kw),
                                     client_partitions=parts(len(env["digits"]["train"])), partition_key=key)


BAD_INPUTS = [
    # --- the federation and the split (FederatedConfig) ---
    Bad("`num_clients` = 0", "num_clients", _cfg(num_clients=0, clients_per_round=1)),
    Bad("`clients_per_round` = 0", "clients_per_round", _cfg(clients_per_round=0)),
    Bad("`clients_per_round` > `num_clients`", "clients_per_round", _cfg(num_clients=4, clients_per_round=5)),
    Bad("`num_rounds` = 0", "num_rounds", _cfg(num_rounds=0)),
    Bad("`local_steps` = 0", "local_steps", _cfg(local_steps=0)),
    Bad("`gradient_accumulation_steps` = 0", "gradient_accumulation_steps", _cfg(gradient_accumulation_steps=0)),
    Bad("`average_tokens_across_devices=True` (other processes' tokens belong to other clients)",
        "average_tokens_across_devices", _cfg(average_tokens_across_devices=True)),
    Bad("`dirichlet_alpha` <= 0", "dirichlet_alpha", _cfg(dirichlet_alpha=0.0)),
    Bad("`min_partition_size` < 1", "min_partition_size", _cfg(min_partition_size=0)),
    Bad("`partition_max_retries` < 1", "partition_max_retries", _cfg(partition_max_retries=0)),
    Bad("unknown `partition`", "partition", _cfg(partition="shards")),
    Bad("unknown `partition_key`", "partition_key", _cfg(partition_key="topic")),
    Bad("`partition_key_buckets` < 2", "partition_key_buckets", _cfg(partition_key_buckets=1)),
    Bad("`quantity_skew` < 0", "quantity_skew", _cfg(quantity_skew=-1.0)),
    Bad("`quantity_skew` with `partition='natural'` (its sizes are the data's)", "quantity_skew",
        _cfg(partition="natural", quantity_skew=1.0)),
    Bad("`client_eval_fraction` >= 1", "client_eval_fraction", _cfg(client_eval_fraction=1.0)),
    Bad("`partition_key='embedding'` without `partition_encoder`", "partition_encoder",
        _cfg(partition_key="embedding")),
    Bad("`partition_encoder` with a key that does not embed", "partition_encoder",
        _cfg(partition_key="length", partition_encoder="my-encoder")),
    Bad("`partition_encoder` that is not a local model folder", "partition_encoder",
        _cfg(partition_key="embedding", partition_encoder="sentence-transformers/all-MiniLM-L6-v2")),
    Bad("unknown `client_weighting`", "client_weighting", _cfg(client_weighting="by_loss")),
    Bad("unknown `round_lr_schedule`", "round_lr_schedule", _cfg(round_lr_schedule="linear")),
    Bad("`learning_rate` <= 0", "learning_rate", _cfg(learning_rate=-1.0)),
    Bad("`weight_decay` < 0", "weight_decay", _cfg(weight_decay=-0.1)),
    Bad("`max_update_norm` <= 0", "max_update_norm", _cfg(max_update_norm=0.0)),
    Bad("`max_excluded_rounds` < 0", "max_excluded_rounds", _cfg(max_excluded_rounds=-1)),
    Bad("`client_state_budget_mb` < 0", "client_state_budget_mb", _cfg(client_state_budget_mb=-1.0)),
    Bad("`eval_every_rounds` < 0", "eval_every_rounds", _cfg(eval_every_rounds=-1)),
    Bad("`save_every_rounds` < 0", "save_every_rounds", _cfg(save_every_rounds=-1)),
    # --- the algorithm ---
    Bad("unknown `algorithm`", "algorithm", _cfg(algorithm="fedsomething")),
    Bad("unknown `local_optimizer`", "local_optimizer", _cfg(local_optimizer="adamm")),
    Bad("unknown `correction`", "correction", _cfg(correction="magic")),
    Bad("unknown `server_rule`", "server_rule", _cfg(server_rule="krum")),
    Bad("unknown `state_sync`", "state_sync", _cfg(state_sync="sometimes")),
    Bad("an `algorithm_kwargs` key the algorithm does not take (the accepted keys are listed)", "algorithm_kwargs",
        _cfg(algorithm="fedprox", algorithm_kwargs={"nu": 0.1})),
    Bad("`algorithm_kwargs` that is not JSON", "algorithm_kwargs", _cfg(algorithm_kwargs="{not json")),
    Bad("`correction_kwargs` without `correction`", "correction_kwargs", _cfg(correction_kwargs={"mu": 0.1})),
    Bad("`server_rule='preconditioned_mix'` without FOOF", "local_optimizer", _cfg(server_rule="preconditioned_mix")),
    # --- TrainingArguments fields ---
    Bad("`learning_rate: 1e-3x` (a YAML string that is no number)", "learning_rate", _cfg(learning_rate="1e-3x")),
    Bad("`num_clients: '2.5'` (a YAML string that is no integer)", "num_clients", _cfg(num_clients="2.5")),
    Bad("`per_device_train_batch_size` = 0", "per_device_train_batch_size", _cfg(per_device_train_batch_size=0)),
    Bad("`per_device_eval_batch_size` = 0", "per_device_eval_batch_size", _cfg(per_device_eval_batch_size=0)),
    Bad("an `output_dir` that is a file", "output_dir", _output_dir_is_a_file),
    Bad("`max_steps` (the round loop counts rounds)", "max_steps", _cfg(max_steps=100)),
    Bad("`num_train_epochs` != its default", "num_train_epochs", _cfg(num_train_epochs=5)),
    Bad("`warmup_steps` > 0", "warmup_steps", _cfg(warmup_steps=10)),
    Bad("`adam_beta2` != its default", "adam_beta2", _cfg(adam_beta2=0.99)),
    Bad("`data_seed` set", "data_seed", _cfg(data_seed=3)),
    Bad("`save_strategy='best'`", "save_strategy", _cfg(save_strategy="best")),
    Bad("`save_steps` as a fraction of the run", "save_steps", _cfg(save_strategy="steps", save_steps=0.5)),
    Bad("`eval_steps` as a fraction of the run", "eval_steps", _cfg(eval_strategy="steps", eval_steps=0.25)),
    Bad("`logging_steps` as a fraction of the run", "logging_steps", _cfg(logging_strategy="steps", logging_steps=0.1)),
    Bad("`ddp_timeout` on a CPU run (transformers does not pass it to a CPU process group)", "ddp_timeout",
        _cfg(ddp_timeout=60)),
    Bad("`deepspeed` set", "deepspeed", _cfg(deepspeed="ds.json")),
    Bad("`fsdp=True` in a process that was not launched with others (python script.py)", "fsdp", _cfg(fsdp=True)),
    Bad("an `fsdp_config` key fedhf does not apply (`state_dict_type`)", "fsdp_config",
        _cfg(fsdp=True, fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"})),
    # --- the model and the data (FederatedTrainer) ---
    Bad("`args` that is a plain TrainingArguments", "args", _plain_args, TypeError),
    Bad("a model with no trainable parameters", "peft", _frozen),
    Bad("a streaming IterableDataset", "train_dataset",
        lambda env: digit_trainer(tiny_resnet(), {"train": env["digits"]["train"].to_iterable_dataset(),
                                                  "test": None}, config(env["tmp_path"]))),
    Bad("string labels", "class_encode_column", _with_train(_string_labels)),
    Bad("labels outside the model's `num_labels`", "num_labels", _with_train(lambda ds: ds.filter(lambda r: True),
        model=lambda: _resnet_with(num_labels=5))),
    Bad("labels outside `num_labels` for a classifier whose class name does not say so (a user's subclass)",
        "num_labels", _renamed_classifier),
    Bad("labels outside `num_labels` declared by a user's own module's config (not a transformers config)",
        "num_labels", _with_train(lambda ds: ds.filter(lambda r: True), model=lambda: _OwnConfigNet(num_labels=5))),
    Bad("`None` labels", "label", _with_train(_none_in("label"), partition="iid")),
    Bad("`None` in the `partition_column`", "partition_column", _with_train(_none_in("group"), partition_column="group")),
    Bad("an untokenised text dataset", "train_dataset", _untokenised),
    Bad("an `eval_dataset` without labels while `compute_metrics` is set", "compute_metrics",
        _with_eval(lambda ds: ds.remove_columns("label"))),
    Bad("string labels in the `eval_dataset`", "eval_dataset", _with_eval(_string_labels)),
    Bad("more clients than training rows", "num_clients",
        _with_train(lambda ds: ds.select(range(5)), num_clients=6, clients_per_round=2, partition="iid")),
    Bad("`partition_column` not in the dataset", "partition_column", _digits(partition_column="user")),
    Bad("`partition_column` not categorical", "partition_column", _digits(partition_column="pixel_values")),
    Bad("a Dirichlet split that cannot give every client `min_partition_size` rows", "min_partition_size",
        _digits(num_clients=4, min_partition_size=400, partition_max_retries=2)),
    Bad("`natural` partition with `num_clients` != the number of values", "num_clients",
        _digits(partition="natural", num_clients=3, clients_per_round=3)),
    Bad("`client_partitions` with the wrong number of clients", "client_partitions",
        _partitions(lambda n: [np.arange(n)])),
    Bad("`client_partitions` with an out-of-range row", "client_partitions",
        _partitions(lambda n: [[0], [1], [2], [n]])),
    Bad("`client_partitions` with an empty client", "client_partitions",
        _partitions(lambda n: [[0], [1], [2], []])),
    Bad("`partition_key='length'` over a column that is no text or token-id list", "partition_column",
        _digits(partition_key="length", partition_column="label")),
    Bad("`partition_key='embedding'` over a column that is no text", "partition_column",
        lambda env: digit_trainer(tiny_resnet(), env["digits"], config(
            env["tmp_path"], partition_key="embedding", partition_encoder=env["minilm"], partition_column="label"))),
    Bad("`client_eval_fraction` that leaves a client no training rows", "client_eval_fraction",
        _partitions(lambda n: [[0], [1], [2], np.arange(3, n)], client_eval_fraction=0.5)),
    Bad("`personalized_eval` without held-out rows (`client_eval_fraction` 0)", "client_eval_fraction",
        _cfg(personalized_eval=True)),
    Bad("both `client_partitions` and a callable `partition_key`", "partition_key",
        _partitions(lambda n: [[0], [1], [2], np.arange(3, n)], key=lambda row: row["label"])),
    # --- which tensors are shared (fedhf/sharing/plan.py) ---
    Bad("unknown `parameter_sharing`", "parameter_sharing", _cfg(parameter_sharing="fedsb")),
    Bad("a `parameter_sharing_kwargs` key other than shared/personal/frozen", "parameter_sharing_kwargs",
        _cfg(parameter_sharing_kwargs={"private": ["head"]})),
    Bad("a `parameter_sharing_kwargs` pattern that is no regular expression", "parameter_sharing_kwargs",
        _cfg(parameter_sharing_kwargs={"personal": ["lora_B("]})),
    Bad("a LoRA `parameter_sharing` preset on a model without LoRA", "parameter_sharing",
        _digits(parameter_sharing="fedsa")),
    Bad("a `parameter_sharing_kwargs` pattern that matches no trainable parameter", "parameter_sharing_kwargs",
        _digits(parameter_sharing_kwargs={"personal": ["lora_B"]})),
    Bad("`parameter_sharing` that leaves nothing shared", "parameter_sharing",
        _digits(parameter_sharing_kwargs={"personal": ["."]})),
    Bad("personal tensors with the `preconditioned_mix` server rule (FedPM)", "parameter_sharing",
        _digits(algorithm="fedpm", parameter_sharing="personal_norm")),
    Bad("`server_rule='fedex_lora'` on a model without LoRA", "server_rule", _digits(server_rule="fedex_lora")),
    Bad("`server_rule='fedex_lora'` with personal LoRA B (`parameter_sharing='fedsa'`)", "parameter_sharing",
        _lora_tweets(server_rule="fedex_lora", parameter_sharing="fedsa")),
    Bad("`parameter_sharing='rolora'` on a model without LoRA", "parameter_sharing",
        _digits(parameter_sharing="rolora")),
    Bad("`parameter_sharing='rolora'` with a LoRA product rule (`server_rule='fedex_lora'`)", "parameter_sharing",
        _lora_tweets(server_rule="fedex_lora", parameter_sharing="rolora")),
    Bad("`parameter_sharing='rolora'` with `batched_clients` > 1", "batched_clients",
        _lora_tweets(parameter_sharing="rolora", batched_clients=2)),
    Bad("`parameter_sharing='rolora'` with a state sync that keeps the whole optimizer state (`state_sync='desloc'`)",
        "state_sync", _lora_tweets(parameter_sharing="rolora", state_sync="desloc")),
    Bad("`state_sync='desloc'` with a local optimizer that keeps no Adam moments (`local_optimizer='soap'`)",
        "state_sync", _lora_tweets(local_optimizer="soap", state_sync="desloc")),
    Bad("`server_rule='fedsvd'` with `batched_clients` > 1", "batched_clients",
        _lora_tweets(server_rule="fedsvd", batched_clients=2)),
    Bad("`lora_client_ranks` without one rank per client", "lora_client_ranks",
        _cfg(lora_client_ranks=[2, 4])),
    Bad("`lora_client_ranks` above the adapter's rank", "lora_client_ranks",
        _lora_tweets(server_rule="flexlora", lora_client_ranks=[2, 4, 8, 16])),
    Bad("`lora_client_ranks` with a rule that averages A and B (`server_rule='mean'`)", "lora_client_ranks",
        _lora_tweets(lora_client_ranks=[2, 4, 8, 8])),
    Bad("`lora_client_ranks` with a state sync that averages the optimizer state (`state_sync='average_warmstart'`)",
        "state_sync", _lora_tweets(server_rule="fedex_lora", local_optimizer="muon",
                                   state_sync="average_warmstart", lora_client_ranks=[2, 4, 8, 8])),
    Bad("a rule that rebuilds LoRA A and B every round (`server_rule='flexlora'`) with a stateful correction "
        "(`algorithm='scaffold'`)", "server_rule", _cfg(algorithm="scaffold", server_rule="flexlora")),
    Bad("`server_rule='fedsvd'` with a state sync that carries the optimizer state (`state_sync='average_warmstart'`)",
        "state_sync", _cfg(algorithm="fedavg", local_optimizer="muon", server_rule="fedsvd",
                  state_sync="average_warmstart")),
    Bad("`server_rule='flora'` with `load_best_model_at_end=True` (the base weights change every round)",
        "load_best_model_at_end", _lora_tweets(server_rule="flora", load_best_model_at_end=True,
                                               eval_every_rounds=1, metric_for_best_model="loss")),
    # --- communication compression (fedhf/compression/, fedhf/trainer/config/combinations/) ---
    Bad("`uplink_compression` naming no compressor", "uplink_compression", _cfg(uplink_compression="int9")),
    Bad("`downlink_compression` with a top-k fraction outside (0, 1]", "downlink_compression",
        _cfg(downlink_compression="topk:2")),
    Bad("`uplink_compression` with a rule item missing its compressor", "uplink_compression",
        _cfg(uplink_compression="lora_A=")),
    Bad("`uplink_compression` of the LoRA change with a LoRA product rule (`server_rule='fedex_lora'`)",
        "uplink_compression", _lora_tweets(server_rule="fedex_lora", uplink_compression="int8")),
    Bad("`uplink_compression` of the model change with a robust rule (`server_rule='median'`)",
        "uplink_compression", _digits(server_rule="median", uplink_compression="topk:0.1")),
    Bad("`uplink_compression` of the model change with preconditioned mixing (`algorithm='fedpm'`)",
        "uplink_compression", _digits(algorithm="fedpm", uplink_compression="int4")),
    Bad("`uplink_compression` of the model change with `parameter_sharing='rolora'`", "uplink_compression",
        _lora_tweets(parameter_sharing="rolora", uplink_compression="lora_B=int8")),
    Bad("`downlink_compression` with a LoRA product rule (`server_rule='flora'`)", "downlink_compression",
        _lora_tweets(server_rule="flora", downlink_compression="int8")),
    # --- settings that act on evaluation results, without an eval_dataset (fedhf/data/checks.py) ---
    Bad("`load_best_model_at_end=True` without an `eval_dataset`", "eval_dataset",
        _no_eval(load_best_model_at_end=True)),
    Bad("`metric_for_best_model` without an `eval_dataset`", "metric_for_best_model",
        _no_eval(metric_for_best_model="accuracy")),
    Bad("`eval_strategy='steps'` without an `eval_dataset`", "eval_strategy",
        _no_eval(eval_strategy="steps", eval_steps=1)),
    Bad("`eval_strategy='epoch'` without an `eval_dataset`", "eval_strategy", _no_eval(eval_strategy="epoch")),
    Bad("`eval_on_start=True` without an `eval_dataset`", "eval_on_start", _no_eval(eval_on_start=True)),
    Bad("an `EarlyStoppingCallback` without an `eval_dataset`", "EarlyStoppingCallback",
        _no_eval(callbacks=[_early_stopping], metric_for_best_model=None)),
    Bad("a `GenerationEvalCallback` without an `eval_dataset`", "GenerationEvalCallback",
        _no_eval(callbacks=[_generation_eval])),
    # --- the best round's metric (fedhf/trainer/hooks/best_round.py, fedhf/metrics/direction.py) ---
    Bad("`metric_for_best_model` of unknown direction without `greater_is_better`", "greater_is_better",
        _cfg(metric_for_best_model="score")),
    Bad("`metric_for_best_model` naming a personalised metric without `personalized_eval`", "personalized_eval",
        _digits(metric_for_best_model="personal_eval_accuracy_mean")),
    Bad("`metric_for_best_model` naming a personalised metric with an `EarlyStoppingCallback`",
        "EarlyStoppingCallback", lambda env: digit_trainer(
            tiny_resnet(), env["digits"], config(env["tmp_path"], metric_for_best_model="personal_eval_loss_mean",
                                                 personalized_eval=True, client_eval_fraction=0.2),
            callbacks=[_early_stopping()])),
    # --- memory plan and client-parallel training (fedhf/trainer/runners/memory_plan.py, fedhf/trainer/runners/client_parallel.py) ---
    Bad("`memory_budget_gb` <= 0", "memory_budget_gb", _cfg(memory_budget_gb=0)),
    Bad("`client_parallel=True` with BatchNorm buffers (a row shard's statistics are not the batch's)",
        "client_parallel", _digits(client_parallel=True)),
    Bad("`client_parallel=True` with `batched_clients` > 1", "batched_clients",
        _lora_tweets(client_parallel=True, batched_clients=2)),
    # privacy (fedhf/trainer/config/privacy_settings.py, the privacy rows of fedhf/trainer/config/combinations/)
    Bad("`client_sampling` unknown", "client_sampling", _cfg(client_sampling="bernoulli")),
    Bad("`dp_mode` unknown", "dp_mode", _cfg(dp_mode="local")),
    Bad("`dp_mode='central'` without `dp_clip_norm`", "dp_clip_norm", _cfg(dp_mode="central", dp_epsilon=3.0)),
    Bad("`dp_mode='central'` with neither `dp_epsilon` nor `dp_noise_multiplier`", "dp_epsilon",
        _cfg(dp_mode="central", dp_clip_norm=1.0)),
    Bad("`dp_delta` >= 1", "dp_delta", _cfg(dp_mode="central", dp_clip_norm=1.0, dp_epsilon=3.0, dp_delta=1.0)),
    Bad("`dp_*` set with `dp_mode='off'`", "dp_mode", _cfg(dp_epsilon=3.0)),
    Bad("`dp_accountant='pld'` with fixed-size client sampling", "client_sampling",
        _cfg(dp_mode="central", dp_clip_norm=1.0, dp_epsilon=3.0, dp_accountant="pld")),
    Bad("`dp_mode='distributed'` without secure aggregation", "secure_aggregation",
        _cfg(dp_mode="distributed", dp_clip_norm=1.0, dp_noise_multiplier=1.0)),
    Bad("`dp_mode='distributed'` with Poisson sampling", "client_sampling",
        _cfg(dp_mode="distributed", dp_clip_norm=1.0, dp_noise_multiplier=1.0, secure_aggregation=True,
             client_sampling="poisson")),
    Bad("the planned rounds spend more than `dp_epsilon` at the given noise", "dp_stop_at_budget",
        _cfg(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=0.5, dp_epsilon=1.0)),
    Bad("adaptive clipping with too little noise on the count", "dp_adaptive_clip_count_std",
        _cfg(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_adaptive_clip_quantile=0.5)),
    Bad("adaptive clipping with `dp_noise_multiplier=0` (no noise on its count)", "dp_noise_multiplier",
        _cfg(num_clients=8, clients_per_round=4, dp_mode="central", dp_clip_norm=0.1, dp_noise_multiplier=0.0,
             dp_adaptive_clip_quantile=0.5)),
    Bad("`dp_stop_at_budget` with a budget that not even the first round fits", "dp_noise_multiplier",
        _cfg(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=0.3, dp_epsilon=0.5, dp_stop_at_budget=True)),
    Bad("DP with `max_update_norm` (an un-noised exclusion by one client's unclipped norm)", "max_update_norm",
        _cfg(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, max_update_norm=5.0)),
    Bad("`dp_min_survivors` larger than the cohort", "dp_min_survivors",
        _cfg(dp_mode="distributed", dp_clip_norm=1.0, dp_noise_multiplier=1.0, secure_aggregation=True,
             dp_min_survivors=5)),
    Bad("adaptive clipping with secure aggregation (its bit would travel in the clear)", "dp_adaptive_clip_quantile",
        _cfg(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_adaptive_clip_quantile=0.5,
             dp_adaptive_clip_count_std=2.0, secure_aggregation=True)),
    Bad("`secagg_bits` too large for the cohort (the sum would wrap mod 2^32)", "secagg_bits",
        _cfg(secure_aggregation=True, secagg_bits=31)),
    Bad("DP with `client_weighting='num_samples'` (data-dependent weights)", "client_weighting",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, client_weighting="num_samples")),
    Bad("DP with a `personal` list under `parameter_sharing='all'`", "parameter_sharing_kwargs",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0,
                     parameter_sharing_kwargs={"personal": ["lora_B"]})),
    Bad("DP with a robust server rule (it reads each client's update)", "server_rule",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, server_rule="median")),
    Bad("DP with a state sync that averages the optimizer state", "state_sync",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, algorithm="fedmuon")),
    Bad("DP with `lora_client_ranks`", "lora_client_ranks",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, server_rule="flexlora",
                     lora_client_ranks=[4, 8, 8, 8])),
    Bad("DP with BatchNorm buffers (a noisy variance can turn negative)", "dp_mode",
        _digits(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0)),
    Bad("DP with `drift_spectral`", "drift_spectral",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, drift_spectral=True)),
    Bad("DP with personal tensors (`parameter_sharing='fedsa'`: their exact client mean would be published)",
        "parameter_sharing", _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0,
                                          parameter_sharing="fedsa")),
    Bad("DP with a LoRA product server rule (whole products, not changes, would be clipped)", "server_rule",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, server_rule="fedex_lora")),
    Bad("DP with FedPM's `preconditioned_mix` (it inverts a noisy, indefinite sum)", "server_rule",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, algorithm="fedpm")),
    Bad("DP with `personalized_eval` (per-client statistics)", "personalized_eval",
        _lora_tweets(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, personalized_eval=True,
                     client_eval_fraction=0.2)),
    Bad("`secure_aggregation=True` with personal tensors (their mean reads each client's)", "parameter_sharing",
        _lora_tweets(secure_aggregation=True, parameter_sharing="personal_head")),
    Bad("`secure_aggregation=True` with `drift_spectral` (it reads each client's state)", "drift_spectral",
        _lora_tweets(secure_aggregation=True, drift_spectral=True, algorithm="fedmuon")),
    Bad("`secure_aggregation=True` with `personalized_eval` (per-client statistics)", "personalized_eval",
        _lora_tweets(secure_aggregation=True, personalized_eval=True, client_eval_fraction=0.2)),
    Bad("`secure_aggregation=True` with `client_weighting='num_samples'` (row counts in the clear)",
        "client_weighting", _lora_tweets(secure_aggregation=True, client_weighting="num_samples")),
    Bad("`secure_aggregation=True` with a server rule that reads each client's update", "secure_aggregation",
        _lora_tweets(secure_aggregation=True, server_rule="trimmed_mean")),
    Bad("`secure_aggregation=True` with a per-client-scale compressor on the uplink", "uplink_compression",
        _lora_tweets(secure_aggregation=True, uplink_compression="int8")),
    Bad("`gradient_accumulation_steps` > 1 with a `compute_loss_func` (micro-batches cannot be weighted)",
        "gradient_accumulation_steps",
        lambda env: digit_trainer(tiny_resnet(), env["digits"], config(env["tmp_path"], gradient_accumulation_steps=2),
                                  compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss)),
    Bad("`round_hooks` with an object that is not a RoundHook", "round_hooks",
        lambda env: digit_trainer(tiny_resnet(), env["digits"], config(env["tmp_path"]), round_hooks=[object()]),
        TypeError),
    Bad("a clock setting without `clock_profile`", "clock_profile", _cfg(round_policy="deadline", round_deadline_s=5.0)),
    Bad("`round_policy='fedbuff'` with a LoRA product rule (reports of different global models)", "round_policy",
        _lora_tweets(clock_profile="uniform", round_policy="fedbuff", server_rule="flexlora")),
    Bad("`round_policy='fedbuff'` with DP (no sampled cohort to account)", "round_policy",
        _cfg(clock_profile="uniform", round_policy="fedbuff", dp_mode="central", dp_clip_norm=1.0,
             dp_noise_multiplier=1.0, client_sampling="poisson")),
    Bad("`round_policy='fedbuff'` with secure aggregation (the buffer is unknown when clients mask)", "round_policy",
        _cfg(clock_profile="uniform", round_policy="fedbuff", secure_aggregation=True)),
]


class _OwnConfigNet(torch.nn.Module):
    """A user's classifier with a config of its own (not a transformers PretrainedConfig) declaring num_labels."""

    def __init__(self, num_labels: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_labels=num_labels)
        self.head = torch.nn.Linear(64, num_labels)

    def forward(self, pixel_values=None, labels=None):
        logits = self.head(pixel_values.flatten(1))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _resnet_with(num_labels):
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8], depths=[1],
                                                     layer_type="basic", num_labels=num_labels))
