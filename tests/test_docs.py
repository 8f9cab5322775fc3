"""The documentation points only at things that exist: every relative link and every repository path named in
README.md, docs/*.md and benchmarks/README.md resolves, and every ``docs/algorithms.md <section>`` cited in the code
names a heading of docs/algorithms.md."""

from __future__ import annotations

import glob
import json
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
CODE_DIRS = ("fedhf", "tests", "benchmarks", "examples")

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
# A repository path named in prose or code spans: it starts at one of the top folders, e.g. `fedhf/trainer/config/settings.py`.
_PATH = re.compile(r"(?<![\w./<-])((?:fedhf|tests|benchmarks|recipes|examples|docs)/[\w./*<>-]*)")
_SECTION = r"\d+(?:\.\d+)?[a-z]?"
_CITATION = re.compile(r"docs/algorithms\.md\s+(?:sections?\s+|table\s+)?(" + _SECTION + r"(?:\s*(?:,|-|and)\s*"
                       r"(?:table\s+)?" + _SECTION + r")*)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set:
    return {_slug(h) for h in _HEADING.findall(_without_code_blocks(page.read_text()))}


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def broken_links(page: pathlib.Path) -> list:
    """Relative links of ``page`` whose file (or heading anchor) does not exist."""
    broken = []
    for target in _LINK.findall(_without_code_blocks(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(target)
    return broken


def missing_paths(page: pathlib.Path) -> list:
    """Repository paths named in ``page`` that match no file or folder (``<name>``, ``...`` and ``*`` are
    placeholders, e.g. recipes/<paper>_<table>_...yaml)."""
    missing = []
    for mention in _PATH.findall(page.read_text()):
        path = mention.rstrip(".,:;")
        pattern = re.sub(r"<[^>]*>|\.\.\.", "*", path)
        if not glob.glob(str(ROOT / pattern)):
            missing.append(path)
    return missing


def cited_sections(text: str) -> list:
    """The sections of every ``docs/algorithms.md <section>`` citation in ``text`` (both ends of a range)."""
    found = []
    for group in _CITATION.findall(text):
        found += re.findall(_SECTION, group)
    return found


def algorithm_sections() -> set:
    """Section numbers of docs/algorithms.md's headings: '## 0. Conventions' -> '0', '#### 2.9d ...' -> '2.9d'."""
    headings = _HEADING.findall((ROOT / "docs" / "algorithms.md").read_text())
    return {m.group(1) for m in (re.match(r"(" + _SECTION + r")\.?\s", h) for h in headings) if m}


def _code_files():
    for folder in CODE_DIRS:
        yield from sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_resolve(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_repository_paths_exist(page):
    assert missing_paths(page) == []


def test_every_cited_algorithms_section_exists():
    sections = algorithm_sections()
    cited = {}
    for path in _code_files():
        for section in cited_sections(path.read_text()):
            cited.setdefault(section, str(path.relative_to(ROOT)))
    assert len(cited) > 30  # the parser still finds the citations
    assert {s: where for s, where in cited.items() if s not in sections} == {}


def readme_algorithm_names(text: str) -> list:
    """The names in the first column of the README's algorithm table (`fedpac_muon`, and `_light` as a suffix)."""
    section = text.split("## Algorithms", 1)[1].split("\n## ", 1)[0]
    names = []
    for row in re.findall(r"^\| (`[^|]*) \|", section, flags=re.M):
        found = re.findall(r"`(\w+)`", row)
        names += found + [f"{n}_light" for n in found if "(+ `_light`)" in row and not n.startswith("_")]
    return sorted(set(n for n in names if not n.startswith("_")))


def test_readme_algorithm_table_is_the_registry():
    from fedhf import list_algorithms

    text = (ROOT / "README.md").read_text()
    assert readme_algorithm_names(text) == sorted(list_algorithms())
    assert f"the {len(list_algorithms())} named algorithms" in text


_OUTSIDE = re.compile(r"\b(?:ALGORITHMS|DESIGN|ENVIRONMENT|REVIEW)\.md|\b[Ii]ssue \d+")


def outside_references(text: str) -> list:
    """Things a reader of the repository cannot open: the project's working notes (kept outside it) and tracker
    numbers ("issue 14"); an upstream issue is cited by its URL instead."""
    return _OUTSIDE.findall(text)


def test_nothing_points_outside_the_repository():
    found = {}
    for path in [*_code_files(), *PAGES]:
        hits = outside_references(path.read_text())
        if hits and path != pathlib.Path(__file__):
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}


def test_the_checks_see_a_broken_link_a_missing_path_and_a_missing_section(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text("[ok](there.md#a-heading) [gone](missing.md) [bad anchor](there.md#nope) "
                    "`fedhf/trainer/config/settings.py` `fedhf/no_such_module.py` recipes/<name>.yaml\n")
    assert broken_links(page) == ["missing.md", "there.md#nope"]
    assert missing_paths(page) == ["fedhf/no_such_module.py"]
    citation = "see docs/algorithms" + ".md sections 2.1, 2.7-2.14 and 9.9"  # split, or the scan above finds it
    assert cited_sections(citation) == ["2.1", "2.7", "2.14", "9.9"]
    assert "9.9" not in algorithm_sections() and {"0", "2.9d", "4.2", "5.6", "6"} <= algorithm_sections()
    assert outside_references("see DESIGN" + ".md and issue" + " 14, 6c; https://github.com/o/r/issues/3") == \
        ["DESIGN.md", "issue 14"]


def python_blocks(text: str) -> list:
    """The ```python code blocks of a page, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def shrunk(code: str, substitutions: dict) -> str:
    """``code`` with each documented substitution applied (each must be found: the page still says it)."""
    for old, new in substitutions.items():
        assert old in code, old
        code = code.replace(old, new)
    return code


# The README snippet's budget, cut to seconds: fewer rows, clients, rounds and steps (nothing else changes).
README_SMALL = {"range(8000)": "range(160)", "range(500)": "range(40)", "num_clients=20": "num_clients=4",
                "clients_per_round=5": "clients_per_round=2", "num_rounds=30": "num_rounds=2",
                "local_steps=20": "local_steps=2"}


def test_the_readme_snippet_runs_as_written_and_two_runs_give_the_same_model(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    section = (ROOT / "README.md").read_text().split("## Use it on your own model and data", 1)[1]
    code = shrunk(python_blocks(section)[0], README_SMALL)
    adapters = []
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        monkeypatch.chdir(tmp_path / run)
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102 -- the page's own code
        history = json.loads((tmp_path / run / "out" / "federated_history.json").read_text())
        assert [h["round"] for h in history if "eval_accuracy" in h][-1] == 2
        adapters.append(load_file(tmp_path / run / "out" / "final" / "adapter_model.safetensors"))
    assert sorted(adapters[0]) == sorted(adapters[1]) and any("classifier" in n for n in adapters[0])
    assert all(torch.equal(adapters[0][n], adapters[1][n]) for n in adapters[0])


# docs/tutorial.md's budget cut to seconds, and its Gemma replaced by a tiny Llama over Gemma's vocabulary (the
# substitution the page names for a quick try); every other line runs as printed.
TUTORIAL_SMALL = {"range(4000)": "range(120)", "range(300)": "range(24)", "num_clients=20, clients_per_round=5":
                  "num_clients=3, clients_per_round=2", "num_rounds=8, local_steps=10": "num_rounds=2, local_steps=1",
                  "save_every_rounds=4": "save_every_rounds=1", "range(2000)": "range(48)", "range(64)": "range(8)",
                  "range(64, 264)": "range(8, 12)", "num_clients=20, clients_per_round=4, num_rounds=8, local_steps=5":
                  "num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1",
                  "AutoModelForCausalLM.from_pretrained(gemma_path, dtype=base_dtype)": "tiny_llama(len(llm_tokenizer))",
                  "eval_every_rounds=4": "eval_every_rounds=1"}


def test_the_tutorial_runs_as_one_session(tmp_path, monkeypatch):
    code = shrunk("\n".join(python_blocks((ROOT / "docs" / "tutorial.md").read_text())), TUTORIAL_SMALL)
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "tutorial"}
    exec(compile("from fedhf.data.demo import tiny_llama\n" + code, "docs/tutorial.md", "exec"), scope)  # noqa: S102
    assert [h["round"] for h in scope["trainer"].federated_history] == [0, 1, 2] or \
        scope["trainer"].federated_history[-1]["round"] == 2
    assert (tmp_path / "tutorial_classifier" / "checkpoint-2").is_dir()
    assert "eval_generation_accuracy" in scope["llm_trainer"].federated_history[-1]
    assert (tmp_path / "tutorial_llm" / "final" / "adapter_model.safetensors").exists()
