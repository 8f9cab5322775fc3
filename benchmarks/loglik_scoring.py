"""fedhf's log-likelihood scoring against EleutherAI's lm-evaluation-harness on the same rows, offline.

    python benchmarks/loglik_scoring.py                          # the tiny Llama, 600 tweets (a minute or two)
    python benchmarks/loglik_scoring.py --model bundled-gemma-3-270m --rows 500

Rows: the first ``--rows`` of the bundled tweets' test split as instructions ("Tweet: ...\\nSentiment:"), the
candidates " negative" / " neutral" / " positive". fedhf scores them with :func:`fedhf.metrics.score_candidates`
(the labelled-positions head, a row's candidates in one forward); lm-eval scores them through its ``HFLM`` wrapper
around the same in-memory model, from a local task definition written here (``dataset_path: json`` over a JSONL of
the rows, ``output_type: multiple_choice``, ``target_delimiter: ""`` since the candidates carry their space), and
its multiple-choice ``acc`` is the argmax of the unnormalised log-likelihoods. The script prints

    loglik_scoring rows=<n> acc=<fedhf acc> lm_eval_acc=<lm-eval acc> max_abs_logprob_diff=<largest |difference|>

and writes it, with the settings, to benchmarks/loglik_scoring_result.txt. Needs ``pip install lm-eval==0.4.13``
(see setup.cfg's ``lm-eval`` extra).

The tiny Llama (random weights, MiniLM's tokenizer, which has no BOS) is enough for equality: its log-likelihoods
differ between the candidates, so the argmax is a real decision. Gemma-3-270M (``--model bundled-gemma-3-270m``) is
the real model; lm-eval adds Gemma's BOS itself, as fedhf's prompts do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]  # this checkout's fedhf

import torch  # noqa: E402

from fedhf.data import bundled_gemma  # noqa: E402
from fedhf.data.demo import TWEET_LABELS, load_tweet_instructions, minilm_path, tiny_llama  # noqa: E402
from fedhf.metrics import score_candidates  # noqa: E402

CHOICES = [" " + label for label in TWEET_LABELS]
TASK = "fedhf_tweets_loglik"
RESULT = os.path.join(HERE, "loglik_scoring_result.txt")


def task_yaml(rows_path: str) -> str:
    return "\n".join([
        f"task: {TASK}",
        "dataset_path: json",
        "dataset_kwargs:",
        f"  data_files: {{test: {json.dumps(rows_path)}}}",
        "test_split: test",
        "output_type: multiple_choice",
        'doc_to_text: "{{prompt}}"',
        f"doc_to_choice: {json.dumps(CHOICES)}",
        "doc_to_target: label",
        'target_delimiter: ""',
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        ""])


def load(model_name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_name == "bundled-tiny-llama":
        tokenizer = AutoTokenizer.from_pretrained(minilm_path())
        return tiny_llama(len(tokenizer), seed=0).eval(), tokenizer
    path = bundled_gemma.gemma_3_270m_path()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def lm_eval_scores(model, tokenizer, rows, batch_size: int):
    """lm-eval's acc and its per-row candidate log-likelihoods (rows, candidates), via a local task."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as folder:
        data = os.path.join(folder, "rows.jsonl")
        with open(data, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        with open(os.path.join(folder, f"{TASK}.yaml"), "w") as f:
            f.write(task_yaml(data))
        # special tokens as fedhf's prompts have them: Gemma's BOS, none for MiniLM's tokenizer (no BOS; its
        # [CLS]/[SEP] are not a causal LM's); the prefix token only matters for an empty context (none here)
        has_bos = tokenizer.bos_token_id is not None
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, add_bos_token=has_bos,
                  prefix_token_id=tokenizer.bos_token_id if has_bos else tokenizer.pad_token_id)
        out = simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=folder),
                              num_fewshot=0, log_samples=True, bootstrap_iters=0)
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    logprobs = torch.tensor([[float(r[0]) for r in s["filtered_resps"]] for s in samples], dtype=torch.float64)
    return out["results"][TASK]["acc,none"], logprobs


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bundled-tiny-llama", choices=["bundled-tiny-llama", bundled_gemma.NAME])
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--out", default=RESULT)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    test = load_tweet_instructions()["test"].select(range(args.rows))
    rows = [{"prompt": p, "label": int(y)} for p, y in zip(test["prompt"], test["label"])]
    model, tokenizer = load(args.model)
    started = time.time()
    ours = score_candidates(model, tokenizer, [r["prompt"] for r in rows], CHOICES, [r["label"] for r in rows],
                            rows_per_forward=args.batch_size)
    fedhf_s = time.time() - started
    started = time.time()
    their_acc, their_logprobs = lm_eval_scores(model, tokenizer, rows, args.batch_size)
    lm_eval_s = time.time() - started
    diff = float((ours.logprobs - their_logprobs).abs().max())
    their_argmax_acc = float((their_logprobs.argmax(1) == ours.answers).double().mean())
    line = (f"loglik_scoring rows={len(rows)} acc={ours.accuracy:.4f} lm_eval_acc={their_acc:.4f} "
            f"max_abs_logprob_diff={diff:.3g}")
    notes = [f"model={args.model} candidates={CHOICES} rows: the first {len(rows)} of the bundled tweets' test split",
             f"fedhf mean log-prob of the right answer={ours.answer_logprob:.4f}; predictions that differ: "
             f"{int((ours.predictions != their_logprobs.argmax(1)).sum())}; lm-eval acc recomputed from its "
             f"log-likelihoods={their_argmax_acc:.4f}",
             f"time: fedhf {fedhf_s:.1f} s, lm-eval {lm_eval_s:.1f} s (batch {args.batch_size}, "
             f"{torch.get_num_threads()} threads)",
             f"lm-eval {__import__('lm_eval').__version__}, torch {torch.__version__}"]
    print(line)
    for note in notes:
        print("  " + note)
    with open(args.out, "w") as f:
        f.write(line + "\n" + "".join(f"  {n}\n" for n in notes))
    return line


if __name__ == "__main__":
    main()
