"""What FederatedTrainer saves and publishes: Trainer's ``save_model``/``_save``/``create_model_card`` overridden so
that the saved model is the one ``evaluate()`` evaluates (merged into the base where a server rule folds into it)
and carries the federated model card (fedhf/trainer/hub.py). A base of FederatedTrainer before ``Trainer``, so
``super()`` reaches Trainer's."""

from __future__ import annotations

import copy
import os
from typing import Optional

import torch
import transformers.trainer as hf_trainer
from transformers.trainer import TRAINING_ARGS_NAME

from ..state.checkpoint import PREFIX
from .card_details import CARD_ARGUMENTS, CardDetails, card_details
from .hub import UNPUBLISHED, hub_is_offline, offline_push_message, saved_model, write_model_card


class PublishedModel:
    loaded_best_round = None  # the round load_best_model_at_end loaded at the end of train(), if it did
    _gathered_state = None  # under FSDP, the whole model's state dict while it is written (save_model, checkpoints)

    card_details = CardDetails()  # what the last create_model_card() was told (title, datasets, tags, ...)

    def create_model_card(self, language=None, license=None, tags=None, model_name=None, finetuned_from=None,
                          tasks=None, dataset_tags=None, dataset=None, dataset_args=None) -> None:
        """The federated model card (fedhf/trainer/hub.py) in output_dir/README.md: Trainer's push_to_hub() uploads
        it. Trainer's arguments are honoured (fedhf/trainer/card_details.py) and kept for every later card."""
        self.card_details = card_details(language, license, tags, model_name, finetuned_from, tasks, dataset_tags,
                                         dataset, dataset_args)
        if self.is_world_process_zero():
            self._write_card(self.args.output_dir)

    def save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False) -> None:
        """Trainer's save_model (and so push_to_hub), then the federated card beside the weights/adapter (replacing
        peft's card). What is written is :meth:`published_model`: the model ``evaluate()`` evaluates. Under FSDP
        every process first gathers the model once, and process 0 writes one consolidated checkpoint of it."""
        self._gathered_state = self.shards.full_state_dict() if self.shards.active else None
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            self._gathered_state = None
        if self.is_world_process_zero():
            self._write_card(output_dir or self.args.output_dir)

    def push_to_hub(self, commit_message: Optional[str] = "End of training", blocking: bool = True,
                    token: Optional[str] = None, revision: Optional[str] = None, private: Optional[bool] = None,
                    **kwargs):
        """Trainer's ``push_to_hub`` (save_model, the card, one upload of output_dir), except that:

        - nothing private is uploaded: Trainer's upload skips only ``_*`` and checkpoint folders, so training_args.bin
          (the pickled settings) and ``client_state/`` (each client's spilled optimizer or correction state) would
          go to the Hub; the round pushes skip the same (fedhf/trainer/hub.py, ``UNPUBLISHED``);
        - Trainer's card arguments in ``kwargs`` (``model_name``, ``tags``, ``dataset``, ...) go into fedhf's card as
          ``create_model_card``'s do; with none, the card keeps what an earlier ``create_model_card`` was told;
        - offline, the model and its card are saved to output_dir first and the error says how to upload them
          later, instead of huggingface_hub's transport error."""
        card_arguments = {k: v for k, v in kwargs.items() if k in CARD_ARGUMENTS}
        if hub_is_offline():
            self.save_model()
            if card_arguments:
                self.create_model_card(**card_arguments)
            raise OSError(offline_push_message(self.args.output_dir, self.args.hub_model_id))
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        if card_arguments:
            self.create_model_card(**card_arguments)
        self._finish_current_push()
        return hf_trainer.hf_api().upload_folder(
            repo_id=self.hub_model_id, folder_path=self.args.output_dir, commit_message=commit_message, token=token,
            run_as_future=not blocking, revision=revision if revision is not None else self.args.hub_revision,
            ignore_patterns=["_*", f"{PREFIX}*", *UNPUBLISHED])

    def published_model(self):
        """The model that save_model(), push_to_hub() and the round checkpoints' model/ write.

        A server rule that folds into the base (FedEx-LoRA, FLoRA) has changed frozen base weights that a peft
        adapter does not carry: the adapter alone would reload onto the original base as another model (under
        FLoRA, the untrained base). So it is the full model with the adapter merged, W + s B A (peft's
        ``merge_and_unload`` on a copy: the resident model keeps training), which loads with
        ``AutoModelFor*.from_pretrained``. Otherwise it is the resident model (a peft adapter or full weights)."""
        if not self.base_fold.layers:
            return self.model
        return copy.deepcopy(self.model).merge_and_unload()

    def _save(self, output_dir: Optional[str] = None, state_dict=None) -> None:
        """Trainer's ``_save`` of :meth:`published_model` (see there); the merged model is written as Trainer writes
        a model (weights as safetensors, config, processing class, training_args.bin)."""
        if state_dict is None:  # FSDP: the whole model gathered by save_model (the resident one holds shards)
            state_dict = self._gathered_state
        if not self.base_fold.layers:
            return super()._save(output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return None
        os.makedirs(output_dir, exist_ok=True)
        self._write_published(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
        return None

    def _write_published(self, directory: str) -> None:
        """:meth:`published_model` as safetensors, with the tokenizer/processor."""
        gathered = {} if self._gathered_state is None else {"state_dict": self._gathered_state}  # FSDP: whole
        self.published_model().save_pretrained(directory, safe_serialization=True, **gathered)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(directory)

    def _write_model(self, directory: str) -> None:
        """The global model as ``save_model`` writes it (:meth:`published_model`: a peft adapter, full weights, or
        the merged model of a rule that folds into the base) as safetensors, with its tokenizer/processor; unlike
        ``save_model`` it writes no pickled training_args.bin."""
        self._write_published(os.path.join(directory, "model"))
        self._write_card(os.path.join(directory, "model"), latest=True)

    def _write_card(self, directory: str, latest: bool = False) -> None:
        """The card of the resident model: the best round's when ``load_best_model_at_end`` loaded it, else (and
        with ``latest``: a round checkpoint's) the last round's."""
        os.makedirs(directory, exist_ok=True)
        round_index = None if latest else self.loaded_best_round
        saved = saved_model(self.model, bool(self.base_fold.layers), round_index)
        write_model_card(directory, self.args, self.algorithm, self.partition_summary, self.federated_history,
                         self.model, saved, self.card_details, self.world.describe())
