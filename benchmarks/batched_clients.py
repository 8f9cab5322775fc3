"""Batched multi-client LoRA: one round of C clients trained together vs one at a time, on the same data.

Model and data as benchmarks/llm.py: a LlamaForCausalLM built from a config (hidden 256, 4 layers, the MiniLM
tokenizer's 30,522-token vocabulary; ``--hidden``/``--layers`` for a bigger one on a GPU), LoRA r16 on every
linear layer, the bundled tweets cut into blocks of ``--seq`` tokens. FedAvg (SGD), ``--clients`` clients per round,
``--local_steps`` steps of ``--batch`` rows each. For each ``batched_clients`` value the same rounds run from the
same initial model; a round is timed from its start to its end (callback), the fastest of ``--rounds`` is kept.
Also printed: the peak memory (GPU: ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS, which only
grows, so read the GPU column for memory) and the largest difference of the final adapter from the one-at-a-time
run (the two must agree to float rounding; tests/trainer/runners/test_batched_round.py asserts it).

``--model minilm``: the pretrained MiniLM-L6 sentence classifier instead, LoRA r16 on query/value and the 3-class
head trained (stacked per client too), dropout off (a batched pass draws other masks than one client at a time, so
the adapters would differ by more than rounding), tweets padded to ``--seq`` tokens, with their sentiment labels.

``--model gemma``: the bundled Gemma-3-270M (on a GPU the random-weight copy in ``$GEMMA_RANDOM_DIR`` when set,
written by the GPU bundle's run script), LoRA r8 on q/v, the tweets as instructions (a ~40-token row with 1-3
labelled tokens, padded per batch), so the head runs at the labelled positions only.

Printed after the rows:
* ``round_overhead c1=..% ...``: per setting, the fastest round's time over the time of its local steps
  (``ClientRound.steps_together``) minus 1: what a round costs beyond its steps (loading the global adapter,
  building the optimizers and the data streams, reading the updates back, the sums);
* ``batched_ops_per_step c1=<n> c4=<n> c16=<n>``: the aten ops (torch.profiler, CPU) of one fused forward/backward
  of C clients' batches (``BatchedClients.fused_pass``); it must not grow with C. Handing each client the views of
  its gradient slices afterwards adds C x (stacked linears) metadata-only ``select``s, not counted (no kernel);
* with ``--compile BACKEND``: every size again with ``torch_compile`` on that backend, and
  ``compile_speedup (BACKEND) c1=..x c4=..x ...`` (the eager round over the compiled round, per size; the fastest
  of ``--rounds``, so the first round's compile is not in it);
* last, ``batched_speedup c2=..x c4=..x ...`` (tokens/s batched over one at a time: the same tokens, so the
  round-time ratio; from one run).

    python benchmarks/batched_clients.py [--model llama|minilm|gemma] [--clients 8 --local_steps 4 --batch 4
                                         --seq 128 --sizes 1,2,4,8] [--compile inductor]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from llm import blocks  # noqa: E402  (benchmarks/llm.py: the same data)


def build(directory: str, tokenizer, hidden: int, layers: int, device: str, kind: str = "llama"):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaConfig, LlamaForCausalLM

    if kind == "minilm":
        from fedhf.data.demo import minilm_path

        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(  # no dropout: a batched pass
            minilm_path(), num_labels=3, hidden_dropout_prob=0.0,  # draws other masks than sequential clients
            attention_probs_dropout_prob=0.0).to(device)
        return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                target_modules=["query", "value"], task_type="SEQ_CLS"))
    if kind == "gemma":
        from llm_gemma import lora_model  # noqa: E402  (benchmarks/llm_gemma.py: the same adapter)

        return lora_model(gemma_path(), torch.bfloat16 if device == "cuda" else torch.float32).to(device)
    if not os.path.isfile(os.path.join(directory, "config.json")):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                             max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
        LlamaForCausalLM(config).save_pretrained(directory)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, device_map=device)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))


def gemma_path() -> str:
    """The random-weight Gemma-3-270M of a GPU run (``$GEMMA_RANDOM_DIR``) when set, else the bundled one."""
    from fedhf.data import bundled_gemma

    return os.environ.get("GEMMA_RANDOM_DIR") or bundled_gemma.gemma_3_270m_path()


def gemma_instructions(tokenizer, rows: int):
    """``rows`` tweets as instructions, the prompt masked (benchmarks/llm_gemma.py's data)."""
    from fedhf.data.demo import load_tweet_instructions, subsample
    from fedhf.data.sft import tokenize_sft

    return tokenize_sft(subsample(load_tweet_instructions()["train"], rows, seed=0), tokenizer, max_length=64)


def labelled_tweets(tokenizer, seq: int, rows: int):
    """``rows`` bundled tweets padded to ``seq`` tokens, with their sentiment labels (MiniLM's data)."""
    from fedhf.data.demo import load_tweets

    tweets = load_tweets()["train"].select(range(rows))
    return tweets.map(lambda b: tokenizer(b["text"], truncation=True, max_length=seq, padding="max_length"),
                      batched=True, remove_columns=["text"]).with_format("torch")


def collator(opts, tokenizer):
    from transformers import default_data_collator

    from fedhf.data.sft import SFTCollator

    return SFTCollator(tokenizer) if opts.model == "gemma" else default_data_collator


def config(opts, out: str, batched: int, device: str, rounds: int, compile_backend: str = ""):
    from fedhf import FederatedConfig

    return FederatedConfig(output_dir=out, num_clients=opts.clients, clients_per_round=opts.clients,
                           num_rounds=rounds, local_steps=opts.local_steps, partition="iid",
                           algorithm="fedavg", learning_rate=0.1 if opts.model != "gemma" else 1e-3,
                           round_lr_schedule="constant", per_device_train_batch_size=opts.batch,
                           batched_clients=batched, max_grad_norm=0.0, report_to="none", disable_tqdm=True,
                           logging_strategy="no", save_strategy="no", partition_report=False,
                           use_cpu=device == "cpu", bf16=device == "cuda", seed=0,
                           torch_compile_backend=compile_backend or None)


def run(batched: int, opts, model_dir: str, tokenizer, data, device: str, compile_backend: str = "") -> dict:
    import torch
    from transformers import TrainerCallback

    from fedhf import FederatedTrainer

    rounds, steps = [], []

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    class RoundClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.begin = time.perf_counter()
            steps.append(0.0)

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            rounds.append(time.perf_counter() - self.begin)

    model = build(model_dir, tokenizer, opts.hidden, opts.layers, device, opts.model)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if compile_backend:
        torch._dynamo.reset()  # each compiled run starts from no cached graph (and far from the recompile limit)
    with tempfile.TemporaryDirectory() as out:
        trainer = FederatedTrainer(model=model, args=config(opts, out, batched, device, opts.rounds, compile_backend),
                                   train_dataset=data, data_collator=collator(opts, tokenizer),
                                   callbacks=[RoundClock()])
        local_steps = trainer.client_round.steps_together

        def timed_steps(*args, **kwargs):  # the K local steps of a client (or a batched chunk)
            sync()
            begin = time.perf_counter()
            losses = local_steps(*args, **kwargs)
            sync()
            steps[-1] += time.perf_counter() - begin
            return losses

        trainer.client_round.steps_together = timed_steps
        trainer.train()
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    adapter = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
    fastest = min(range(len(rounds)), key=rounds.__getitem__)
    return {"seconds": rounds[fastest], "overhead": rounds[fastest] / steps[fastest] - 1, "peak_MB": peak / 2**20,
            "adapter": adapter}


def fused_pass_ops(copies: int, opts, model_dir: str, tokenizer, data, device: str) -> int:
    """The aten ops torch.profiler records in one fused forward/backward of ``copies`` clients' batches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fedhf import FederatedTrainer
    from fedhf.runtime.stacked_adapters import concat_batches, model_pad_id, stacked_clients
    from fedhf.runtime.model_outputs import loss_items
    from fedhf.trainer.runners.batched_round import BatchedClients

    model = build(model_dir, tokenizer, opts.hidden, opts.layers, device, opts.model)
    collate = collator(opts, tokenizer)
    with tempfile.TemporaryDirectory() as out:
        trainer = FederatedTrainer(model=model, args=config(opts, out, 2, device, 1), train_dataset=data,
                                   data_collator=collate)
        runner = BatchedClients(trainer)
        batches = [collate([data[c * opts.batch + i] for i in range(opts.batch)]) for c in range(copies)]
        items = torch.tensor([float(loss_items(b, trainer._loss_shifts_labels)) for b in batches],
                             dtype=torch.float64)
        batch, rows = concat_batches(batches, model_pad_id(trainer.model))
        with stacked_clients(trainer.model, copies) as stack:
            stack.routing.route(rows.segments)
            runner.fused_pass(batch, stack, items)  # warm-up
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runner.fused_pass(batch, stack, items)
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("llama", "minilm", "gemma"), default="llama")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--local_steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per setting; the fastest is kept")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sizes", default="1,2,4,8", help="batched_clients values (1 = one at a time)")
    parser.add_argument("--ops_sizes", default="1,4,16", help="C values of the batched_ops_per_step line ('' skips)")
    parser.add_argument("--compile", default="", metavar="BACKEND",
                        help="also run every size with torch_compile on this backend (e.g. inductor): compile_speedup")
    opts = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from fedhf.data.demo import minilm_path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ops_sizes = [int(s) for s in opts.ops_sizes.split(",") if s]
    rows = opts.clients * 16
    if opts.model == "gemma":
        tokenizer = AutoTokenizer.from_pretrained(gemma_path())
        data = gemma_instructions(tokenizer, max(rows, max(ops_sizes, default=1) * opts.batch))
    else:
        tokenizer = AutoTokenizer.from_pretrained(minilm_path())
        data = (blocks(tokenizer, opts.seq, rows) if opts.model == "llama"
                else labelled_tweets(tokenizer, opts.seq, rows))
    sizes = [int(s) for s in opts.sizes.split(",")]
    if sizes[0] != 1:
        parser.error("--sizes must start with 1 (the one-at-a-time reference)")
    results = {}
    with tempfile.TemporaryDirectory() as model_dir:
        for size in sizes:
            results[size] = r = run(size, opts, model_dir, tokenizer, data, device)
            gap = max(float((r["adapter"][n] - results[1]["adapter"][n]).abs().max()) for n in r["adapter"])
            rate = (f"{opts.clients * opts.local_steps * opts.batch / r['seconds']:9.1f} rows/s" if opts.model == "gemma"
                    else f"{opts.clients * opts.local_steps * opts.batch * opts.seq / r['seconds']:9.1f} tokens/s")
            print(f"batched_clients={size:2d}  round {r['seconds']:7.2f} s  {rate}  "
                  f"peak {r['peak_MB']:8.1f} MB  max |adapter - one-at-a-time| {gap:.2e}", flush=True)
        compiled = {}
        for size in sizes if opts.compile else ():
            compiled[size] = r = run(size, opts, model_dir, tokenizer, data, device, opts.compile)
            gap = max(float((r["adapter"][n] - results[size]["adapter"][n]).abs().max()) for n in r["adapter"])
            print(f"batched_clients={size:2d} compiled ({opts.compile})  round {r['seconds']:7.2f} s  "
                  f"max |adapter - eager| {gap:.2e}", flush=True)
        ops = {c: fused_pass_ops(c, opts, model_dir, tokenizer, data, device) for c in ops_sizes}
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)"
    shape = {"llama": f"hidden={opts.hidden} layers={opts.layers}", "minilm": "model=MiniLM-L6 LoRA + head",
             "gemma": "model=Gemma-3-270M LoRA r8 q/v, tweets as instructions"}[opts.model]
    print(f"device={name} threads={torch.get_num_threads()} python={platform.python_version()} torch={torch.__version__} "
          f"clients={opts.clients} local_steps={opts.local_steps} batch={opts.batch} "
          + (f"seq={opts.seq} " if opts.model != "gemma" else "") + shape + f" best of {opts.rounds} rounds")
    print("round_overhead " + " ".join(f"c{s}={100 * results[s]['overhead']:.1f}%" for s in sizes))
    if compiled:
        print(f"compile_speedup ({opts.compile}) " + " ".join(
            f"c{s}={results[s]['seconds'] / compiled[s]['seconds']:.2f}x" for s in sizes))
    if ops:
        print("batched_ops_per_step " + " ".join(f"c{c}={n}" for c, n in ops.items()))
    print("batched_speedup " + " ".join(f"c{s}={results[1]['seconds'] / results[s]['seconds']:.2f}x"
                                                for s in sizes[1:]))


if __name__ == "__main__":
    main()
