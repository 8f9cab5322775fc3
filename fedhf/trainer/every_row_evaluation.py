"""Evaluation over several processes, equal to one process's: every process evaluates every row.

Trainer splits the evaluation set over the processes (accelerate's ``BatchSamplerShard``) and, to keep the
processes in step, pads the last batches with rows from the start (``even_batches``); its loss is the mean over
the gathered per-batch means, each repeated for the batch's rows. The padded batch's mean counts some rows twice,
and the batches themselves differ from one process's, so ``eval_loss`` (and the best round, early stopping)
depended on the number of processes. Here the evaluation loader is not split: every process runs one process's
batches, in its order, and keeps its own results (nothing to gather), so the metrics are one process's exactly. It
costs each process the whole evaluation, which FSDP needs anyway (every process must run every forward of the
sharded model). An iterable evaluation set, which accelerate dispatches from process 0, keeps Trainer's split.
"""

from __future__ import annotations

from functools import partial

from accelerate.data_loader import BatchSamplerShard
from accelerate.utils import recursively_apply


def every_row(dataloader) -> bool:
    """Turns accelerate's split of a prepared evaluation loader off (one process's batches, without padding);
    True when it did (a map-style dataset's loader), False for a loader it does not split by batch sampler."""
    sampler = dataloader.batch_sampler
    if not isinstance(sampler, BatchSamplerShard):
        return False
    sampler.num_processes, sampler.process_index, sampler.even_batches = 1, 0, False
    return True


def own_results(gradient_state, data):
    """The gather of an evaluation whose every process holds every row: this process's results, the last batch's
    cut to its rows as ``gather_for_metrics`` cuts them on one process (Trainer repeats a batch's loss for
    ``eval_batch_size`` rows, which a partial last batch does not have)."""
    if gradient_state.end_of_dataloader and gradient_state.remainder > 0:
        return recursively_apply(lambda tensor: tensor[:gradient_state.remainder], data)
    return data


class EveryRowEvaluation:
    """Trainer's ``evaluation_loop`` over every row on every process (module docstring). A base of
    FederatedTrainer before ``Trainer``; personalised evaluation goes through it too."""

    def evaluation_loop(self, dataloader, *args, **kwargs):
        if self.args.world_size > 1 and every_row(dataloader):
            # Trainer resets it to gather_for_metrics after its loop
            self.gather_function = partial(own_results, self.accelerator.gradient_state)
        return super().evaluation_loop(dataloader, *args, **kwargs)
