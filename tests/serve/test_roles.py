"""deepinfer serve --role: prefill and decode instances need kv-store with a directory; a prefill
instance's requests finish only once their blocks are written."""
from __future__ import annotations

import pytest

from deepinfer.core.config import EngineConfig
from deepinfer.serve.server import with_role


def test_colocated_config_is_unchanged():
    config = EngineConfig(plugins=["prefix-cache"])
    assert with_role(config, "both") is config


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_roles_without_a_kv_store_directory_are_refused(role):
    for config in (EngineConfig(plugins=["prefix-cache"]), EngineConfig(plugins=["kv-store"])):
        with pytest.raises(ValueError, match=f"--role {role} hands KV over through the kv-store"):
            with_role(config, role)


def test_a_prefill_instance_makes_its_writes_durable_before_a_request_finishes():
    config = EngineConfig(plugins=["kv-store"], plugin_options={"kv-store": {"directory": "/d"}})
    assert with_role(config, "decode").plugin_options == {"kv-store": {"directory": "/d"}}
    assert with_role(config, "prefill").plugin_options == {"kv-store": {"directory": "/d", "durable_finish": True}}
