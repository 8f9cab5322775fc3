"""What the user says about a model through Trainer's ``create_model_card`` (and ``push_to_hub``, which passes its
keyword arguments on): the card's title and its Hub metadata. fedhf writes its own card, and these arguments go
into it rather than being dropped:

- ``model_name`` -> the title (default: the output folder's name, as Trainer's ``push_to_hub`` also passes);
- ``dataset`` / ``dataset_tags`` -> ``datasets:``; ``tags`` -> added to fedhf's tags; ``language`` ->
  ``language:``; ``license`` -> ``license:`` (replacing a bundled base's own); ``finetuned_from`` ->
  ``base_model:`` when the base's Hub id is not known; ``tasks`` -> ``pipeline_tag:`` (one task).
``dataset_args`` (a dataset's configuration name) only shapes Trainer's eval-results table, which fedhf's card
does not carry: it is accepted and not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

Names = Union[str, Sequence[str], None]


def _listed(value: Names) -> List[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


@dataclass(frozen=True)
class CardDetails:
    title: Optional[str] = None
    language: List[str] = ()
    license: Optional[str] = None
    tags: List[str] = ()
    datasets: List[str] = ()
    finetuned_from: Optional[str] = None
    pipeline_tag: Optional[str] = None


CARD_ARGUMENTS = ("language", "license", "tags", "model_name", "finetuned_from", "tasks", "dataset_tags", "dataset",
                  "dataset_args")  # Trainer.create_model_card's, which push_to_hub passes on


def card_details(language: Names = None, license: Optional[str] = None, tags: Names = None,
                 model_name: Optional[str] = None, finetuned_from: Optional[str] = None, tasks: Names = None,
                 dataset_tags: Names = None, dataset: Names = None, dataset_args: Names = None) -> CardDetails:
    """``Trainer.create_model_card``'s arguments, as the card uses them."""
    tasks = _listed(tasks)
    return CardDetails(title=model_name, language=_listed(language), license=license, tags=_listed(tags),
                       datasets=list(dict.fromkeys(_listed(dataset) + _listed(dataset_tags))),
                       finetuned_from=finetuned_from, pipeline_tag=tasks[0] if len(tasks) == 1 else None)


def with_details(metadata: dict, details: CardDetails) -> dict:
    """The card's metadata with the user's details added (their tags after fedhf's, without repeats)."""
    out = dict(metadata)
    out["tags"] = list(dict.fromkeys(list(metadata.get("tags", [])) + list(details.tags)))
    if details.datasets:
        out["datasets"] = list(details.datasets)
    if details.language:
        out["language"] = list(details.language)
    if details.license:
        out["license"] = details.license
    if details.finetuned_from and "base_model" not in out:
        out["base_model"] = details.finetuned_from
    if details.pipeline_tag:
        out["pipeline_tag"] = details.pipeline_tag
    return out
