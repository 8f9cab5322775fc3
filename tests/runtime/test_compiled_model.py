"""torch_compile: the resident model compiled once, in place; clients, rounds, evaluations and batched chunks reuse
its graphs. dynamo's own counters (``frames.total``: every frame compiled, a recompile included) say how often it
compiled; the ``aot_eager`` backend traces forward and backward as inductor does, without its slow C++ build."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from torch._dynamo.utils import counters
from transformers import TrainerCallback

from fedhf import FederatedTrainer
from fedhf.data.demo import tiny_llama
from fedhf.data.sft import SFTCollator

from tests.helpers import IdsOnly, answer_rows, config, trainable_state


class _CompileCounts(TrainerCallback):
    """dynamo's compiled-frame count at the end of each round and of each evaluation."""

    def __init__(self) -> None:
        self.rounds, self.evaluations = [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.rounds.append(counters["frames"]["total"])

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations.append(counters["frames"]["total"])


def _run(tmp_path, batched: int, backend=None):
    counters.clear()
    torch._dynamo.reset()
    model = get_peft_model(tiny_llama(100, num_layers=1), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type=TaskType.CAUSAL_LM))
    compile_settings = {} if backend is None else {"torch_compile": True, "torch_compile_backend": backend}
    # 3 clients of 16 rows: with batched_clients=2, every round trains a chunk of 2 clients, then a chunk of 1
    args = config(tmp_path / f"{batched}{backend}", num_clients=3, clients_per_round=3, num_rounds=2, local_steps=2,
                  per_device_train_batch_size=4, per_device_eval_batch_size=4, batched_clients=batched,
                  learning_rate=0.5, partition="iid", eval_every_rounds=1, **compile_settings)
    rows = answer_rows(56)  # 12 tokens, 3 labelled, per row: every batch has one shape
    counts = _CompileCounts()
    trainer = FederatedTrainer(model=model, args=args, train_dataset=rows.select(range(48)),
                               eval_dataset=rows.select(range(48, 56)), data_collator=SFTCollator(IdsOnly()),
                               callbacks=[counts])
    initial = trainable_state(model)
    trainer.train()
    return initial, trainable_state(model), counts


@pytest.mark.parametrize("batched", [1, 2])
def test_the_model_compiles_once_and_no_client_round_or_evaluation_recompiles_it(tmp_path, batched):
    initial, compiled, counts = _run(tmp_path, batched, backend="aot_eager")
    # What compiles, all in round 1 and its evaluation (dynamic=None, as Trainer's: static shapes first):
    # * one client at a time: its first forward (1 frame); the 3 clients x 2 steps after it reuse the graph;
    # * batched_clients=2: the chunk of C=2 (1 frame), then the chunk of C=1, whose rows (and labelled positions)
    #   differ in number: one recompile, with the batch size symbolic from then on (1 more);
    # * the evaluation: grad mode off is a guard of its own: one recompile.
    # Nothing after that: round 2, its clients and chunks and evaluations reuse the graphs.
    first_round = {1: 1, 2: 2}[batched]
    assert counts.rounds == [first_round, first_round + 1]
    assert counts.evaluations == [first_round + 1] * 2
    assert not counters["graph_break"], dict(counters["graph_break"])  # one graph: no eager fallback in between
    _, eager, _ = _run(tmp_path, batched)
    assert counters["frames"]["total"] == 0  # torch_compile off: nothing compiled
    for name in eager:  # the compiled model trains what the eager one does (it did train)
        assert not torch.equal(eager[name], initial[name])
        torch.testing.assert_close(compiled[name], eager[name], rtol=0, atol=1e-6, msg=name)


def test_the_users_backend_and_mode_reach_compile(tmp_path):
    """``torch_compile_backend`` and ``torch_compile_mode`` are what the resident model is compiled with (the call is
    recorded: a mode such as "reduce-overhead" is for inductor's CUDA graphs)."""
    from fedhf.runtime.compiled_model import compile_resident

    class Recorded(torch.nn.Linear):
        def compile(self, **kwargs):
            self.compiled_with = kwargs

    model = Recorded(2, 2)
    compile_resident(model, config(tmp_path, torch_compile=True, torch_compile_backend="aot_eager",
                                   torch_compile_mode="reduce-overhead"))
    assert model.compiled_with == {"backend": "aot_eager", "mode": "reduce-overhead", "dynamic": None}
    plain = Recorded(2, 2)
    compile_resident(plain, config(tmp_path))
    assert not hasattr(plain, "compiled_with")
