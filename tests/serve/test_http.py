"""The HTTP API (/json, /v1/check, /v1/release, /v1/extend, /healthcheck, /metrics, /rules) and the
operations: reload on SIGHUP and on a file change, the failure policy with
the backend down, graceful shutdown."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid

import grpc
import pytest

from conftest import OK, OVER_LIMIT, free_port

RULES = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"

NATIVE = """
on_backend_error = "%s"

[[rules]]
name = "per-user"
key = "user:{user}"
match = { domain = "web" }
algorithm = "sliding_window_log"
limit = 2
window = "1m"
"""


def call(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def post_json(url: str, value) -> tuple[int, dict, dict]:
    status, headers, body = call("POST", url, json.dumps(value).encode(), {"content-type": "application/json"})
    return status, headers, json.loads(body)


def test_json_endpoint_as_envoyproxy_ratelimit(serve):
    s = serve(RULES, "--response-headers")
    body = {"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "u1"}]}]}
    status, headers, answer = post_json(s.http + "/json", body)
    assert status == 200
    assert answer == {
        "overallCode": "OK",
        "statuses": [{"code": "OK", "currentLimit": {"requestsPerUnit": 2, "unit": "MINUTE"},
                      "limitRemaining": 1, "durationUntilReset": answer["statuses"][0]["durationUntilReset"]}],
        "responseHeadersToAdd": answer["responseHeadersToAdd"],
    }
    assert headers["RateLimit-Policy"] == '"web.user";q=2;w=60'
    post_json(s.http + "/json", body)
    status, headers, answer = post_json(s.http + "/json", body)
    assert status == 429 and answer["overallCode"] == "OVER_LIMIT"
    assert answer["statuses"][0]["code"] == "OVER_LIMIT" and "limitRemaining" not in answer["statuses"][0]
    assert int(headers["Retry-After"]) >= 1
    # proto3 JSON: hitsAddend as a number or a string, the original field names too.
    status, _, answer = post_json(s.http + "/json", {"domain": "web", "hits_addend": "2", "descriptors": [{"entries": [{"key": "user", "value": "u2"}]}]})
    assert status == 200 and "limitRemaining" not in answer["statuses"][0]


@pytest.mark.parametrize(
    "body, word",
    [
        (b"{not json", "body"),
        (b'{"domain": "web", "descriptors": [], "extra": 1}', "extra"),
        (b'{"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}]}', "domain"),
        (b'{"domain": "web"}', "descriptors"),
        (b'{"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": 5}]}]}', "body"),
        (b'{"domain": "web", "hitsAddend": "many", "descriptors": [{"entries": []}]}', "hitsAddend"),
        (b'{"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "x"}], "limit": {"requestsPerUnit": 1}}]}', "limit"),
    ],
)
def test_json_bad_input_is_a_400_naming_it(serve, body, word):
    s = serve(RULES)
    status, headers, answer = call("POST", s.http + "/json", body, {"content-type": "application/json"})
    assert status == 400, answer
    assert headers["content-type"] == "application/problem+json"
    assert word in json.loads(answer)["detail"]


def test_oversized_and_huge_bodies(serve):
    s = serve(RULES)
    for path in ("/json", "/v1/check"):
        status, headers, body = call("POST", s.http + path, b"{" + b" " * (2 << 20) + b"}")
        assert status == 413 and headers["content-type"] == "application/problem+json"
        assert json.loads(body)["detail"] == "body: larger than 1048576 bytes"
    big = {"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "v" * (900 << 10)}]}]}
    status, _, answer = post_json(s.http + "/json", big)
    assert status == 400 and "longer than" in answer["detail"]
    many = {"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": str(i)}]} for i in range(10_000)]}
    status, _, answer = post_json(s.http + "/json", many)
    assert status == 400 and "descriptors" in answer["detail"]
    assert call("GET", s.http + "/healthcheck")[0] == 200


def test_native_check_endpoint(serve, tmp_path):
    s = serve(NATIVE % "allow", name="policy.toml")
    user = uuid.uuid4().hex
    for remaining in (1, 0):
        status, headers, answer = post_json(s.http + "/v1/check", {"attributes": {"domain": "web", "user": user}})
        assert status == 200 and answer["allowed"] is True and answer["remaining"] == remaining
        assert headers["RateLimit-Policy"] == '"per-user";q=2;w=60'
    status, headers, body = call("POST", s.http + "/v1/check", json.dumps({"attributes": {"domain": "web", "user": user}, "cost": 1}).encode())
    assert status == 429 and headers["content-type"] == "application/problem+json"
    assert "per-user" in body.decode() and int(headers["Retry-After"]) >= 1
    status, _, answer = post_json(s.http + "/v1/check", {"attributes": {"domain": "web", "user": user}, "peek": True})
    assert status == 429
    status, _, answer = post_json(s.http + "/v1/check", {"attributes": {"user": 1}})
    assert status == 400 and "attributes" in answer["detail"]
    status, _, answer = post_json(s.http + "/v1/check", {"attributes": {"domain": "web", "user": "x"}, "cost": 3})
    assert status == 400 and "per-user" in answer["detail"]
    status, _, answer = post_json(s.http + "/v1/check", {"attributes": {}, "costs": 1})
    assert status == 400 and "costs" in answer["detail"]
    # The descriptors of a native policy are attributes, with the domain.
    r = s.check("web", [("user", user)])
    assert r.overall_code == OVER_LIMIT and r.statuses[0].current_limit.requests_per_unit == 2
    assert s.check("elsewhere", [("user", user)]).overall_code == OK


SLOTS = """
[[rules]]
name = "jobs"
key = "jobs:{tenant}"
algorithm = "concurrency"
limit = 2
lease = "1m"
"""


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_concurrency_release_and_extend(serve, backend, request):
    url = request.getfixturevalue("redis_server").url if backend == "redis" else None
    s = serve(SLOTS, name="slots.toml", url=url)
    tenant = uuid.uuid4().hex
    attrs = {"tenant": tenant}
    held = []
    for remaining in (1, 0):
        status, _, answer = post_json(s.http + "/v1/check", {"attributes": attrs})
        assert status == 200 and answer["remaining"] == remaining and len(answer["lease_id"]) == 32
        held.append(answer["lease_id"])
    status, _, answer = post_json(s.http + "/v1/check", {"attributes": attrs})
    assert status == 429 and "lease_id" not in answer
    # A release frees its slot at once, once; a check with a call id holds its slots under that id.
    assert post_json(s.http + "/v1/release", {"attributes": attrs, "lease_id": held[0]})[2] == {"released": 1}
    assert post_json(s.http + "/v1/release", {"attributes": attrs, "lease_id": held[0]})[2] == {"released": 0}
    status, _, answer = post_json(s.http + "/v1/check", {"attributes": attrs, "call_id": "job-7"})
    assert status == 200 and answer["lease_id"] == "job-7"
    assert post_json(s.http + "/v1/extend", {"attributes": attrs, "lease_id": "job-7", "duration": "5m"})[2] == {"extended": 1}
    assert post_json(s.http + "/v1/extend", {"attributes": attrs, "lease_id": "job-7", "duration": 30})[2] == {"extended": 1}
    assert post_json(s.http + "/v1/release", {"attributes": attrs, "lease_id": "job-7"})[2] == {"released": 1}
    assert post_json(s.http + "/v1/extend", {"attributes": attrs, "lease_id": "job-7", "duration": 30})[2] == {"extended": 0}
    # Bad input names what is wrong.
    for path, body, word in [
        ("/v1/release", {"attributes": attrs}, "lease_id"),
        ("/v1/release", {"attributes": attrs, "lease_id": "bad id!"}, "call_id"),
        ("/v1/release", {"attributes": attrs, "lease_id": "x", "duration": 1}, "duration"),
        ("/v1/extend", {"attributes": attrs, "lease_id": "x"}, "duration"),
        ("/v1/extend", {"attributes": attrs, "lease_id": "x", "duration": 0}, "duration"),
        ("/v1/extend", {"attributes": attrs, "lease_id": "x", "duration": [1]}, "duration"),
    ]:
        status, headers, answer = post_json(s.http + path, body)
        assert status == 400 and word in answer["detail"], (path, body, answer)
        assert headers["content-type"] == "application/problem+json"
    # The RLS protocol has no release: a native concurrency rule reached over gRPC is refused, named.
    with pytest.raises(grpc.RpcError) as e:
        s.check("any", [("tenant", tenant)])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and '"jobs" is a concurrency limit' in e.value.details()


def test_a_yaml_concurrency_limit_is_refused_at_start(tmp_path):
    from conftest import binary

    rules = tmp_path / "rules.yaml"
    rules.write_text("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    algorithm: {type: concurrency, limit: 2, lease: 30s}\n")
    import subprocess

    p = subprocess.run([binary(), "serve", "--rules", str(rules), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert 'descriptors[0].algorithm: concurrency is refused (rule "d.a")' in p.stderr and "no release" in p.stderr


def test_metrics_rules_and_health(serve):
    s = serve(RULES)
    s.check("web", [("user", "m")])
    s.check("other", [("user", "m")])
    status, headers, body = call("GET", s.http + "/metrics")
    text = body.decode()
    assert status == 200 and text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert 'throttlegate_server_requests_total{domain="web"} 1' in text
    assert 'throttlegate_server_requests_total{domain="other"} 1' in text
    status, _, body = call("GET", s.http + "/rules")
    rules = json.loads(body)
    assert rules["format"] == "envoy" and rules["domains"] == ["web"]
    assert rules["policy"]["rules"][0]["name"] == "web.user"
    status, _, body = call("GET", s.http + "/healthcheck")
    assert (status, body) == (200, b"OK")
    assert call("GET", s.http + "/nothing")[0] == 404


def test_reload_on_sighup_and_on_change_and_refusal(serve):
    s = serve(RULES)
    assert s.check("web", [("user", "r")]).statuses[0].limit_remaining == 1
    n = len(s.logs)
    s.rules.write_text(RULES.replace("requests_per_unit: 2", "requests_per_unit: 5"))
    s.proc.send_signal(signal.SIGHUP)
    s.wait_log("reload", after=n)
    # The rule kept its name, key and algorithm: it keeps its count.
    assert s.check("web", [("user", "r")]).statuses[0].limit_remaining == 3
    n = len(s.logs)
    s.rules.write_text("domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
    refused = s.wait_log("reload_refused", after=n)
    assert "unit" in refused["error"] and "fortnight" in refused["error"]
    assert s.check("web", [("user", "r")]).statuses[0].current_limit.requests_per_unit == 5


@pytest.mark.parametrize("mode, outcome", [("allow", OK), ("deny", OVER_LIMIT), ("error", grpc.StatusCode.UNAVAILABLE)])
def test_backend_down_follows_on_backend_error(serve, mode, outcome):
    s = serve(NATIVE % mode, url=f"redis://127.0.0.1:{free_port()}", name="policy.toml")
    if isinstance(outcome, grpc.StatusCode):
        with pytest.raises(grpc.RpcError) as e:
            s.check("web", [("user", "u")])
        assert e.value.code() == outcome
    else:
        assert s.check("web", [("user", "u")]).overall_code == outcome
    s.wait_log("backend_error")
    assert call("GET", s.http + "/healthcheck")[0] == 503


def test_sigterm_finishes_and_exits_cleanly(serve):
    s = serve(RULES)
    assert s.check("web", [("user", "t")]).overall_code == OK
    assert s.stop() == 0
    assert s.wait_log("stopped")["clean"] is True


def test_bad_rules_file_fails_at_start(tmp_path):
    import subprocess

    from conftest import binary

    path = tmp_path / "bad.yaml"
    path.write_text("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n")
    r = subprocess.run([binary(), "serve", "--rules", str(path), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "descriptors[0].rate_limit.burst: unknown field" in r.stderr


def test_environment_variables(tmp_path):
    import os
    import subprocess

    from conftest import binary

    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    env = dict(os.environ, THROTTLEGATE_RULES=str(path), THROTTLEGATE_GRPC="127.0.0.1:0", THROTTLEGATE_HTTP="127.0.0.1:0")
    p = subprocess.Popen([binary(), "serve"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = json.loads(p.stderr.readline())
        assert line["event"] == "start" and line["rules"] == str(path)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    _ = time
