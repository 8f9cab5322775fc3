"""fedhf's tiny reference run (fedhf/interactions/reference.py: a 1-layer Llama with LoRA on 32 synthetic rows,
4 clients, 3 sampled per round) as a Flower app: ``server_app`` runs fedhf's round loop, ``client_app`` fedhf's
client half on the clients named by each SuperNode's ``partition-ids``.

``make_trainer`` is the one function both sides and the simulation share: the simulation is
``make_trainer(context, None).train()`` in one process (tests/flower/test_parity.py compares the two).
"""

from __future__ import annotations

import os
from typing import List, Optional

from safetensors.torch import save_file

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.core.params import trainable_parameters
from fedhf.flower import build_client_app, build_server_app
from fedhf.interactions.reference import BASE, collate, model, rows

RESULT = "final_trainable.safetensors"


def make_trainer(context, partition_ids: Optional[List[int]], **settings) -> FederatedTrainer:
    """The run's trainer: on the server (``partition_ids`` None) and on a node (its clients' ids). Every node holds
    the same synthetic rows here; a real node would load only its own clients' rows (``client_partitions``).
    ``settings``: more FederatedConfig fields (the tests' variations)."""
    config = context.run_config
    where = "server" if partition_ids is None else f"node-{context.node_id}"
    args = FederatedConfig(output_dir=os.path.join(str(config["output-dir"]), where),
                           **{**BASE, "algorithm": str(config["algorithm"]), "num_rounds": int(config["num-rounds"]),
                              **settings})
    return FederatedTrainer(model=model(), args=args, train_dataset=rows(), data_collator=collate)


def save_result(trainer: FederatedTrainer, context) -> None:
    """The run ends as the simulation does (the model saved in the server's output_dir), plus its trainable
    tensors in one file to compare with a simulated run."""
    trainer.save_model()
    tensors = {n: p.detach().contiguous() for n, p in trainable_parameters(trainer.model).items()}
    save_file(tensors, os.path.join(trainer.args.output_dir, RESULT))


server_app = build_server_app(make_trainer, finish=save_result, timeout=300.0)
client_app = build_client_app(make_trainer)
