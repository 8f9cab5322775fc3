"""A small FederatedSFTTrainer run (trl's SFTTrainer under fedhf's rounds) used by tests/trainer/test_sft.py, launched with 1
or 2 processes through tests/end_to_end/test_multiprocess.py's launcher:

    torchrun --standalone --nproc_per_node 2 tests/scripts/sft_multiprocess_run.py OUT_DIR sft

4 clients, 3 per round: with 2 processes one process trains 2 clients and the other 1, so they run different
numbers of local steps (and of trl's loss calls) before each round's aggregation. Writes OUT_DIR/sft.safetensors
(the trained adapter and the round's eval loss) from process 0.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.scripts.multiprocess_run import out_file


def main(out_dir: str, spec: str) -> None:
    import warnings

    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from fedhf.data.demo import load_tweets, minilm_path, tiny_llama
    from fedhf.trainer.sft import FederatedSFTConfig, FederatedSFTTrainer
    from tests.helpers import sentiment_pairs

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    pairs = sentiment_pairs(load_tweets(), 48, 8, max_chars=40)
    model = get_peft_model(tiny_llama(len(tokenizer), seed=0),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                      target_modules=["q_proj", "v_proj"]))
    args = FederatedSFTConfig(
        output_dir=os.path.join(out_dir, spec), report_to="none", disable_tqdm=True, logging_strategy="no",
        save_strategy="no", seed=0, use_cpu=True, bf16=False, gradient_checkpointing=False, eos_token="[SEP]",
        completion_only_loss=True, num_clients=4, clients_per_round=3, num_rounds=2, local_steps=2,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, eval_every_rounds=2, partition="iid",
        algorithm="fedavg", learning_rate=0.5, partition_report=False)
    trainer = FederatedSFTTrainer(model=model, args=args, train_dataset=pairs["train"], eval_dataset=pairs["test"],
                                  processing_class=tokenizer)
    trainer.train()
    if trainer.is_world_process_zero():
        state = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        last = trainer.federated_history[-1]
        # every process evaluates every held-out row (fedhf/trainer/every_row_evaluation.py): the same loss as one
        state.update({f"history.{k}": torch.tensor(float(last[k]), dtype=torch.float64)
                      for k in ("eval_loss", "participants")})
        save_file(state, out_file(out_dir, spec))
        print("world_size", args.world_size, "history", last)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
