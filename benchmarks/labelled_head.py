"""When should the head run at the labelled positions only? One training step (forward, loss, backward) of a causal
LM with the full head against the head at the labelled positions (fixed-size gathers,
fedhf/runtime/labelled_logits.py), as the share of labelled positions per row grows.

Model: benchmarks/llm.py's LlamaForCausalLM (hidden ``--hidden``, ``--layers`` layers, the MiniLM tokenizer's
30,522-token vocabulary), LoRA r16 on every linear layer, ``--batch`` rows of ``--seq`` random tokens; a row's last
``share`` of positions carries labels (an SFT answer), the rest -100. Each side is timed ``--repeats`` times after a
warm-up; the fastest is kept. Printed per share: both times and their ratio; last line
``labelled_head_vs_full share=..:..x ...`` (full-head time over labelled-head time: above 1, the labelled head wins).

    python benchmarks/labelled_head.py [--hidden 256 --layers 4 --batch 8 --seq 128 --repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def step_seconds(model, inputs, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        begin = time.perf_counter()
        model(**inputs).loss.backward()
        best = min(best, time.perf_counter() - begin)
        model.zero_grad(set_to_none=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shares", default="0.05,0.25,0.5,0.75,0.9,1.0")
    opts = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fedhf.runtime.labelled_logits import labelled_positions

    torch.manual_seed(0)
    vocab = 30522
    config = LlamaConfig(vocab_size=vocab, hidden_size=opts.hidden, intermediate_size=2 * opts.hidden,
                         num_hidden_layers=opts.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                                target_modules="all-linear", task_type="CAUSAL_LM"))
    ids = torch.randint(0, vocab, (opts.batch, opts.seq))
    ratios = {}
    for share in (float(s) for s in opts.shares.split(",")):
        labels = ids.clone()
        labels[:, : opts.seq - max(int(share * opts.seq), 1)] = -100
        full = step_seconds(model, {"input_ids": ids, "labels": labels}, opts.repeats)
        positions, shift_labels = labelled_positions(labels)
        kept = step_seconds(model, {"input_ids": ids, "labels": labels, "logits_to_keep": positions,
                                    "shift_labels": shift_labels}, opts.repeats)
        ratios[share] = full / kept
        print(f"share {share:4.2f}  full head {full * 1e3:8.1f} ms  labelled head {kept * 1e3:8.1f} ms  "
              f"full/labelled {full / kept:5.2f}x", flush=True)
    print(f"device=cpu ({os.cpu_count()} cores) threads={torch.get_num_threads()} torch={torch.__version__} "
          f"python={platform.python_version()} hidden={opts.hidden} layers={opts.layers} batch={opts.batch} "
          f"seq={opts.seq} best of {opts.repeats}")
    print("labelled_head_vs_full " + " ".join(f"share={s:g}:{r:.2f}x" for s, r in ratios.items()))


if __name__ == "__main__":
    main()
