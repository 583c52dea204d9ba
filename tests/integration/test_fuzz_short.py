"""The short variant of the fuzzing campaign (``make fuzz`` runs the long one): hostile
JSON, tokens and envelopes (``tests.fuzz.strategies``) through the SDK and as raw records,
on the embedded backend and, smaller, on Kafka. Every proposal settles with a code
of the vocabulary, no runner stalls (a watchdog on progress), no colliding id changes
another's invocation, no self-approval under another spelling, and every effect in the
provider ledger was authorized (``tests.fuzz.drive``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fuzz.run import campaign
from tests.kafka_support import Deployment, KafkaServe, unique_prefix

from callgate.bootstrap import Settings
from callgate.surfaces.sdk import connect


@pytest.mark.fuzz
def test_short_fuzz_campaign_on_the_embedded_backend(tmp_path: Path) -> None:
    gate = connect(Settings(state_dir=tmp_path / "state", dev=True))
    try:
        figures = campaign(gate, seconds=10, settle_s=10.0, max_examples=200)
    finally:
        gate.close()
    print(figures.report())
    assert figures.ok(), figures.problems[:10]
    assert figures.inputs >= 50 and len(figures.codes) >= 5, figures.report()


@pytest.mark.kafka
def test_short_fuzz_campaign_on_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    dep = Deployment(kafka_bootstrap, unique_prefix("fuzz"), tmp_path / "state")
    server = KafkaServe(dep, tmp_path / "serve.log")
    try:
        server.wait_ready()
        gate = dep.connect()
        try:
            figures = campaign(gate, seconds=12, settle_s=30.0, max_examples=40)
        finally:
            gate.close()
    finally:
        assert server.stop() == 0, server.log.read_text()
    print(figures.report())
    assert figures.ok(), figures.problems[:10]
    assert figures.inputs >= 10, figures.report()
