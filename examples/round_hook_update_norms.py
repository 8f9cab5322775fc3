"""A round hook written by a user: each round's client update norms in the history, and a client blocklist.

fedhf calls a hook at each event of its round loop (docs/round_hooks.md). This one overrides three events:

* ``select_clients``: drops the clients of a blocklist from every round (say, devices known to be faulty);
* ``on_client_message``: reads each client's model change (its ``dx.*`` tensors; it changes nothing, so it returns
  the messages as they came); on several processes it sees only this process's clients, and under FSDP this
  process's rows of each tensor, so the squared norm is summed over the shards (``sum_over_shards``) and the norms
  gathered over the processes (``gather_over_processes``) before they are logged;
* ``after_aggregate``: adds the round's median and largest update norm to the round's log, which the history file,
  the plots and ``report_to`` loggers then carry.

Its state across rounds (the blocked clients seen) goes into the round checkpoint through ``checkpoint_state`` and
comes back on resume through ``restore_state``. Run offline on the digits with a small ResNet (a few seconds)::

    python examples/round_hook_update_norms.py --output_dir outputs/round_hook
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Dict, List, Sequence, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import ResNetConfig, ResNetForImageClassification  # noqa: E402

from fedhf import (ClientMessages, FederatedConfig, FederatedTrainer, RoundHook, gather_over_processes,  # noqa: E402
                   sum_over_shards)
from fedhf.data.demo import load_digits_images  # noqa: E402
from fedhf.metrics import accuracy_metrics  # noqa: E402


class UpdateNorms(RoundHook):
    # Under client-level DP fedhf writes only the keys a user hook declares here: the norms are read from unclipped,
    # un-noised client messages, so they are withheld then; the blocked count depends on the blocklist alone.
    released_under_dp = ("blocked_clients_total",)

    def __init__(self, blocklist: Sequence[int] = ()) -> None:
        self.blocklist = set(blocklist)
        self.norms: Dict[int, float] = {}  # this process's clients of the round
        self.blocked_total = 0

    def select_clients(self, trainer, run, clients: Sequence[int]) -> List[int]:
        kept = [c for c in clients if c not in self.blocklist]
        self.blocked_total += len(clients) - len(kept)
        return kept

    def before_round(self, trainer, run) -> None:
        self.norms = {}

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        change = [t.double().pow(2).sum() for k, t in sent.own.tensors.items() if k.startswith("dx.")]
        self.norms[ctx.client_id] = float(sum_over_shards(trainer, torch.stack(change).sum()).sqrt())
        return sent

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        norms = list(gather_over_processes(trainer, self.norms).values())  # every process calls it
        if norms:
            entry.update({"update_norm_median": statistics.median(norms), "update_norm_max": max(norms)})
        entry["blocked_clients_total"] = self.blocked_total

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, Dict[str, torch.Tensor]]]:
        return {"update_norms": {"blocked_total": self.blocked_total}}, {}

    def restore_state(self, trainer, run, meta: dict, groups) -> None:
        self.blocked_total = int(meta.get("update_norms", {}).get("blocked_total", 0))


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="outputs/round_hook")
    parser.add_argument("--num_rounds", type=int, default=3)
    cli = parser.parse_args(argv)
    digits = load_digits_images()
    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_channels=1, embedding_size=16, hidden_sizes=[16, 32],
                                                      depths=[1, 1], layer_type="basic", num_labels=10))
    args = FederatedConfig(output_dir=cli.output_dir, overwrite_output_dir=True, report_to="none", use_cpu=True,
                           disable_tqdm=True, num_clients=8, clients_per_round=4, num_rounds=cli.num_rounds,
                           local_steps=2, per_device_train_batch_size=16, eval_every_rounds=cli.num_rounds, seed=0)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=digits["train"], eval_dataset=digits["test"],
                               compute_metrics=accuracy_metrics, round_hooks=[UpdateNorms(blocklist=[0, 1])])
    trainer.train()
    for entry in trainer.federated_history:
        print(f"round {entry['round']}: {entry['participants']} clients, median update norm "
              f"{entry['update_norm_median']:.4f}, blocked so far {entry['blocked_clients_total']}")
    return trainer.federated_history


if __name__ == "__main__":
    main()
