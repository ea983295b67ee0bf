"""A run directory's config.json holds no key: the pools' API key and the store's secret are redacted."""

from __future__ import annotations

import json

from flywheel.rl.config import SECRET, load_config, to_dict


def test_keys_are_redacted_from_the_written_config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[loop]\nbackend = "http"\npool_urls = ["http://127.0.0.1:1"]\npool_api_key = "sk-very-secret"\n'
        'store = "s3://bucket/run"\nstore_options = { key = "AKIA", secret = "also-secret" }\n'
    )
    cfg = load_config(path)
    assert cfg.loop.pool_api_key == "sk-very-secret"  # the run itself still has them
    text = json.dumps(to_dict(cfg))
    assert "sk-very-secret" not in text and "also-secret" not in text
    out = to_dict(cfg)["loop"]
    assert out["pool_api_key"] == SECRET and out["store_options"] == {"key": "AKIA", "secret": SECRET}
    assert cfg.loop.store_options["secret"] == "also-secret"  # redacting a copy, not the config


def test_a_config_without_keys_is_written_as_it_is(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nsteps = 3\n")
    out = to_dict(load_config(path))["loop"]
    assert out["pool_api_key"] == "" and out["store_options"] == {}
