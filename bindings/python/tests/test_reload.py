"""Limiter.reload and reload_on_change, on the embedded backend and a real
Redis: state kept by rule identity, refusals leave the old policy, counters."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import throttlegate as tg


def rules(limit: int) -> list[dict[str, object]]:
    return [{"name": "per-ip", "key": "ip:{ip}", "limit": limit, "window": "1h"}]


def toml(limit: object) -> str:
    return f'[[rules]]\nname = "per-ip"\nkey = "ip:{{ip}}"\nlimit = {limit}\nwindow = "1h"\n'


def write(path: Path, text: str) -> None:
    """Replace the file atomically, as the README advises."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def wait_for(limiter: tg.Limiter, key: str, value: int) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        status = limiter.reload_status()
        if status[key] == value or time.monotonic() > deadline:
            return status
        time.sleep(0.02)


IP = {"ip": "198.51.100.5"}


def test_reload_keeps_the_state_of_kept_rules_and_refuses_bad_policies(backend_url: str | None, prefix: str, tmp_path: Path) -> None:
    limiter = tg.Limiter(rules(3), backend_url, prefix=prefix)
    limiter.check(IP)
    limiter.check(IP)
    changes = limiter.reload(rules(5))
    assert changes == {
        "rules": [{"name": "per-ip", "change": "changed", "state_kept": True, "fields": ["limit"]}],
        "settings": [],
    }
    assert limiter.reload(rules(5))["rules"][0]["change"] == "unchanged"
    added = limiter.reload([rules(5)[0], {"name": "other", "key": "u:{u}", "limit": 1, "window": "1s"}])
    assert [(r["name"], r["change"], r["state_kept"]) for r in added["rules"]] == [
        ("per-ip", "unchanged", True), ("other", "added", False)
    ]
    assert limiter.reload(rules(5))["rules"][1] == {"name": "other", "change": "removed", "state_kept": False, "fields": []}
    d = limiter.check(IP)
    assert (d.limit, d.remaining) == (5, 2)
    assert limiter.policy.to_dict()["rules"][0]["limit"] == 5
    bucket = [{"name": "per-ip", "key": "ip:{ip}", "algorithm": "token_bucket", "capacity": 5, "refill_rate": 1}]
    with pytest.raises(tg.InvalidPolicyError, match="changed from sliding_window_log to token_bucket"):
        limiter.reload(bucket)
    bad = tmp_path / "bad.toml"
    bad.write_text(toml(0))
    with pytest.raises(tg.InvalidPolicyError) as e:
        limiter.reload(bad)
    assert str(e.value).endswith('bad.toml: rules[0] ("per-ip"): limit: must be between 1 and 1000000000, not 0')
    with pytest.raises(tg.InvalidPolicyError):
        limiter.reload({"rules": []})
    status = limiter.reload_status()
    assert (status["reloads"], status["errors"], status["watching"]) == (4, 2, None)
    assert status["last_error"] == str(e.value)
    d = limiter.check(IP)
    assert (d.limit, d.remaining) == (5, 1), "the old policy and its state stayed"
    text = limiter.metrics_text()
    assert text is not None and "throttlegate_policy_reload_errors_total 2\n" in text
    limiter.close()
    with pytest.raises(tg.ClosedError):
        limiter.reload(rules(5))


def test_reload_on_change_follows_the_file(backend_url: str | None, prefix: str, tmp_path: Path) -> None:
    with pytest.raises(tg.InvalidArgumentError, match="reload_on_change: the policy was not read from a file"):
        tg.Limiter(rules(3), backend_url, prefix=prefix, reload_on_change=True)
    path = tmp_path / "rules.toml"
    write(path, toml(3))
    with tg.Limiter(path, backend_url, prefix=prefix, reload_on_change=True) as limiter:
        assert limiter.reload_status()["watching"] == str(path)
        limiter.check(IP)
        write(path, toml(7))
        assert wait_for(limiter, "reloads", 1)["reloads"] == 1
        d = limiter.check(IP)
        assert (d.limit, d.remaining) == (7, 5)
        write(path, toml('"seven"'))
        status = wait_for(limiter, "errors", 1)
        assert (status["reloads"], status["errors"]) == (1, 1)
        assert str(status["last_error"]).endswith("limit: expected a positive integer, got a string")
        assert limiter.check(IP).limit == 7, "the policy in force stayed"
