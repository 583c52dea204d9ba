"""``callgate.domain.redaction``: digests in place of sensitive argument values, and the
catalog's check of ``sensitive`` paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.e2e.helpers import DEFAULT_PROFILE

from callgate.domain.catalog import ProfileError, load_profile
from callgate.domain.redaction import PREFIX, redactor_for

R = redactor_for(b"k" * 32, {"pay": ["card", "billing.iban"]})


def test_args_keep_shape_with_digests_at_the_sensitive_paths_only() -> None:
    args = {"card": "4111111111111111", "billing": {"iban": "DE00123", "name": "Ann"}, "n": 1}
    shown = R.args("pay", args)
    assert shown["card"] == R.digest("4111111111111111") and shown["card"].startswith(PREFIX)
    assert shown["billing"] == {"iban": R.digest("DE00123"), "name": "Ann"}
    assert shown["n"] == 1 and args["card"] == "4111111111111111"  # the input is untouched
    assert R.args("other", args) == args


def test_equal_values_give_equal_digests_and_another_key_another_digest() -> None:
    assert R.digest("4111") == R.digest("4111") != R.digest("4112")
    assert redactor_for(b"j" * 32, {"pay": ["card"]}).digest("4111") != R.digest("4111")


def test_scrub_finds_the_values_in_outputs_and_messages() -> None:
    secrets = R.secrets("pay", {"card": "4111111111111111", "billing": {"iban": "DE00123"}})
    output = {
        "echo": {"card": "anything"},  # a key named like a sensitive field
        "note": "charged 4111111111111111 today",
        "list": ["DE00123", 5],
    }
    scrubbed = R.scrub("pay", output, secrets)
    assert "4111111111111111" not in str(scrubbed) and "DE00123" not in str(scrubbed)
    assert scrubbed["echo"]["card"] == R.digest("anything")
    assert scrubbed["note"] == f"charged {R.digest('4111111111111111')} today"
    assert scrubbed["list"] == [R.digest("DE00123"), 5]


def profile_with(tmp_path: Path, sensitive: list[str]) -> Path:
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    (tmp_path / doc["policy_file"]).write_text(
        (DEFAULT_PROFILE.parent / doc["policy_file"]).read_text()
    )
    doc["tools"]["refunds.issue"]["sensitive"] = sensitive
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_sensitive_path_must_name_an_argument(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"sensitive.*'card' is not a path"):
        load_profile(profile_with(tmp_path, ["card"]))
    loaded = load_profile(profile_with(tmp_path, ["order_id"]))
    assert loaded.sensitive_paths() == {"refunds.issue": ("order_id",)}


def test_a_profile_without_sensitive_fields_keeps_its_digest(tmp_path: Path) -> None:
    assert load_profile(profile_with(tmp_path, [])).digest == load_profile(DEFAULT_PROFILE).digest
