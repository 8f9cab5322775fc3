"""What save_model() writes reproduces what evaluate() evaluated, for every server rule and every parameter-sharing
preset (fedhf/trainer/hooks/outputs.py, fedhf/sharing/plan.py): a tiny Llama + LoRA trains one round, is saved, and is reloaded
onto a fresh base with the standard transformers/peft calls a Hub user makes; the reloaded model's eval loss is
trainer.evaluate()'s, and it is not the untrained base's."""

from __future__ import annotations

import os

import pytest
import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from fedhf import FederatedTrainer
from fedhf.data.sft import SFTCollator
from fedhf.data.demo import tiny_llama
from fedhf.core.lora import LORA_B, role_of
from fedhf.server import SERVER_RULES
from fedhf.sharing.plan import PRESETS, STORE_NAME

from tests.helpers import config, tweet_sft

CLIENTS = 3  # median and trimmed_mean need three
# a rule that mixes by the local optimizer's preconditioners needs an algorithm that has them (FedPM)
ALGORITHM = {"preconditioned_mix": "fedpm"}
UNTRAINED = {}  # the untrained base's eval loss, by whether its lm_head is untied (computed once)


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=36, n_test=8, max_length=20)


def base_llama(vocab_size, untied: bool = False):
    """The bundled tiny Llama (tied embeddings), or with its lm_head untied (its own copy of the weights)."""
    model = tiny_llama(vocab_size)
    if untied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return model


def lora_llama(vocab_size, head: bool = False, full: bool = False):
    # the personal_head preset needs a trainable head: an untied lm_head trained as peft's modules_to_save
    model = base_llama(vocab_size, untied=head)
    if full:  # full fine-tuning (personal_norm: a peft model has no trainable norm)
        return model
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      modules_to_save=["lm_head"] if head else None, task_type=TaskType.CAUSAL_LM)
    return get_peft_model(model, lora)


def eval_loss(model, sft, tokenizer, tmp_path) -> float:
    args = TrainingArguments(output_dir=str(tmp_path / "eval"), report_to="none", use_cpu=True,
                             per_device_eval_batch_size=8)
    return Trainer(model=model, args=args, eval_dataset=sft["test"],
                   data_collator=SFTCollator(tokenizer)).evaluate()["eval_loss"]


def train_and_save(tokenizer, sft, tmp_path, head=False, full=False, **kw):
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, local_steps=1,
                  per_device_train_batch_size=4, per_device_eval_batch_size=8, partition_report=False,
                  **{"learning_rate": 0.05, "partition": "iid", "num_rounds": 1, **kw})
    trainer = FederatedTrainer(model=lora_llama(len(tokenizer), head, full), args=args, train_dataset=sft["train"],
                               eval_dataset=sft["test"], data_collator=SFTCollator(tokenizer))
    trainer.train()
    evaluated = trainer.evaluate()["eval_loss"]
    trainer.save_model(str(tmp_path / "saved"))
    return trainer, evaluated


def reload(path, vocab_size, head=False):
    """As a Hub user would: a peft adapter onto the same fresh base, or full weights on their own."""
    if os.path.exists(os.path.join(path, "adapter_config.json")):
        return PeftModel.from_pretrained(base_llama(vocab_size, untied=head), path)
    return AutoModelForCausalLM.from_pretrained(path)


def check_reload(tokenizer, sft, tmp_path, trainer, evaluated, head=False):
    saved = str(tmp_path / "saved")
    reloaded = eval_loss(reload(saved, len(tokenizer), head), sft, tokenizer, tmp_path)
    if head not in UNTRAINED:
        UNTRAINED[head] = eval_loss(base_llama(len(tokenizer), untied=head), sft, tokenizer, tmp_path)
    untrained = UNTRAINED[head]
    assert abs(reloaded - evaluated) < 2e-6, (reloaded, evaluated)  # a few float32 ulps of a loss near 10
    assert abs(evaluated - untrained) > 1e-4, (evaluated, untrained)  # the evaluated model is the trained one
    folds = trainer.algorithm.server_rule.folds_into_base
    adapter = isinstance(trainer.model, PeftModel) and not folds
    # a folding rule writes the merged full model (a peft adapter would lose the folded base weights)
    assert os.path.exists(os.path.join(saved, "adapter_config.json")) == adapter
    card = open(os.path.join(saved, "README.md")).read()
    assert ("library_name: peft" if adapter else "library_name: transformers") in card
    checkpoint = tmp_path / "run" / "checkpoint-1" / "model"
    if checkpoint.exists():  # a round checkpoint's model/ is what save_model writes
        from_checkpoint = eval_loss(reload(str(checkpoint), len(tokenizer), head), sft, tokenizer, tmp_path)
        assert abs(from_checkpoint - evaluated) < 2e-6


@pytest.mark.parametrize("rule", SERVER_RULES.names())
def test_saved_model_reproduces_evaluate_for_every_server_rule(tokenizer, sft, tmp_path, rule):
    folds = SERVER_RULES.get(rule)().folds_into_base  # their round checkpoints' model/ is checked too
    trainer, evaluated = train_and_save(tokenizer, sft, tmp_path, server_rule=rule, save_every_rounds=int(folds),
                                        algorithm=ALGORITHM.get(rule, "fedavg"))
    check_reload(tokenizer, sft, tmp_path, trainer, evaluated)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_saved_model_reproduces_evaluate_for_every_sharing_preset(tokenizer, sft, tmp_path, preset):
    head = preset == "personal_head"
    full = preset == "personal_norm"  # full fine-tuning with personal RMSNorms
    trainer, evaluated = train_and_save(tokenizer, sft, tmp_path, head=head, full=full, parameter_sharing=preset,
                                        **({"learning_rate": 1e-3} if full else {}))
    check_reload(tokenizer, sft, tmp_path, trainer, evaluated, head=head)


def test_fedsa_global_b_is_the_weighted_mean_of_the_clients_b(tokenizer, sft, tmp_path):
    trainer, _ = train_and_save(tokenizer, sft, tmp_path, parameter_sharing="fedsa",
                                client_weighting="num_samples", partition="dirichlet", partition_column="label",
                                dirichlet_alpha=0.5, min_partition_size=4)
    sizes = [len(p) for p in trainer.client_partitions]
    assert len(set(sizes)) > 1  # unequal weights
    live = dict(trainer.model.named_parameters())
    b_names = [n for n in live if role_of(n) == LORA_B]
    stored = [trainer.client_store.get(c, STORE_NAME) for c in range(CLIENTS)]
    for n in b_names:
        mean = sum(w * s[n].double() for w, s in zip(sizes, stored)) / sum(sizes)
        torch.testing.assert_close(live[n].detach().double(), mean, atol=1e-7, rtol=0)
        assert torch.count_nonzero(live[n]) > 0


def test_best_round_is_saved_and_carded_with_its_personal_part(tokenizer, sft, tmp_path):
    """load_best_model_at_end: the saved model (shared and personal parts) is the best round's, and the card's
    eval rows are that round's. greater_is_better=True on the loss picks round 1 of 2 (the loss falls)."""
    trainer, _ = train_and_save(tokenizer, sft, tmp_path, parameter_sharing="fedsa", num_rounds=2,
                                eval_every_rounds=1, metric_for_best_model="eval_loss", greater_is_better=True,
                                load_best_model_at_end=True)
    losses = {e["round"]: e["eval_loss"] for e in trainer.federated_history if "eval_loss" in e}
    assert losses[1] > losses[2] and trainer.state.best_global_step == 1
    saved = str(tmp_path / "saved")
    reloaded = eval_loss(reload(saved, len(tokenizer)), sft, tokenizer, tmp_path)
    assert abs(reloaded - losses[1]) < 2e-6, (reloaded, losses)
    card = open(os.path.join(saved, "README.md")).read()
    assert f"| final eval_loss (saved model, round 1) | {losses[1]:.4f} |" in card
    assert "parameter sharing | fedsa" in card and "weighted mean" in card
