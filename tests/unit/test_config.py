"""The configuration file and ``CALLGATE_*`` variables (docs/reference/configuration.md, ADR 0013).

Precedence (defaults < file < environment < options), relative paths, the older
variables, discovery of the file, and errors that name the file and the key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from callgate.adapters.kafka.topics import replication_for
from callgate.adapters.keyfiles import generate_key_pair
from callgate.bootstrap import Settings, bootstrap
from callgate.config import ConfigError
from callgate.config.redaction import REDACTED, redacted


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_direct_settings_read_nothing_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CALLGATE_DEV", "1")
    monkeypatch.setenv("CALLGATE_PARTITIONS", "9")
    assert Settings().dev is False and Settings().partitions == 6


def test_the_existing_variables_keep_working(tmp_path: Path) -> None:
    env = {
        "CALLGATE_STATE_DIR": str(tmp_path / "s"),
        "CALLGATE_BACKEND": "kafka",
        "CALLGATE_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "CALLGATE_PROFILE": str(tmp_path / "p.yaml"),
        "CALLGATE_TOPIC_PREFIX": "pre",
        "CALLGATE_PARTITIONS": "3",
        "CALLGATE_FAULTS": '{"refunds": {"latency_ms": 5}}',
        "CALLGATE_DEV": "1",
        "CALLGATE_KAFKA_CONSUMER": "session.timeout.ms=6000",  # a worker's, not a setting
    }
    s = Settings.from_env(environ=env)
    assert (s.state_dir, s.backend, s.bootstrap_servers) == (
        tmp_path / "s",
        "kafka",
        "127.0.0.1:9092",
    )
    assert (s.profile, s.topic_prefix, s.partitions) == (tmp_path / "p.yaml", "pre", 3)
    assert s.faults == {"refunds": {"latency_ms": 5}} and s.dev is True
    assert s.config_file is None


def test_file_then_environment_then_options(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "conf" / "callgate.toml",
        'topic_prefix = "from-file"\npartitions = 4\nprofile = "profiles/mine.yaml"\n'
        '[approvals]\nsigning_kid = "apr-1"\nsigning_key_file = "keys/apr-1.pem"\n',
    )
    env = {"CALLGATE_PARTITIONS": "5", "CALLGATE_APPROVALS__SIGNING_KID": "apr-2"}
    s = Settings.from_env(config_file=conf, environ=env, topic_prefix=None, dev=True)
    assert s.topic_prefix == "from-file"  # an option left out (None) does not override
    assert s.partitions == 5  # the environment beats the file
    assert s.dev is True  # an option beats both
    assert s.approvals.signing_kid == "apr-2"  # nested keys with "__"
    # Paths in the file are relative to the file.
    assert s.profile == conf.parent / "profiles" / "mine.yaml"
    assert s.approvals.signing_key_file == conf.parent / "keys" / "apr-1.pem"
    assert s.config_file == conf


def test_the_file_is_found_by_variable_or_in_the_state_dir(tmp_path: Path) -> None:
    write(tmp_path / "state" / "callgate.toml", 'topic_prefix = "in-state-dir"\n')
    s = Settings.from_env(environ={}, state_dir=tmp_path / "state")
    assert s.topic_prefix == "in-state-dir"
    other = write(tmp_path / "other.toml", 'topic_prefix = "by-variable"\n')
    env = {"CALLGATE_CONFIG": str(other), "CALLGATE_STATE_DIR": str(tmp_path / "state")}
    assert Settings.from_env(environ=env).topic_prefix == "by-variable"
    assert Settings.from_env(environ={}, state_dir=tmp_path / "none").config_file is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("partitions = 0\n", "key 'partitions': Input should be greater than or equal to 1"),
        (
            "replication_factor = 0\n",
            "key 'replication_factor': Input should be greater than or equal to 1",
        ),
        ("colour = 'blue'\n", "key 'colour': unknown key"),
        ('backend = "mq"\n', "key 'backend': Input should be 'embedded' or 'kafka'"),
        (
            '[[sessions.issuers]]\nissuer = "i"\nalgorithms = ["HS256"]\n',
            "key 'sessions.issuers[0].algorithms[0]': Input should be 'EdDSA', 'ES256' or",
        ),
        (
            '[[sessions.issuers]]\nissuer = "i"\nclock_skew = 5\n',
            "key 'sessions.issuers[0].clock_skew': unknown key",
        ),
        ("partitions = \n", "invalid TOML"),
    ],
)
def test_a_broken_file_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    conf = write(tmp_path / "callgate.toml", text)
    with pytest.raises(ConfigError) as err:
        Settings.from_env(config_file=conf, environ={})
    assert str(err.value).startswith(f"configuration {conf}: ")
    assert message in str(err.value)


def test_a_missing_file_and_a_bad_variable_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.from_env(config_file=tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match=r"^environment CALLGATE_PARTITIONS: key 'partitions': "):
        Settings.from_env(environ={"CALLGATE_PARTITIONS": "many"})
    with pytest.raises(
        ConfigError,
        match=r"^environment CALLGATE_SESSIONS__ISSUERS: key 'sessions\.issuers\[0\]\.issuer': ",
    ):
        Settings.from_env(environ={"CALLGATE_SESSIONS__ISSUERS": '[{"audience": "x"}]'})
    with pytest.raises(ConfigError, match=r"^environment CALLGATE_FAULTS: not valid JSON: "):
        Settings.from_env(environ={"CALLGATE_FAULTS": "{latency_ms: 5}"})


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("timeout_s = inf\n", "timeout_s"),
        ("[notify]\nretry_delays_s = [1.0, nan]\n", "notify.retry_delays_s[1]"),
    ],
)
def test_non_finite_numbers_are_refused_in_the_file_and_in_variables(
    tmp_path: Path, text: str, key: str
) -> None:
    """Found by the fuzz target ``config`` (tests/fuzz/atheris_targets.py): TOML's ``inf``
    and ``nan`` passed a float setting with only a lower bound; refused as the strict JSON
    reader refuses them, naming the key."""
    conf = write(tmp_path / "callgate.toml", text)
    with pytest.raises(ConfigError, match=rf"key '{re.escape(key)}': .*finite"):
        Settings.from_env(config_file=conf, environ={})
    with pytest.raises(ConfigError, match=r"^environment CALLGATE_TIMEOUT_S: .*finite"):
        Settings.from_env(environ={"CALLGATE_TIMEOUT_S": "inf"})


def test_variables_are_case_insensitive_nested_and_empty_ones_unset() -> None:
    env = {
        "callgate_approvals__signing_kid": "apr-2",
        "CALLGATE_APPROVALS__PEM_FILES": '{"apr-1": "/keys/apr-1.pem"}',
        "CALLGATE_TIMEOUT": "5",  # the option's name, an alias of timeout_s
        "CALLGATE_PARTITIONS": "",
        "CALLGATE_TOPIC_PREFIX_EXTRA": "not a key",
    }
    s = Settings.from_env(environ=env)
    assert s.approvals.signing_kid == "apr-2"
    assert s.approvals.pem_files == {"apr-1": Path("/keys/apr-1.pem")}
    assert (s.timeout_s, s.partitions, s.topic_prefix) == (5.0, 6, "callgate")


def test_key_files_are_checked_at_start_naming_the_key(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "keys", "session", "ES256", "idp-1")
    conf = write(
        tmp_path / "callgate.toml",
        '[[sessions.issuers]]\nissuer = "https://idp"\njwks_file = "keys/session-jwks.json"\n',
    )
    app = bootstrap(Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path / "s"))
    with pytest.raises(ConfigError) as err:
        app.session_verifier  # noqa: B018
    assert f"configuration {conf}: key 'sessions.issuers[0].algorithms'" in str(err.value)
    assert "'idp-1' is ES256" in str(err.value)

    write(conf, '[approvals]\nsigning_kid = "a"\nsigning_key_file = "keys/missing.pem"\n')
    app = bootstrap(Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path / "s"))
    with pytest.raises(ConfigError, match=r"key 'approvals\.signing_key_file': .*cannot read"):
        app.approval_keys  # noqa: B018
    write(conf, '[approvals]\nsigning_kid = "a"\n')
    app = bootstrap(Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path / "s"))
    with pytest.raises(ConfigError, match=r"key 'approvals\.signing_key_file': missing"):
        app.approval_keys  # noqa: B018


def test_secrets_are_redacted_at_any_depth() -> None:
    view = {"a": 1, "kafka": {"sasl.password": "hunter2", "ok": "x"}, "l": [{"api_token": "t"}]}
    assert redacted(view) == {
        "a": 1,
        "kafka": {"sasl.password": REDACTED, "ok": "x"},
        "l": [{"api_token": REDACTED}],
    }
    assert json.dumps(redacted({"secret": None})) == '{"secret": null}'


def test_kafka_client_settings_reach_every_kafka_client(tmp_path: Path) -> None:
    """Issue 12: the ``[kafka_client]`` table is in the configuration of every client made
    for the settings' brokers; issue 26: it travels with them (``Brokers``), so a client
    made for a plain address gets none, and nothing is set process-wide."""
    from callgate.adapters.kafka.client import client_config

    conf = write(
        tmp_path / "callgate.toml",
        '[kafka_client]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "SCRAM-SHA-512"\n'
        '"sasl.username" = "callgate"\n"sasl.password" = "pw"\n"ssl.ca.location" = "ca.pem"\n',
    )
    settings = Settings.from_env(
        config_file=conf, environ={}, state_dir=tmp_path / "s", bootstrap_servers="b:9092"
    )
    config = client_config(settings.brokers, **{"group.id": "g"})
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.username"] == "callgate" and config["sasl.password"] == "pw"
    assert config["ssl.ca.location"] == "ca.pem"
    assert config["bootstrap.servers"] == "b:9092" and config["group.id"] == "g"
    env = Settings.from_env(
        environ={"CALLGATE_KAFKA_CLIENT": '{"security.protocol": "SSL"}'},
        state_dir=tmp_path / "s",
        bootstrap_servers="b:9092",
    )
    assert client_config(env.brokers)["security.protocol"] == "SSL"
    assert "sasl.password" not in client_config(env.brokers)
    assert "security.protocol" not in client_config("b:9092")


@pytest.mark.parametrize(
    "key", ["isolation.level", "enable.auto.commit", "acks", "transactional.id", "group.id"]
)
def test_kafka_client_refuses_what_callgate_sets_itself(tmp_path: Path, key: str) -> None:
    """Delivery, isolation, commit and transaction settings carry C8, C9 and C12: a
    configuration that tries to change them fails at start, naming the key."""
    conf = write(tmp_path / "callgate.toml", f'[kafka_client]\n"{key}" = "x"\n')
    with pytest.raises(ConfigError) as err:
        Settings.from_env(config_file=conf, environ={})
    assert f"configuration {conf}: key 'kafka_client'" in str(err.value)
    assert f"{key}: not a connection property" in str(err.value)


def test_replication_factor_is_three_or_every_broker_of_a_smaller_cluster(tmp_path: Path) -> None:
    # ADR 0087: exactly-once across a broker crash needs another in-sync replica to lead.
    assert Settings().replication_factor is None  # found from the cluster at serve
    conf = write(tmp_path / "callgate.toml", "replication_factor = 2\n")
    assert Settings.from_env(config_file=conf, environ={}).replication_factor == 2
    env = {"CALLGATE_REPLICATION_FACTOR": "5"}
    assert Settings.from_env(config_file=conf, environ=env).replication_factor == 5

    class Brokers:  # the metadata an AdminClient answers: only its broker count is read
        def __init__(self, count: int) -> None:
            self.brokers = dict.fromkeys(range(count))

    class Admin:
        def __init__(self, count: int) -> None:
            self.count = count

        def list_topics(self, timeout: float) -> Brokers:
            return Brokers(self.count)

    found = {n: replication_for(Admin(n), 1.0) for n in (1, 2, 3, 5)}  # type: ignore[arg-type]
    assert found == {1: 1, 2: 2, 3: 3, 5: 3}
