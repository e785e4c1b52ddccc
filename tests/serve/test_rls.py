"""The rate limit service through an outside client (xds-protos + grpcio):
envoyproxy/ratelimit's README examples as conformance cases, the stacked
all-or-nothing check, hits_addend, concurrency on every backend, bad input."""

from __future__ import annotations

import concurrent.futures
import uuid

import grpc
import pytest

from conftest import OK, OVER_LIMIT, request

# envoyproxy/ratelimit's README, "Examples" 1 to 7, 9 and 11, with the answers it documents.

EXAMPLE1 = """
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
"""

EXAMPLE2 = """
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"""

EXAMPLE3 = """
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"""

EXAMPLE4_FLAT = """
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
"""

EXAMPLE4_NESTED = """
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
"""

EXAMPLE5 = """
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"""

EXAMPLE6 = """
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"""

EXAMPLE7 = """
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"""

EXAMPLE9 = """
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"""

EXAMPLE11 = """
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"""

SECOND, MINUTE, HOUR, DAY = 1, 2, 3, 4


def limit_of(status):
    return (status.current_limit.requests_per_unit, status.current_limit.unit)


def test_example1_values_pick_the_limit(serve):
    s = serve(EXAMPLE1)
    r = s.check("mongo_cps", [("database", "users")])
    assert r.overall_code == OK
    assert limit_of(r.statuses[0]) == (500, SECOND)
    assert r.statuses[0].limit_remaining == 499
    r = s.check("mongo_cps", [("database", "other")])
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")


def test_example2_nested_and_multiple_descriptors(serve):
    s = serve(EXAMPLE2)
    for i in range(5):
        r = s.check("messaging", [("message_type", "marketing"), ("to_number", "2061111111")], [("to_number", "2061111111")])
        assert r.overall_code == OK, i
        assert [limit_of(x) for x in r.statuses] == [(5, DAY), (100, DAY)]
        assert [x.limit_remaining for x in r.statuses] == [4 - i, 99 - i]
    r = s.check("messaging", [("message_type", "marketing"), ("to_number", "2061111111")], [("to_number", "2061111111")])
    assert r.overall_code == OVER_LIMIT
    assert [x.code for x in r.statuses] == [OVER_LIMIT, OK]
    # Deliberately different: the denied request took nothing from the 100 a day (no counter pollution).
    assert r.statuses[1].limit_remaining == 95
    r = s.check("messaging", [("to_number", "2061111111")])
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 94
    # Another number has its own 5.
    r = s.check("messaging", [("message_type", "marketing"), ("to_number", "2062222222")])
    assert r.statuses[0].limit_remaining == 4


def test_example3_most_specific_match_and_a_limit_of_zero(serve):
    s = serve(EXAMPLE3)
    r = s.check("edge_proxy_per_ip", [("remote_address", "50.0.0.1")])
    assert r.overall_code == OK and limit_of(r.statuses[0]) == (10, SECOND)
    r = s.check("edge_proxy_per_ip", [("remote_address", "50.0.0.5")])
    assert r.overall_code == OVER_LIMIT
    assert limit_of(r.statuses[0]) == (0, SECOND)


def test_example4_depth_must_match(serve):
    s = serve(EXAMPLE4_FLAT)
    r = s.check("example4", [("key", "value"), ("subkey", "subvalue")])
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
    s2 = serve(EXAMPLE4_NESTED, name="nested.yaml")
    r = s2.check("example4", [("key", "value"), ("subkey", "subvalue")])
    assert limit_of(r.statuses[0]) == (300, SECOND)


def test_example5_unlimited(serve):
    s = serve(EXAMPLE5)
    r = s.check("internal", [("ldap", "x")])
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 2**32 - 1
    r = s.check("internal", [("azure", "x")])
    assert limit_of(r.statuses[0]) == (100, MINUTE)


def test_example6_shadow_mode_never_denies(serve):
    s = serve(EXAMPLE6)
    for _ in range(12):
        r = s.check("example6", [("service", "auth-service"), ("user", "user-a")])
        assert r.overall_code == OK
    codes = [s.check("example6", [("service", "auth-service"), ("user", "user-b")]).overall_code for _ in range(21)]
    assert codes.count(OVER_LIMIT) >= 1


def test_example7_replaces(serve):
    s = serve(EXAMPLE7)
    both = ([("key_1", "value_1"), ("user", "bkthomps")], [("key_2", "value_2"), ("user", "bkthomps")])
    r = s.check("example7", *both)
    # The replaced limit is not applied and not changed.
    assert not r.statuses[0].HasField("current_limit")
    assert limit_of(r.statuses[1]) == (10, SECOND)
    r = s.check("example7", both[0])
    assert limit_of(r.statuses[0]) == (5, SECOND) and r.statuses[0].limit_remaining == 4


def test_example9_wildcards(serve):
    s = serve(EXAMPLE9)
    assert limit_of(s.check("example9", [("key1", "valueXYZ")]).statuses[0]) == (20, MINUTE)
    assert limit_of(s.check("example9", [("path", "/api/123/action")]).statuses[0]) == (20, MINUTE)
    assert not s.check("example9", [("path", "/api/123/other")]).statuses[0].HasField("current_limit")


def test_example11_share_threshold(serve):
    s = serve(EXAMPLE11)
    for name in ["files/a.pdf"] * 5 + ["files/b.csv"] * 5:
        assert s.check("example11", [("files", name)]).overall_code == OK
    assert s.check("example11", [("files", "files/c.txt")]).overall_code == OVER_LIMIT
    for _ in range(10):
        assert s.check("example11", [("files_no_share", "files_no_share/a.pdf")]).overall_code == OK
    assert s.check("example11", [("files_no_share", "files_no_share/b.csv")]).overall_code == OK


def test_unknown_domain_and_unmatched_descriptor_are_ok(serve):
    s = serve(EXAMPLE1)
    r = s.check("nobody", [("database", "users")])
    assert r.overall_code == OK and len(r.statuses) == 1


def test_hits_addend_request_and_descriptor_level(serve):
    s = serve(EXAMPLE2)
    r = s.check("messaging", [("to_number", "1")], hits=40)
    assert r.statuses[0].limit_remaining == 60
    # A descriptor's own hits_addend of 0 looks without counting.
    r = s.check("messaging", {"entries": [("to_number", "1")], "hits_addend": 0})
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 60
    r = s.check("messaging", {"entries": [("to_number", "1")], "hits_addend": 60})
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 0
    r = s.check("messaging", {"entries": [("to_number", "1")], "hits_addend": 0})
    assert r.overall_code == OVER_LIMIT and r.statuses[0].limit_remaining == 0
    # A cost above the limit could never pass: a bad request, named.
    with pytest.raises(grpc.RpcError) as e:
        s.check("messaging", [("to_number", "2")], hits=101)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_response_headers_to_add(serve):
    s = serve(EXAMPLE2, "--response-headers")
    r = s.check("messaging", [("to_number", "3")], hits=100)
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers["RateLimit-Policy"].endswith(";q=100;w=86400")
    assert ";r=0;" in headers["RateLimit"]
    r = s.check("messaging", [("to_number", "3")])
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert r.overall_code == OVER_LIMIT and int(headers["Retry-After"]) >= 1
    plain = serve(EXAMPLE2, name="plain.yaml")
    assert not plain.check("messaging", [("to_number", "3")]).response_headers_to_add


LIMIT = 10


@pytest.mark.parametrize("backend", ["embedded", "redis", "cluster"])
def test_64_concurrent_calls_admit_exactly_the_limit(serve, backend, request):
    url = None
    if backend == "redis":
        url = request.getfixturevalue("redis_server").url
    elif backend == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    rules = f"domain: c\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}\n"
    # Errors, not answers of the failure policy: every one of the 64 is decided by the backend.
    s = serve(rules, "--on-backend-error", "error", "--timeout", "10s", url=url)
    user = uuid.uuid4().hex
    one = [("user", user)]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(lambda _: s.check("c", one).overall_code, range(64)))
    assert codes.count(OK) == LIMIT
    assert codes.count(OVER_LIMIT) == 64 - LIMIT


def test_all_or_nothing_on_redis(serve, redis_server):
    rules = "domain: a\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
    s = serve(rules, url=redis_server.url)
    user, tenant = uuid.uuid4().hex, uuid.uuid4().hex
    codes = [s.check("a", [("user", user)], [("tenant", tenant)]).overall_code for _ in range(5)]
    assert codes == [OK, OK, OK, OVER_LIMIT, OVER_LIMIT]
    assert s.check("a", [("user", user)]).statuses[0].limit_remaining == 96


def test_bad_input_is_refused_and_the_server_stays_up(serve):
    s = serve(EXAMPLE2)
    bad = [
        (request("", [("to_number", "1")]), "domain"),
        (request("messaging"), "descriptors"),
        (request("messaging", *[[("to_number", str(i))] for i in range(10_000)]), "descriptors"),
        (request("messaging", [("to_number", "x" * (1 << 20))]), "longer than"),
        (request("messaging", [("", "x")]), "key"),
    ]
    for req, word in bad:
        with pytest.raises(grpc.RpcError) as e:
            s.stub.ShouldRateLimit(req)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, word
        assert word in e.value.details()
    # Bytes that are no RateLimitRequest.
    raw = s.channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    for junk in [b"\xff\xff\xff", b"\x0a\x05ab", b"\x12\x80\x80\x80\x80\x10"]:
        with pytest.raises(grpc.RpcError) as e:
            raw(junk)
        assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a" + b"\xff\xff\xff\x07" + b"a" * 64)
    # Still serving.
    assert s.check("messaging", [("to_number", "1")]).overall_code == OK
    assert s.proc.poll() is None


@pytest.mark.parametrize("backend", ["embedded", "redis", "cluster"])
def test_each_descriptor_its_own_hits_addend_in_one_check(serve, backend, request):
    url = None
    if backend == "redis":
        url = request.getfixturevalue("redis_server").url
    elif backend == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    s = serve(EXAMPLE2, "--on-backend-error", "error", "--timeout", "10s", url=url)
    a, b, c = (uuid.uuid4().hex for _ in range(3))

    def hits(number, n, marketing=False):
        entries = [("message_type", "marketing"), ("to_number", number)] if marketing else [("to_number", number)]
        return {"entries": entries, "hits_addend": n}

    # Two limits, two costs, one check.
    r = s.check("messaging", hits(a, 3), hits(a, 1, marketing=True))
    assert r.overall_code == OK
    assert [st.limit_remaining for st in r.statuses] == [97, 4]
    # One limit reached with two values, each at its own cost.
    r = s.check("messaging", hits(b, 2), hits(c, 5))
    assert [st.limit_remaining for st in r.statuses] == [98, 95]
    # One limit reached twice with one value: the sum is counted.
    r = s.check("messaging", hits(b, 2), hits(b, 3))
    assert [st.limit_remaining for st in r.statuses] == [93, 93]
    # All or nothing: the marketing limit has 4 left, so a cost of 5 there counts nowhere.
    r = s.check("messaging", hits(c, 1), hits(a, 5, marketing=True))
    assert r.overall_code == OVER_LIMIT
    assert [(st.code, st.limit_remaining) for st in r.statuses] == [(OK, 95), (OVER_LIMIT, 4)]
    # hits_addend 0 checks without counting, in the same check; nothing left: OVER_LIMIT, nothing counted.
    r = s.check("messaging", hits(c, 1), hits(a, 0, marketing=True))
    assert r.overall_code == OK
    assert [st.limit_remaining for st in r.statuses] == [94, 4]
    assert s.check("messaging", hits(a, 4, marketing=True)).statuses[0].limit_remaining == 0
    r = s.check("messaging", hits(c, 1), hits(a, 0, marketing=True))
    assert r.overall_code == OVER_LIMIT
    assert [(st.code, st.limit_remaining) for st in r.statuses] == [(OK, 94), (OVER_LIMIT, 0)]
    assert s.check("messaging", hits(c, 0)).statuses[0].limit_remaining == 94
