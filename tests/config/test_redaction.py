"""The Redactor: which names mark a credential, and how secrets are hidden by value (no Ray, no engine)."""

from __future__ import annotations

import io
import logging

import pytest
import yaml

from longeval.config import load_config, redactor, to_yaml
from longeval.config.redaction import HIDDEN, Redactor, is_secret_name, redacted_logs
from longeval.errors import ConfigError


@pytest.mark.parametrize("name", ["HF_TOKEN", "DB_PASS", "OPENAI_KEY", "DB_PWD", "auth", "api_key", "x-api-key",
                                  "AWS_SECRET_ACCESS_KEY", "db_password", "Authorization", "MY_ACCESS_TOKEN",
                                  "WANDB_API_KEY", "client_secret", "SESSION_COOKIE", "GPG_PASSPHRASE"])
def test_credential_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer", "max_num_batched_tokens", "tokenizer_mode", "type_key", "key", "keys",
                                  "num_key_value_heads", "PWD", "OLDPWD", "KEY", "api_key_env", "RAY_AUTH_MODE",
                                  "SSH_AUTH_SOCK", "HF_TOKEN_PATH", "passed", "author", "VLLM_CPU_KVCACHE_SPACE"])
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_every_model_env_value_is_hidden_by_value_unless_public():
    tree = {"model": {"env": {"DB_HOST_X": "db-unknown-name-value", "SHORT": "ab", "VLLM_CPU_KVCACHE_SPACE": "2",
                              "OPEN_THING": "open-value-123"}},
            "suite": {"name": "x"}, "public_keys": ["OPEN_THING"]}
    r = Redactor.of(tree, environ={})
    shown = r.tree({**tree, "record": {"env": {"DB_HOST_X": "db-unknown-name-value", "SHORT": "ab", "UNSET": None},
                                       "note": "connect with db-unknown-name-value now", "echo": "ab",
                                       "word": "about"}})
    assert shown["model"]["env"] == {"DB_HOST_X": HIDDEN, "SHORT": HIDDEN, "VLLM_CPU_KVCACHE_SPACE": "2",
                                     "OPEN_THING": "open-value-123"}
    # by value elsewhere; a short secret only as a whole value, never inside other words; unset stays unset
    assert shown["record"] == {"env": {"DB_HOST_X": HIDDEN, "SHORT": HIDDEN, "UNSET": None},
                               "note": f"connect with {HIDDEN} now", "echo": HIDDEN, "word": "about"}


def test_url_user_info_and_environment_secrets_are_hidden_everywhere():
    tree = {"model": {"api": {"base_url": "https://alice:url-pa55word@example.invalid/v1"}},
            "tracking": {"tags": ["has url-pa55word inside"]}}
    r = Redactor.of(tree, environ={"MY_SERVICE_PASS": "env-s3cr3t-value", "HOME": "/root",
                                   "HTTPS_PROXY": "http://bob:proxy-secret@proxy:3128"})
    shown = r.tree({**tree, "log": "env-s3cr3t-value and proxy-secret and bob:proxy-secret", "home": "/root"})
    assert shown["model"]["api"]["base_url"] == f"https://{HIDDEN}@example.invalid/v1"
    assert shown["tracking"]["tags"] == [f"has {HIDDEN} inside"]
    assert shown["log"] == f"{HIDDEN} and {HIDDEN} and {HIDDEN}" and shown["home"] == "/root"
    assert r.text("see https://u:p@h/x") == f"see https://{HIDDEN}@h/x"


def test_public_keys_frees_a_secret_looking_name():
    r = Redactor.of({"public_keys": ["SORT_KEY"]}, environ={"SORT_KEY": "instance_id", "OTHER_KEY": "k-123456"})
    assert r.tree({"SORT_KEY": "instance_id", "OTHER_KEY": "k-123456"}) == {"SORT_KEY": "instance_id",
                                                                            "OTHER_KEY": HIDDEN}


def test_saved_config_hides_model_env_by_value_and_keeps_public_keys():
    cfg = load_config(["+model.env.OPENAI_KEY=sk-planted-openai", "+model.env.DB_PASS=planted-db-pass",
                       "+model.env.MY_VAR=planted-unknown-var", "+model.env.SHOWN=shown-value",
                       "public_keys=[SHOWN]", "model.system_prompt=say planted-unknown-var"])
    text = to_yaml(cfg, environ={})
    for planted in ("sk-planted-openai", "planted-db-pass", "planted-unknown-var"):
        assert planted not in text
    saved = yaml.safe_load(text)
    assert saved["model"]["env"]["MY_VAR"] == HIDDEN and saved["model"]["env"]["SHOWN"] == "shown-value"
    assert saved["model"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the preset's engine setting stays readable
    assert saved["model"]["system_prompt"] == f"say {HIDDEN}"
    assert redactor(cfg, environ={}).text("x planted-db-pass") == f"x {HIDDEN}"


def test_a_public_key_that_changes_nothing_is_refused():
    with pytest.raises(ConfigError, match="public_keys has 'VLLM_CPU_KVCACHE_SPAC'"):
        load_config(["public_keys=[VLLM_CPU_KVCACHE_SPAC]"])
    load_config(["public_keys=[VLLM_CPU_KVCACHE_SPACE,SORT_KEY]"])


def test_the_processs_own_log_lines_are_redacted_while_a_run_holds_the_filter():
    """A warning that quotes a URL or an error text naming a setting reaches the terminal (and a job's log)
    without the secret; after the block the handlers are as they were."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    redactor = Redactor.of({"model": {"env": {"DB_PASS": "pl4nted-db-pass"}}}, environ={})
    log = logging.getLogger("longeval.test_redaction")
    try:
        with redacted_logs(redactor):
            log.warning("cannot reach %s with %s", "https://bob:pl4nted-url@example.invalid/v1", "pl4nted-db-pass")
        log.warning("after: %s", "pl4nted-db-pass")
    finally:
        root.removeHandler(handler)
    during, after = stream.getvalue().splitlines()
    assert during == "cannot reach https://***@example.invalid/v1 with ***"
    assert after == "after: pl4nted-db-pass" and not handler.filters
