"""The server's log keeps a failure that repeats on every retry to one record per interval, saying
how many it left out: an accept loop out of descriptors, or hot reload's scan failing on every poll."""

from __future__ import annotations

import logging

from unideploy.server.logs import SCAN_ERROR_INTERVAL_S, OncePerInterval, configure


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("unideploy.server", logging.ERROR, __file__, 1, message, None, None)


def test_a_repeated_failure_is_logged_once_per_interval_with_the_count_left_out():
    kept = OncePerInterval("repository scan failed", 60.0)
    assert kept.filter(_record("repository scan failed; will try again"))
    assert not any(kept.filter(_record("repository scan failed; will try again")) for _ in range(5))
    assert kept.filter(_record("model digits loaded"))  # other records pass untouched
    kept.last -= 61.0  # a minute on
    later = _record("repository scan failed; will try again")
    assert kept.filter(later)
    assert "(5 more in the last 61 s, not logged)" in later.getMessage()


def test_the_server_log_keeps_the_scan_failure_to_one_a_minute():
    configure()
    filters = logging.getLogger("unideploy.server").filters
    scan = [f for f in filters if isinstance(f, OncePerInterval) and f.prefix == "repository scan failed"]
    assert scan and scan[0].interval_s == SCAN_ERROR_INTERVAL_S
