"""The compression plan: a spec string to one compressor per message key, by LoRA role or key pattern."""

from __future__ import annotations

import pytest

from fedhf.compression import parse_plan

A = "dx.base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.default.weight"
B = "dx.base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.default.weight"
HEAD = "dx.base_model.model.classifier.modules_to_save.default.weight"


def _name(plan, key):
    c = plan.pick(key)
    return None if c is None else c.spec()


def test_a_bare_compressor_selects_every_key():
    plan = parse_plan("int8")
    assert [_name(plan, k) for k in (A, "correction.dc.x", "sync.theta.m:w")] == ["int8:256"] * 3


def test_roles_patterns_and_first_match_wins():
    plan = parse_plan("lora_A=int8,lora_B=int4,correction.*=bf16,dx.*=topk:0.1")
    assert _name(plan, A) == "int8:256"
    assert _name(plan, B) == "int4:64"
    assert _name(plan, "correction.dc.w") == "bf16"
    assert _name(plan, HEAD) == "topk:0.1"  # not a LoRA factor: the dx.* pattern
    assert _name(plan, "sync.theta.m:w") is None  # no rule: sent as it is


def test_none_excludes_what_a_later_rule_would_take():
    plan = parse_plan("sync.*=none,int8")
    assert _name(plan, "sync.theta.v:w") is None and _name(plan, "dx.w") == "int8:256"


def test_no_spec_is_inactive():
    for spec in (None, "", "none"):
        assert not parse_plan(spec).active


@pytest.mark.parametrize("bad", ["lora_A=", "=int8", "lora_A=int9", "int8,topk:7"])
def test_bad_specs_name_the_field(bad):
    with pytest.raises(ValueError, match="downlink_compression"):
        parse_plan(bad, "downlink_compression")
