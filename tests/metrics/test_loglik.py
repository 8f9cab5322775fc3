"""Log-likelihood scoring of closed-set answers against each candidate scored alone through the full head, the
FlowerTune finance rule on hand cases, the unparseable rate, and the callback reporting all of them."""

import pytest
import torch
from transformers import TrainingArguments

from fedhf.data.demo import tiny_llama
from fedhf.metrics import GenerationEvalCallback, flowertune_accuracy, score_candidates, unparseable_rate
from fedhf.metrics.generation import flowertune_label
from fedhf.runtime.labelled_logits import predicts_at_positions

CHOICES = [" negative", " neutral", " positive"]
PROMPTS = ["Tweet: good day\nSentiment:", "Tweet: a much longer tweet about the rain today\nSentiment:",
           "Tweet: meh\nSentiment:"]


def _alone(model, tokenizer, prompt, answer):
    """log p(answer | prompt): one unpadded sequence, the full head, the log-softmax summed over the answer's tokens."""
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    tail = tokenizer(answer, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([head + tail])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    return sum(float(logprobs[len(head) - 1 + j, t]) for j, t in enumerate(tail))


# one token each (one sequence per prompt serves all three), and of several lengths (a sequence per candidate)
@pytest.mark.parametrize("choices", [CHOICES, [" very negative", " neutral", " rather positive indeed"]])
def test_scores_are_each_candidates_log_probability_and_the_argmax(tokenizer, choices):
    lengths = {len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in choices}
    assert lengths == ({1} if choices is CHOICES else {1, 2, 3})  # the case each parameter stands for
    model = tiny_llama(len(tokenizer), seed=3).eval()
    assert predicts_at_positions(model)  # the scoring goes through the labelled-positions head
    answers = [2, 0, 1]
    scores = score_candidates(model, tokenizer, PROMPTS, choices, answers, rows_per_forward=2)  # padded batches
    expected = torch.tensor([[_alone(model, tokenizer, p, c) for c in choices] for p in PROMPTS], dtype=torch.float64)
    torch.testing.assert_close(scores.logprobs, expected, rtol=0, atol=1e-4)
    picked = expected.argmax(1)
    assert scores.accuracy == pytest.approx(float((picked == torch.tensor(answers)).double().mean()))
    assert scores.answer_logprob == pytest.approx(float(expected[range(3), answers].mean()), abs=1e-4)
    with pytest.raises(ValueError, match="two distinct"):
        score_candidates(model, tokenizer, PROMPTS, [" a", " a"], answers)


def test_flowertune_rule_is_the_finance_substring_rule():
    assert flowertune_label("It is Positive and negative") == "positive"  # positive is checked first
    assert flowertune_label("rather Negative") == "negative"
    assert flowertune_label("NEGATIVE") == "neutral"  # only the two spellings count
    assert flowertune_label("unclear") == "neutral" and flowertune_label("") == "neutral"
    assert flowertune_accuracy([" positive!", " nothing", " so negative"], [" positive", " neutral", " positive"]) \
        == pytest.approx(2 / 3)


def test_unparseable_rate_counts_first_words_outside_the_choices():
    assert unparseable_rate([" positive.", " the", "Neutral", ""], CHOICES) == pytest.approx(2 / 4)


def test_the_callback_reports_loglik_beside_the_generative_score(tokenizer, tmp_path):
    model = tiny_llama(len(tokenizer), seed=3).eval()
    answers = [" positive", " negative", " neutral"]
    callback = GenerationEvalCallback(tokenizer, PROMPTS, answers, choices=CHOICES, answer_rule="flowertune")
    metrics = {"eval_loss": 1.0}
    callback.on_evaluate(TrainingArguments(str(tmp_path), per_device_eval_batch_size=2, use_cpu=True), None, None,
                         model=model, metrics=metrics)
    scores = score_candidates(model, tokenizer, PROMPTS, CHOICES, [2, 0, 1])
    assert metrics["eval_loglik_accuracy"] == scores.accuracy
    assert metrics["eval_loglik_answer_logprob"] == scores.answer_logprob
    assert 0.0 <= metrics["eval_generation_unparseable_rate"] <= 1.0 and "eval_generation_accuracy" in metrics
    with pytest.raises(ValueError, match="not among `choices`"):
        GenerationEvalCallback(tokenizer, PROMPTS, ["positive"] * 3, choices=CHOICES)
    with pytest.raises(ValueError, match="answer_rule"):
        GenerationEvalCallback(tokenizer, PROMPTS, answers, answer_rule="fuzzy")


@pytest.mark.parametrize("choices", [CHOICES, [" very negative", " neutral", " rather positive indeed"]])
def test_a_prompt_with_no_tokens_is_refused(tokenizer, choices):
    """MiniLM has no BOS: an empty prompt leaves the candidate's first token with nothing to be predicted from.
    Scored in a batch with other prompts it read another position's distribution (one token each) or dropped that
    token's term; it is refused instead."""
    assert tokenizer.bos_token_id is None
    model = tiny_llama(len(tokenizer), seed=3).eval()
    with pytest.raises(ValueError, match="no tokens"):
        score_candidates(model, tokenizer, ["", PROMPTS[0]], choices, [0, 1])
