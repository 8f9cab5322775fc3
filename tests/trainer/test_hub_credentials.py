"""Nothing carries a credential to the Hub: ``push_to_hub()`` uploads no pickle (training_args.bin), and the pickled
settings hold no ``*_token`` value (REVIEW Part A, N5)."""

from __future__ import annotations

import os
import pickle

import transformers.trainer as hf_trainer

from fedhf.trainer import published
from huggingface_hub.utils import filter_repo_objects

from tests.tiny_bert import tiny_config, tiny_run

FAKE = "hf_FAKE_TOKEN_FOR_THIS_TEST"


class _Recorder:
    """huggingface_hub's upload_folder without the network: the files it would upload, filtered as it filters."""

    def __init__(self):
        self.files, self.folder = [], None

    def upload_folder(self, repo_id, folder_path, ignore_patterns=None, **kwargs):
        files = [os.path.relpath(os.path.join(r, f), folder_path) for r, _, fs in os.walk(folder_path) for f in fs]
        self.files, self.folder = sorted(filter_repo_objects(files, ignore_patterns=ignore_patterns)), folder_path


def test_push_to_hub_uploads_no_pickle_and_the_local_pickle_holds_no_token(tmp_path, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(hf_trainer, "hf_api", lambda: recorder)
    monkeypatch.setattr(published, "hub_is_offline", lambda: False)  # the tests run offline; the upload is recorded
    trainer = tiny_run(tmp_path, num_rounds=1, save_strategy="rounds", save_every_rounds=1, dp_mode="central",
                       dp_clip_norm=0.05, dp_noise_multiplier=1.0, hub_token=FAKE)
    trainer.init_hf_repo = lambda token=None, private=None: setattr(trainer, "hub_model_id", "someone/dp-model")
    trainer.push_to_hub()
    assert "README.md" in recorder.files and "adapter_model.safetensors" in recorder.files
    assert not [f for f in recorder.files if f.endswith((".bin", ".pt", ".pth", ".pkl")) or "checkpoint-" in f]
    with open(os.path.join(recorder.folder, "training_args.bin"), "rb") as f:  # still written, locally
        assert FAKE.encode() not in f.read()


def test_the_pickled_settings_drop_every_token_field_and_keep_the_rest(tmp_path):
    args = tiny_config(tmp_path, hub_token=FAKE, num_rounds=7)
    copy = pickle.loads(pickle.dumps(args))
    assert FAKE.encode() not in pickle.dumps(args)
    assert copy.hub_token is None and args.hub_token == FAKE and copy.num_rounds == 7


def test_push_to_hub_uploads_no_client_state_and_keeps_the_card_arguments(tmp_path, monkeypatch):
    """The clients' spilled states (output_dir/client_state/: each client's optimizer state under DiLoCo) stay local;
    push_to_hub's card arguments reach the card, and a push without them keeps create_model_card's."""
    recorder = _Recorder()
    monkeypatch.setattr(hf_trainer, "hf_api", lambda: recorder)
    monkeypatch.setattr(published, "hub_is_offline", lambda: False)  # the tests run offline; the upload is recorded
    trainer = tiny_run(tmp_path, num_rounds=1, algorithm="diloco", client_state_budget_mb=0.0001)
    trainer.init_hf_repo = lambda token=None, private=None: setattr(trainer, "hub_model_id", "someone/model")
    assert os.listdir(os.path.join(trainer.args.output_dir, "client_state"))  # spilled: there to be left out
    trainer.create_model_card(model_name="my-model", tags=["my-tag"])
    trainer.push_to_hub()
    assert "README.md" in recorder.files and not [f for f in recorder.files if f.startswith("client_state")]
    card = open(os.path.join(recorder.folder, "README.md")).read()
    assert "# my-model" in card and "my-tag" in card
    trainer.push_to_hub(model_name="pushed-name", tags=["push-tag"])
    card = open(os.path.join(recorder.folder, "README.md")).read()
    assert "# pushed-name" in card and "push-tag" in card
