"""LLM path cost: a federated LoRA round on a small causal LM against a plain hand-written loop.

Model: a LlamaForCausalLM built from a config (hidden 256, 4 layers, 4 heads, ffn 512, the MiniLM tokenizer's
30,522-token vocabulary), LoRA r16 on every linear layer, no dropout. Data: the bundled tweets, concatenated and
cut into blocks of ``--seq`` tokens, so every step costs the same. Both sides run the same number of optimizer
steps (SGD lr 0.1, weight decay 1e-3: fedavg's local step) on batches of the same rows and length:

* plain: ``for batch in loader: loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()``;
* federated: ``FederatedTrainer`` (fedavg, IID split), rounds of ``--clients`` clients x ``--local_steps`` steps
  each; a round is timed from its start to its end (sampling, loading the global adapter into the model, building the
  optimizer and the client's DataLoader, the steps, reading the update back, the sums and the server rule), so
  the one-off setup and the end-of-run plot are left out. Each side is timed ``--repeats`` times (plain: passes
  over the same batches; federated: rounds) and the fastest is kept, against the noise of a shared machine.

Rows: fp32; gradient checkpointing on (``model.gradient_checkpointing_enable()`` on both sides, non-reentrant);
a 4-bit nf4 base (bitsandbytes, fp32 compute, ``prepare_model_for_kbit_training``). Every (row, side) runs in a
fresh subprocess, so its peak memory (``ru_maxrss``: the process's peak resident set, which is what torch's CPU
tensors use; tracemalloc does not see them) is its own. On a GPU the same script reports
``torch.cuda.max_memory_allocated`` and names the GPU.

Last line (time ratios federated / plain, from one run): ``llm_overhead fp32=0.99x gc=1.03x nf4=1.03x`` (idle 2-core CPU).

    python benchmarks/llm.py [--clients 2 --local_steps 8 --batch 4 --seq 128 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROWS = ("fp32", "gc", "nf4")
LR, WEIGHT_DECAY = 0.1, 1e-3


def blocks(tokenizer, seq: int, rows: int):
    """Tweets concatenated and cut into ``rows`` blocks of ``seq`` tokens (labels = inputs: plain LM loss)."""
    import datasets

    from fedhf.data.demo import load_tweets

    tweets = load_tweets()["train"].select(range(rows * seq // 8))
    ids = [t for text in tweets["text"] for t in tokenizer(text, add_special_tokens=False)["input_ids"]
           + [tokenizer.sep_token_id]]
    if len(ids) < rows * seq:
        raise ValueError("not enough tweet text for the requested blocks; lower --seq or the steps")
    chunks = [ids[i * seq:(i + 1) * seq] for i in range(rows)]
    return datasets.Dataset.from_dict({"input_ids": chunks, "labels": chunks})


def build_model(row: str, directory: str, tokenizer, device: str):
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    if not os.path.isfile(os.path.join(directory, "config.json")):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                             pad_token_id=tokenizer.pad_token_id)
        LlamaForCausalLM(config).save_pretrained(directory)
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32) if row == "nf4" else None
    model = AutoModelForCausalLM.from_pretrained(directory, quantization_config=quantization, device_map=device)
    if quantization is not None:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    if row == "gc":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def run_plain(model, data, steps: int, batch: int, device: str, repeats: int) -> float:
    import torch
    from torch.utils.data import DataLoader
    from transformers import default_data_collator

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=LR, weight_decay=WEIGHT_DECAY)
    loader = DataLoader(data, batch_size=batch, shuffle=True, collate_fn=default_data_collator,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    times = []
    for _ in range(repeats):
        batches = iter(loader)
        start = time.perf_counter()
        for _ in range(steps):
            inputs = {k: v.to(device) for k, v in next(batches).items()}
            model(**inputs).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def run_federated(model, data, clients: int, local_steps: int, batch: int, out: str, device: str,
                  repeats: int) -> float:
    from transformers import TrainerCallback, default_data_collator

    from fedhf import FederatedConfig, FederatedTrainer

    class RoundClock(TrainerCallback):
        rounds = []

        def on_step_begin(self, args, state, control, **kwargs):
            _sync(device)
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync(device)
            RoundClock.rounds.append(time.perf_counter() - self.begin)

    args = FederatedConfig(output_dir=out, num_clients=clients, clients_per_round=clients, num_rounds=repeats,
                           local_steps=local_steps, partition="iid", algorithm="fedavg", learning_rate=LR,
                           weight_decay=WEIGHT_DECAY, round_lr_schedule="constant", per_device_train_batch_size=batch,
                           max_grad_norm=0.0, report_to="none", disable_tqdm=True, logging_strategy="no",
                           save_strategy="no", partition_report=False, use_cpu=device == "cpu", seed=0)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                               callbacks=[RoundClock()])
    trainer.train()
    return min(RoundClock.rounds)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _warm_up(model, data, device: str) -> None:
    """One forward/backward before timing, so lazy initialisation (kernels, allocator) costs neither side."""
    import torch
    from transformers import default_data_collator

    model.train()
    inputs = {k: v.to(device) for k, v in default_data_collator([data[0], data[1]]).items()}
    model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)


def worker(row: str, side: str, opts) -> dict:
    import torch
    from transformers import AutoTokenizer

    from fedhf.data.demo import minilm_path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    steps = opts.clients * opts.local_steps
    data = blocks(tokenizer, opts.seq, steps * opts.batch)
    model = build_model(row, opts.model_dir, tokenizer, device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _warm_up(model, data, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if side == "plain":
        seconds = run_plain(model, data, steps, opts.batch, device, opts.repeats)
    else:
        with tempfile.TemporaryDirectory() as out:
            seconds = run_federated(model, data, opts.clients, opts.local_steps, opts.batch, out, device,
                                    opts.repeats)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"row": row, "side": side, "seconds": seconds, "tokens_per_s": steps * opts.batch * opts.seq / seconds,
            "peak_MB": peak / 2**20, "before_MB": 0.0 if device == "cuda" else before / 2**20, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--local_steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per side (rounds when federated); "
                                                                    "the fastest is kept")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "SIDE"), help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        print(json.dumps(worker(*opts.worker, opts)))
        return

    rows = [r for r in opts.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    results = {}
    with tempfile.TemporaryDirectory() as model_dir:
        for row in rows:
            for side in ("plain", "federated"):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", row, side, "--model_dir", model_dir,
                       "--clients", str(opts.clients), "--local_steps", str(opts.local_steps),
                       "--batch", str(opts.batch), "--seq", str(opts.seq), "--repeats", str(opts.repeats)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{row}/{side} failed:\n{done.stderr[-3000:]}")
                results[row, side] = json.loads(done.stdout.strip().splitlines()[-1])
                r = results[row, side]
                print(f"{row:5s} {side:9s} {r['seconds']:7.2f} s  {r['tokens_per_s']:8.1f} tokens/s  "
                      f"peak {r['peak_MB']:7.1f} MB (model built: {r['before_MB']:7.1f} MB)", flush=True)
    first = results[rows[0], "plain"]
    steps = opts.clients * opts.local_steps
    print(f"device={first['device']} threads={first['threads']} python={platform.python_version()} "
          f"steps={steps} ({opts.clients} clients x {opts.local_steps}) batch={opts.batch} seq={opts.seq} "
          f"best of {opts.repeats}")
    ratios = {row: results[row, "federated"]["seconds"] / results[row, "plain"]["seconds"] for row in rows}
    memory = {row: results[row, "federated"]["peak_MB"] / results[row, "plain"]["peak_MB"] for row in rows}
    print("llm_peak_memory " + " ".join(f"{row}={memory[row]:.2f}x" for row in rows))
    print("llm_overhead " + " ".join(f"{row}={ratios[row]:.2f}x" for row in rows))


if __name__ == "__main__":
    main()
