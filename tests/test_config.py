"""EngineConfig's mode fields hold traceless.modes' Enums: a member or its word is accepted and
held as the member; anything else is a ConfigError naming the words allowed. The command line's
choices are the same words."""

from __future__ import annotations

import argparse

import pytest

from traceless.cli.engine_args import add_engine_args
from traceless.config import EngineConfig
from traceless.errors import ConfigError
from traceless.modes import (
    AttentionBackend,
    CacheMode,
    DType,
    KVOffload,
    LoadFormat,
    QuantizationMode,
    SpecMode,
    choices,
)

MODES = {
    "dtype": DType,
    "quantization": QuantizationMode,
    "load_format": LoadFormat,
    "attention_backend": AttentionBackend,
    "prefix_cache": CacheMode,
    "kv_offload": KVOffload,
    "speculative": SpecMode,
}


@pytest.mark.parametrize("field,mode", MODES.items())
def test_a_mode_takes_its_member_or_its_word_and_holds_the_member(field, mode):
    for member in mode:
        extra = {"kv_offload_dir": "/tmp/x"} if member is KVOffload.DISK else {}
        assert getattr(EngineConfig(**{field: member}, **extra), field) is member
        assert getattr(EngineConfig(**{field: member.value}, **extra), field) is member


@pytest.mark.parametrize("field,mode", MODES.items())
def test_any_other_value_is_a_config_error_naming_the_words(field, mode):
    for bad in ("bogus", next(iter(mode)).name, None, 1, ["off"]):
        with pytest.raises(ConfigError) as err:
            EngineConfig(**{field: bad})
        assert str(err.value) == f"{field} must be one of {', '.join(m.value for m in mode)}"


def test_a_member_of_another_mode_is_refused():
    with pytest.raises(ConfigError, match="prefix_cache must be one of"):
        EngineConfig(prefix_cache=SpecMode.OFF)


def test_the_defaults_are_members():
    cfg = EngineConfig()
    assert (
        cfg.dtype,
        cfg.quantization,
        cfg.load_format,
        cfg.attention_backend,
        cfg.prefix_cache,
        cfg.kv_offload,
        cfg.speculative,
    ) == (
        DType.AUTO,
        QuantizationMode.AUTO,
        LoadFormat.AUTO,
        AttentionBackend.AUTO,
        CacheMode.ISOLATED,
        KVOffload.NONE,
        SpecMode.OFF,
    )


def test_rules_between_modes_read_the_converted_members():
    with pytest.raises(ConfigError, match="public prefixes"):
        EngineConfig(prefix_cache="global", public_prefixes=("system",))
    with pytest.raises(ConfigError, match="draft_layers"):
        EngineConfig(speculative="ngram", draft_layers=2)
    assert EngineConfig(speculative="draft", draft_layers=2).draft_layers == 2


@pytest.mark.parametrize("field,mode", MODES.items())
def test_the_command_line_offers_the_modes_words(field, mode):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    (action,) = [a for a in parser._actions if a.dest == field]
    assert tuple(action.choices) == choices(mode)
    assert getattr(EngineConfig(**{field: action.default}), field) is mode(action.default)
