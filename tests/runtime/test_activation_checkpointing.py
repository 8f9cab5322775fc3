"""gradient_checkpointing is honoured in the round loop: the same update as without it, and really active."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM

from fedhf import FederatedTrainer

from tests.helpers import config, trainable_state


def _run(tmp_path, tweets, tokenizer, checkpointing: bool):
    model = _fresh_lora(tokenizer)
    base = model.get_base_model()
    layer_calls = []
    base.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *_: layer_calls.append(1))
    args = config(tmp_path / f"gc{int(checkpointing)}", algorithm="fedavg", num_clients=2, clients_per_round=2,
                  num_rounds=1, local_steps=2, per_device_train_batch_size=8, learning_rate=0.5,
                  gradient_checkpointing=checkpointing, partition="iid", partition_report=False)
    data = tweets["train"].select(range(64)).remove_columns(["label"])
    trainer = FederatedTrainer(model=model, args=args, train_dataset=data,
                               data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
    return trainable_state(model), len(layer_calls), base.is_gradient_checkpointing


def test_checkpointing_gives_the_same_update_and_recomputes_the_forward(tmp_path, tweets, tokenizer):
    plain, plain_calls, plain_on = _run(tmp_path, tweets, tokenizer, checkpointing=False)
    checkpointed, checkpointed_calls, checkpointed_on = _run(tmp_path, tweets, tokenizer, checkpointing=True)
    assert not plain_on and checkpointed_on
    steps = 2 * 2  # clients x local steps
    # The first layer's attention runs in the forward and again when backward recomputes it.
    assert plain_calls == steps and checkpointed_calls == 2 * steps
    initial = {n: t for n, t in trainable_state(_fresh_lora(tokenizer)).items()}
    changed = 0
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, rtol=0, atol=1e-5, msg=name)
        changed += not torch.equal(value, initial[name])
    assert changed  # the adapters did train (lora_B starts at zero)


def _fresh_lora(tokenizer):
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                        pad_token_id=tokenizer.pad_token_id))
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                           task_type="CAUSAL_LM"))
