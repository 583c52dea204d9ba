"""Provider latency and errors, by provider and operation, for ``/metrics``.

``instrumented`` wraps each provider the composition root builds; the executor calls the
wrapper exactly as it called the provider. Figures are of the process that runs the
executor (``callgate serve``; on Kafka, the executor's process).

- ``callgate_provider_call_seconds{provider,operation}``: how long each ``dry_run``,
  ``execute``, ``lookup`` and ``describe`` took (a histogram);
- ``callgate_provider_errors_total{provider,operation,error}``: calls that raised, by the
  exception's class (bounded: the providers' own error classes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from callgate.providers.base import Provider
from callgate.tracing import provider_call

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.registry import Collector

BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OPERATIONS = ("dry_run", "execute", "lookup", "describe")


class ProviderMetrics:
    """The two provider metrics, registered in no registry: a server adds ``collectors``.
    Built at the first call (a command that calls no provider does not load the client
    library: part of ``callgate propose``'s start-up)."""

    @cached_property
    def seconds(self) -> Histogram:
        from prometheus_client import Histogram

        return Histogram(
            "callgate_provider_call_seconds",
            "Duration of provider calls, by provider and operation.",
            labelnames=["provider", "operation"],
            buckets=BUCKETS,
            registry=None,
        )

    @cached_property
    def errors(self) -> Counter:
        from prometheus_client import Counter

        return Counter(
            "callgate_provider_errors",
            "Provider calls that raised, by provider, operation and error class.",
            labelnames=["provider", "operation", "error"],
            registry=None,
        )

    @property
    def collectors(self) -> tuple[Collector, ...]:
        return (self.seconds, self.errors)

    def timed(self, provider: str, operation: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with provider_call(provider, operation):  # a span when tracing is on
                    return call(*args, **kwargs)
            except Exception as exc:
                self.errors.labels(provider, operation, type(exc).__name__).inc()
                raise
            finally:
                self.seconds.labels(provider, operation).observe(time.perf_counter() - start)

        return run


class _Instrumented:
    """A provider whose operations are timed; every other attribute is the provider's (so
    ``isinstance(p, Describes)`` still answers for the provider itself)."""

    def __init__(self, inner: Provider, metrics: ProviderMetrics) -> None:
        self._inner = inner
        self._metrics = metrics
        self.name = inner.name

    @property
    def inner(self) -> Provider:
        """The provider itself, without the timing."""
        return self._inner

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._inner, attribute)
        if attribute in OPERATIONS and callable(value):
            return self._metrics.timed(self.name, attribute, value)
        return value

    def dry_run(self, *args: Any, **kwargs: Any) -> Any:
        return self._metrics.timed(self.name, "dry_run", self._inner.dry_run)(*args, **kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._metrics.timed(self.name, "execute", self._inner.execute)(*args, **kwargs)

    def lookup(self, *args: Any, **kwargs: Any) -> Any:
        return self._metrics.timed(self.name, "lookup", self._inner.lookup)(*args, **kwargs)


def unwrapped(provider: Provider) -> Provider:
    """The provider itself: inside its timing wrapper, if it has one (an ``isinstance``
    check on a provider's class needs this; ``Describes`` and other protocols do not)."""
    return provider.inner if isinstance(provider, _Instrumented) else provider


def rewrapped(provider: Provider, inner: Provider) -> Provider:
    """``inner`` in ``provider``'s timing wrapper, if it has one (a provider's copy)."""
    if isinstance(provider, _Instrumented):
        return instrumented(inner, provider._metrics)
    return inner


def instrumented(provider: Provider, metrics: ProviderMetrics) -> Provider:
    wrapped: Provider = _Instrumented(provider, metrics)
    return wrapped
