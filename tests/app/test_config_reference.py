"""The docs' configuration reference is generated from the config model: every setting of
Settings, Upstream and PriceOverride must be in it, with a description."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import orjson
import pytest

from skillstate.config import PriceOverride, Settings, Upstream, load_settings

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "config_reference.py"


@pytest.fixture
def ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documented_keys(markdown: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", markdown, re.MULTILINE)


def test_every_setting_is_in_the_reference(ref: ModuleType) -> None:
    assert ref.missing_descriptions() == []
    keys = documented_keys(ref.render())
    expected = [
        info.alias or name
        for model in (Settings, Upstream, PriceOverride)
        for name, info in model.model_fields.items()
    ]
    assert keys == expected
    assert "schema" in keys and "schema_keys" not in keys  # the key as written in the file


def test_a_setting_without_a_description_fails_the_build(
    ref: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = dict(ref.DESCRIPTIONS[Settings])
    del texts["open_cooldown"]
    texts["gone_setting"] = "a setting the model no longer has"
    monkeypatch.setitem(ref.DESCRIPTIONS, Settings, texts)
    assert ref.missing_descriptions() == [
        "Settings.open_cooldown: no description",
        "Settings.gone_setting: not a setting",
    ]
    with pytest.raises(ValueError, match="open_cooldown"):
        ref.render()


def test_environment_variables_are_listed(ref: ModuleType) -> None:
    page = ref.render()
    for var in ("SKILLSTATE_PORT", "SKILLSTATE_MODE", "SKILLSTATE_SCHEMA", "SKILLSTATE_DATA_DIR"):
        assert var in page


def test_the_docs_page_uses_the_generated_reference() -> None:
    page = (SCRIPT.parents[1] / "docs" / "configuration.md").read_text()
    assert "<!-- config-reference -->" in page
    assert "| `port` |" not in page  # generated at build time, never hand-kept


def test_the_example_config_has_every_setting_and_loads() -> None:
    """README and docs/configuration.md promise that skillstate.json.example shows every key
    with its default: a setting added to the model must be added there too."""
    example = SCRIPT.parents[1] / "skillstate.json.example"
    settings = load_settings({"config": str(example)}, env={})
    data = orjson.loads(example.read_bytes())
    upstream_keys = {k for entry in data["upstreams"] for k in entry}
    assert [
        k for k in Settings.model_fields if (Settings.model_fields[k].alias or k) not in data
    ] == []
    assert [k for k in Upstream.model_fields if k not in upstream_keys] == []
    unset = {"schema", "initial_state", "prices", "upstreams", "_comment"}  # examples, not defaults
    defaults = Settings().model_dump(by_alias=True, mode="json")
    as_loaded = settings.model_dump(by_alias=True, mode="json")
    assert {k: as_loaded[k] for k in defaults if k not in unset} == {
        k: v for k, v in defaults.items() if k not in unset
    }
