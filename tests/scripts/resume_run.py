"""A stateful run (SCAFFOLD client variates + an Adam server) used by test_checkpoint.py:

    python tests/scripts/resume_run.py OUT_DIR RESULT.safetensors [--kill-after N] [--resume] [--algorithm NAME]
        [--uplink SPEC] [--downlink SPEC] [--state-budget-mb MB] [--rounds R]

Default: SCAFFOLD with an Adam server; ``--algorithm`` runs a named algorithm at its defaults instead (state that
outlives a round: fedmuon's broadcast momentum, fed_sophia's per-client Hessian estimates). ``--uplink`` and
``--downlink`` compress (with error feedback: per-client residuals and the server's held model to resume);
``--state-budget-mb`` makes the client store spill; ``--rounds`` (default 5).

--kill-after N sends SIGKILL to this very process once round N's checkpoint is written (a real crash:
no cleanup, no exception handlers).
"""

from __future__ import annotations

import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fedhf.data.demo import load_digits_images  # noqa: E402
from tests.helpers import config, digit_trainer, tiny_resnet


class KillAfter(TrainerCallback):
    def __init__(self, round_number: int) -> None:
        self.round_number = round_number

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.round_number:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv) -> None:
    import pathlib

    out_dir, result = pathlib.Path(argv[0]), argv[1]
    kill_after = int(argv[argv.index("--kill-after") + 1]) if "--kill-after" in argv else None
    torch.set_num_threads(1)
    digits = load_digits_images()
    digits["test"] = digits["test"].select(range(120))
    model = tiny_resnet()
    named = argv[argv.index("--algorithm") + 1] if "--algorithm" in argv else None
    algorithm = {"algorithm": named} if named else {"algorithm": "scaffold", "server_rule": "adam",
                                                    "server_rule_kwargs": {"lr": 0.01}}
    options = {"--uplink": "uplink_compression", "--downlink": "downlink_compression",
               "--state-budget-mb": "client_state_budget_mb"}
    extra = {field: argv[argv.index(flag) + 1] for flag, field in options.items() if flag in argv}
    if "client_state_budget_mb" in extra:
        extra["client_state_budget_mb"] = float(extra["client_state_budget_mb"])
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
    args = config(out_dir, **algorithm, num_clients=6, clients_per_round=3, num_rounds=rounds, local_steps=3,
                  save_every_rounds=1, eval_every_rounds=1, **extra)
    args.output_dir = str(out_dir)
    callbacks = [KillAfter(kill_after)] if kill_after else None
    trainer = digit_trainer(model, digits, args, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if "--resume" in argv else None)
    state = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    state.update({n: b.detach().contiguous() for n, b in model.named_buffers() if b.is_floating_point()})
    save_file(state, result)


def run_here(out_dir, result, *flags) -> None:
    """:func:`main` in the calling process (a test's: no interpreter start-up and imports, seconds per run); only a
    run that is killed needs its own process. ``main`` pins one torch thread, as in this script's processes; the
    caller's count is restored afterwards."""
    threads = torch.get_num_threads()
    try:
        main([str(out_dir), str(result), *flags])
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main(sys.argv[1:])
