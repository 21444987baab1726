"""Prometheus behind the ``MetricsQuery`` port, through prometheus-api-client.

The client is synchronous (requests), so queries run in a worker thread; its own urllib3
retry policy handles connection blips and is not wrapped again here.
"""

from __future__ import annotations

import asyncio

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.ports import Probe


class PrometheusQuery:
    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        retry = Retry(total=2, backoff_factor=0.2, status_forcelist=(502, 503, 504), allowed_methods=("GET",))
        self._client = PrometheusConnect(
            url=url, disable_ssl=False, retry=retry, timeout=int(max(timeout, 1))
        )
        self._timeout = timeout
        self._url = url

    async def probe(self) -> Probe:
        """One instant query (``count(up)``): the HTTP API answers PromQL. Changes nothing."""
        try:
            samples = await self.instant("count(up)")
        except PitcrewError as exc:
            return Probe("prometheus", False, f"{self._url}: {exc}", missing=(f"Prometheus at {self._url}",))
        targets = int(samples[0][1]) if samples else 0
        return Probe("prometheus", True, f"{self._url}: answers queries; {targets} scrape targets")

    async def instant(self, promql: str) -> list[tuple[dict[str, str], float]]:
        try:
            result = await asyncio.to_thread(self._client.custom_query, promql)
        except requests.RequestException as exc:
            raise TransientError("Prometheus unreachable", reason=Reason.UNREACHABLE) from exc
        except PrometheusApiClientException as exc:
            text = str(exc)
            if "400" in text or "422" in text or "bad_data" in text:
                raise PermanentError(
                    f"Prometheus refused the query: {text[:200]}", reason=Reason.INVALID_REQUEST
                ) from exc
            raise TransientError(f"Prometheus error: {text[:200]}", reason=Reason.UNAVAILABLE) from exc
        samples = []
        for item in result:
            metric = {str(k): str(v) for k, v in item.get("metric", {}).items()}
            try:
                samples.append((metric, float(item["value"][1])))
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return samples
