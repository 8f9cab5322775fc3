"""Full-weight federated fine-tuning with the model sharded over processes by FSDP2: FedPAC-Muon on a small Llama.

Every process trains every sampled client together (each micro-batch split in row shards) and holds 1/N of each
weight, gradient, Muon momentum and round sum; the round's tensors never exist whole on one process, except the one
matrix Muon orthogonalises at a time (docs/scaling.md, "One model over many processes"). At the end ``save_model``
writes one consolidated Hugging Face checkpoint. Offline, on the bundled tweets and a randomly initialised Llama
built from a config (hidden 128, 2 layers): it shows the sharding (the training loss falls), not a fine-tuning's
quality; on 2 CPU processes of a busy 2-core machine it took 2 min 16 s::

    accelerate launch --config_file examples/accelerate_fsdp.yaml examples/fsdp_full_weights.py --output_dir outputs/fsdp
    torchrun --standalone --nproc_per_node 2 examples/fsdp_full_weights.py --fsdp --output_dir outputs/fsdp

(the first reads FSDP from the accelerate config; the second asks for it with ``fsdp=True``). With a GPU per process
the same commands run on the GPUs (NCCL).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from fedhf import FederatedConfig, FederatedTrainer  # noqa: E402
from fedhf.data.demo import load_tweet_instructions, minilm_path, subsample, tiny_llama  # noqa: E402
from fedhf.data.sft import SFTCollator, tokenize_sft  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="outputs/fsdp")
    parser.add_argument("--fsdp", action="store_true", help="ask for FSDP in the config (under torchrun)")
    parser.add_argument("--rounds", type=int, default=3)
    cli = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    splits = load_tweet_instructions()
    train = tokenize_sft(subsample(splits["train"], 160), tokenizer, max_length=48)
    test = tokenize_sft(subsample(splits["test"], 32), tokenizer, max_length=48)
    model = tiny_llama(len(tokenizer), hidden_size=128, num_layers=2)
    args = FederatedConfig(
        output_dir=cli.output_dir, overwrite_output_dir=True, report_to="none", disable_tqdm=True, seed=0,
        algorithm="fedpac_muon", algorithm_kwargs={"routing": "hidden_only"}, learning_rate=1e-3,
        num_clients=8, clients_per_round=4, num_rounds=cli.rounds, local_steps=4, per_device_train_batch_size=8,
        max_grad_norm=1.0, eval_every_rounds=cli.rounds, per_device_eval_batch_size=16, save_strategy="no",
        fsdp=cli.fsdp or None)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=train, eval_dataset=test,
                               data_collator=SFTCollator(tokenizer))
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    whole = sum(p.numel() for p in model.parameters())
    print(f"process {args.process_index} of {args.world_size}: holds {held:,} of the model's {whole:,} weights "
          f"(FSDP: {trainer.shards.active})", flush=True)
    trainer.train()  # the last round is evaluated (eval_every_rounds)
    trainer.save_model(os.path.join(cli.output_dir, "model"))
    if trainer.is_world_process_zero():
        history = trainer.federated_history
        print("train_loss by round:", [round(entry["train_loss"], 4) for entry in history])
        print(f"eval_loss after round {history[-1]['round']}: {history[-1]['eval_loss']:.4f}")
        reloaded = LlamaForCausalLM.from_pretrained(os.path.join(cli.output_dir, "model"))
        print(f"saved one consolidated checkpoint: {sum(p.numel() for p in reloaded.parameters()):,} weights "
              f"reloaded with from_pretrained from {os.path.join(cli.output_dir, 'model')}")


if __name__ == "__main__":
    main()
