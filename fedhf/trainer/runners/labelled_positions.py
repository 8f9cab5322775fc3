"""A causal LM's head and loss only at its labelled positions in FederatedTrainer (``logits_at_labels_only``;
the model side is fedhf/runtime/labelled_logits.py): when a trainer may cut its inputs to those positions, and
Trainer's ``compute_loss``/``prediction_step`` with the inputs cut."""

from __future__ import annotations

from ...runtime.labelled_logits import at_labelled_positions, predicts_at_positions


def projects_labelled_positions_only(trainer) -> bool:
    """Whether ``trainer`` computes a causal LM's head only where labels are (same loss and gradients); not under a
    loss that reads logits (label smoothing, ``compute_loss_func``, a subclass's ``reads_every_logit``).

    Not client-parallel either: there 2 processes gave FedPAC-Muon a LoRA entry 1.9e-3 away from 1 process
    (FedAvg, SCAFFOLD: 1e-8), against 6e-7 with every position; Muon's orthogonalisation amplifies rounding in weak
    gradient directions, and which rounding shifts it this much is not yet understood."""
    args = trainer.args
    return (args.logits_at_labels_only and not args.client_parallel and not trainer.reads_every_logit
            and trainer.label_smoother is None and trainer.compute_loss_func is None
            and predicts_at_positions(trainer.model))


def own_loss(trainer) -> bool:
    """Whether ``trainer`` computes its loss with :class:`LabelledPositionsLoss`'s ``compute_loss`` (no subclass
    override, which gets what it gets under Trainer: every position's logits)."""
    return type(trainer).compute_loss is LabelledPositionsLoss.compute_loss


class LabelledPositionsLoss:
    """Trainer's ``compute_loss`` and ``prediction_step``, with a causal LM's inputs cut to its labelled positions
    when ``self.labelled_logits`` (set by :func:`projects_labelled_positions_only`). A base of FederatedTrainer
    before ``Trainer``, so ``super()`` reaches Trainer's (or trl's SFTTrainer's, under FederatedSFTTrainer)."""

    reads_every_logit = False  # a subclass whose compute_loss reads every position's logits sets True
    labelled_logits = False  # set per trainer by projects_labelled_positions_only

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer's loss; a causal LM projects only its labelled positions (``logits_at_labels_only``) when
        nothing reads its logits: every training loss here (evaluation: :meth:`prediction_step`)."""
        if self.labelled_logits and not return_outputs:
            inputs = at_labelled_positions(inputs)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Trainer's; an evaluation of the loss alone (no ``compute_metrics``) projects only labelled positions,
        unless a subclass overrides ``compute_loss``: Trainer's ``prediction_step`` calls it with
        ``return_outputs=True``, and it gets what it gets under Trainer, every position's logits (a weighted loss,
        an auxiliary term read them). Training is unaffected: an override that calls ``super().compute_loss`` gets
        the cut there, one that runs the model itself its full inputs."""
        if self.labelled_logits and prediction_loss_only and own_loss(self):
            inputs = at_labelled_positions(inputs)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
