#!/usr/bin/env python3
"""Write the conformance vectors (tests/vectors/*.json) from case definitions.

The expected values come from a small reference model written from the
contract (SPEC.md) and the exact arithmetic documented at the top of
lua/sliding_window_log.lua, lua/token_bucket.lua, lua/sliding_window.lua and
lua/period_counter.lua, not from running the implementation. It models:

- sliding_window_log: a member with score s is inside the window while
  now < s + window; admit when count + cost <= limit; on denial retry_after is
  the time until the `need` oldest members leave, reset_after the time until
  the newest one does; remaining is limit - count (- cost when the request
  is admitted: a rule that admits a request another rule denies keeps it all);
- token_bucket in micro-tokens (1 token = 1,000,000): refill
  floor(elapsed_us * rate), capped at the capacity; remaining is
  floor(tokens / 1e6); waits are the smallest whole number of microseconds w
  with floor(w * rate) >= need (IEEE doubles, as in Lua);
- sliding_window (counters): sub-window j spans [j*precision, (j+1)*precision)
  and its units count while now < (j+1)*precision + window; admit when
  count + cost <= limit; on denial retry_after is the time until the oldest
  sub-windows holding `count + cost - limit` units stop counting, reset_after
  until the newest one does (on admission, at least the current one);
- fixed_window and quota: one count per period, which holds while
  now < the period's end; a fixed window ends at (floor(now/window)+1)*window,
  a quota at the next hour, day, Monday or first of a month of the calendar
  read at utc_offset (computed here with Python's datetime, independently of
  the Lua's arithmetic); denied: retry_after = reset_after = end - now;
- stacking: all or nothing, shadow rules reported but never denying, the
  headline from the most restrictive rule (denied: longest retry_after, ties
  in policy order; allowed: fewest remaining, then shortest reset_after, then
  policy order);
- headers: RateLimit-Limit/-Remaining/-Reset, RateLimit-Policy and RateLimit
  over the applied non-shadow rules, Retry-After (at least 1) on a denial;
- call ids: a check repeating an id that the state already holds is answered
  as a peek at cost 0 and consumes nothing;
- reset: the number of applicable rules whose key exists;
- reload: the new rules take over; state lives under (rule name, key
  template, attribute values), so a rule that keeps its name and key keeps
  its state, and one with a new key starts afresh; a rule that keeps its name
  and key but changes its algorithm (or a sliding window's precision) is
  refused with invalid_policy, and the old rules stay.
- settle (by call id, with the check's cost as the estimate): each applicable
  rule where the check's call id still counts is corrected as if the check had
  cost `actual` (capped at the rule's limit or capacity), and the id is
  marked settled, so a second settle changes nothing. A log keeps or adds
  members at the check's time; a bucket gets the difference back (at most
  full) or loses the excess (below zero if need be); counters change the
  check's sub-window (at most its units off); a period counter its units
  (down to zero, the key then gone). The answer is the number of rules settled;
- acquire on a manual clock: admitted at once (the check's decision), or the
  `timeout` error when the wait asked for is longer than the timeout.
- metrics (a `metrics` step): per rule of the policy in force, the checks and
  peeks it applied to and each one's outcome (allowed, denied, shadow_denied:
  the rule's own result in the decision; an acquire that times out counts its
  denied check), and the settles that corrected it with the units they gave
  back (estimate - min(actual, limit)) or took (min(actual, limit) -
  estimate). A rule that a reload keeps by name keeps its counters; a new one
  starts at zero; a removed one is no longer listed. No backend fails, so the
  degraded, error and timeout counters stay zero.

Usage:
    python3 tests/vectors/generate.py           # (re)write every file
    python3 tests/vectors/generate.py --check   # fail if a file is stale
    python3 tests/vectors/generate.py --random 500 --out DIR [--seed S]
        # random cases for exploratory runs (THROTTLEGATE_VECTORS=DIR)

Keys in Redis carry real-time TTLs while the cases run on a manual clock, so
the generator refuses cases where that difference could show: every key's TTL
is at least MIN_TTL_MS of real time, and no reset or replay looks at a key
after the manual clock has passed its expiry.
"""

import copy
import ipaddress
import datetime
import json
import math
import re
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO = 1_000_000
START_US = 1_000_000_000_000
# 2026-01-01T00:00:00Z: realistic wall-clock microseconds (still far below 2^53).
EPOCH_2026_US = 1_767_225_600_000_000
MIN_TTL_MS = 2_000
MAX_SAFE = 2 ** 53


class CaseError(Exception):
    """A case that the model refuses (ambiguous between backends, or wrong)."""


def ceil_div(a, b):
    return -((-a) // b)


def ceil_ms(us):
    return ceil_div(us, 1000)


def ceil_s(us):
    return ceil_div(us, MICRO)


# ---- policy -----------------------------------------------------------------

def parse_duration_ms(v):
    if isinstance(v, int):
        return v
    units = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    digits = ""
    i = 0
    while i < len(v) and v[i].isdigit():
        digits += v[i]
        i += 1
    return int(digits) * units[v[i:].strip()]


def template_attrs(template):
    """Attribute names of a key template (`{{` and `}}` are literal braces)."""
    names = []
    i = 0
    while i < len(template):
        c = template[i]
        if c in "{}" and template[i + 1:i + 2] == c:
            i += 2
            continue
        if c == "{":
            j = template.index("}", i)
            names.append(template[i + 1:j])
            i = j + 1
            continue
        i += 1
    return names


RATE_UNITS = {"ms": 1, "millisecond": 1, "s": 1000, "sec": 1000, "second": 1000, "m": 60_000, "min": 60_000,
              "minute": 60_000, "h": 3_600_000, "hr": 3_600_000, "hour": 3_600_000, "d": 86_400_000,
              "day": 86_400_000, "month": 30 * 86_400_000, "year": 365 * 86_400_000}


def parse_rate(text):
    """One rate string (`5/minute`, `100 per hour`, `10/30s`): (limit, window_ms)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:/|per)\s*(\d*)\s*([A-Za-z]+)\s*", text, re.IGNORECASE)
    word = m.group(3).lower()
    unit = RATE_UNITS.get(word) or RATE_UNITS[word[:-1]]
    return int(m.group(1)), int(m.group(2) or 1) * unit


class Rule:
    def __init__(self, spec):
        spec = dict(spec)
        if "rate" in spec:
            spec["limit"], spec["window"] = parse_rate(spec.pop("rate"))
        # Tiers: the default (or first, in value order) tier stands in for
        # the rule's own limit; `variant` picks the tier of a request.
        self.tiers = spec.get("tiers")
        if self.tiers is not None:
            named = {k: v for k, v in self.tiers.items() if k not in ("attribute", "default")}
            stand_in = self.tiers.get("default", named[sorted(named)[0]] if named else None)
            self.put_limit(spec, stand_in)
        self.overrides = bool(spec.get("overrides", False))
        self.block_us = parse_duration_ms(spec["block"]) * 1000 if "block" in spec else None
        if self.block_us is not None:
            self.block_factor = float(spec.get("block_factor", 1))
            self.block_max_us = parse_duration_ms(spec["block_max"]) * 1000 if "block_max" in spec else self.block_us
            self.block_period_us = (parse_duration_ms(spec["block_period"]) * 1000 if "block_period" in spec
                                    else self.block_max_us)
        self.spec = spec
        self.name = spec["name"]
        self.template = spec["key"]
        self.attrs = template_attrs(spec["key"])
        self.shadow = bool(spec.get("shadow", False))
        m = spec.get("match", {})
        self.match = {k: ([v] if isinstance(v, str) else list(v)) for k, v in m.items()}
        e = spec.get("exempt", {})
        self.exempt = {k: ([v] if isinstance(v, str) else list(v)) for k, v in e.items()}
        self.algo = spec.get("algorithm", "sliding_window_log")
        if self.algo == "concurrency":
            self.limit = spec["limit"]
            self.lease_us = parse_duration_ms(spec["lease"]) * 1000
            self.header_w = max(1, ceil_s(self.lease_us))
        elif self.algo in ("sliding_window_log", "fixed_window"):
            self.limit = spec["limit"]
            self.window_us = parse_duration_ms(spec["window"]) * 1000
            self.header_w = max(1, ceil_s(self.window_us))
        elif self.algo == "sliding_window":
            self.limit = spec["limit"]
            window_ms = parse_duration_ms(spec["window"])
            self.window_us = window_ms * 1000
            # The default precision: 1/60 of the window, rounded up to whole ms.
            self.precision_us = parse_duration_ms(spec.get("precision", max(1, ceil_div(window_ms, 60)))) * 1000
            self.header_w = max(1, ceil_s(self.window_us))
        elif self.algo == "quota":
            self.limit = spec["limit"]
            self.period = spec["period"]
            off = spec.get("utc_offset", "+00:00")
            sign = -1 if off[0] == "-" else 1
            self.offset_s = sign * (int(off[1:3]) * 3600 + int(off[4:6]) * 60)
            self.header_w = {"hour": 3600, "day": 86400, "week": 7 * 86400, "month": 31 * 86400}[self.period]
        else:
            self.limit = spec["capacity"]
            self.rate = float(spec["refill_rate"])
            ratio = self.limit / self.rate
            # The header window is ceil(capacity / refill_rate) seconds; keep
            # cases away from ratios where float rounding could decide it.
            if ratio != math.floor(ratio) and min(ratio - math.floor(ratio), math.ceil(ratio) - ratio) < 1e-3:
                raise CaseError(f"rule {self.name}: capacity/refill_rate too close to an integer")
            self.header_w = max(1, math.ceil(ratio))

    @staticmethod
    def put_limit(spec, tier):
        if isinstance(tier, dict):
            spec["capacity"], spec["refill_rate"] = tier["capacity"], tier["refill_rate"]
        else:
            spec["limit"] = tier

    def variant(self, attrs):
        """The rule as it applies to these attributes (its tier), or None."""
        if self.tiers is None:
            return copy.copy(self)
        value = attrs.get(self.tiers["attribute"])
        if value is not None and value not in ("attribute", "default") and value in self.tiers:
            tier = self.tiers[value]
        elif "default" in self.tiers:
            tier = self.tiers["default"]
        else:
            return None
        spec = dict(self.spec)
        spec.pop("tiers")
        self.put_limit(spec, tier)
        v = Rule(spec)
        v.tiers = None
        return v

    def exempted(self, attrs):
        """An attribute has an exempt value: an IP network or address
        matches by address (IPv4-mapped IPv6 as IPv4), anything else exactly."""
        for a, values in self.exempt.items():
            v = attrs.get(a)
            if v is None:
                continue
            for entry in values:
                if entry == v:
                    return True
                try:
                    net = ipaddress.ip_network(entry, strict=False)
                    ip = ipaddress.ip_address(v)
                except ValueError:
                    continue
                if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                    ip = ip.ipv4_mapped
                if ip.version == net.version and ip in net:
                    return True
        return False

    def applies(self, attrs):
        if self.variant(attrs) is None:
            return False
        for a, values in self.match.items():
            if attrs.get(a) not in values:
                return False
        if self.exempted(attrs):
            return False
        return all(a in attrs for a in self.attrs)

    def key(self, attrs):
        return (self.name, self.template) + tuple(attrs[a] for a in self.attrs)


# ---- the algorithms ---------------------------------------------------------

class Log:
    """Sliding-window log: (score, call id) per admitted unit, sorted by score."""

    def __init__(self):
        self.members = []
        self.expires_at = None

    def decide(self, now, cost, limit, window):
        inside = [s for s, _ in self.members if s > now - window]
        count = len(inside)
        if count + cost <= limit:
            reset = window if cost > 0 else 0
            if count > 0:
                reset = max(reset, max(inside) + window - now)
            return dict(allowed=True, remaining=limit - count - cost, retry=0, reset=reset)
        need = count + cost - limit
        return dict(
            allowed=False,
            remaining=max(0, limit - count),
            retry=inside[need - 1] + window - now,
            reset=max(inside) + window - now,
        )

    def seen(self, call_id, now, window):
        # Only a check that still counts is recognised (log_check_time).
        return any(i == call_id and s > now - window for s, i in self.members)

    def settle(self, now, call_id, estimate, actual, window):
        mine = [s for s, i in self.members if i == call_id and s > now - window]
        if not mine:
            return False
        t = mine[0]
        others = [(s, i) for s, i in self.members if i != call_id]
        kept = min(len(mine), actual) if actual <= estimate else len(mine) + actual - estimate
        self.members = sorted(others + [(t, ("settled", call_id))] * kept, key=lambda m: m[0])
        return True

    def commit(self, now, cost, window, reset, call_id):
        self.members = [(s, i) for s, i in self.members if s > now - window]
        self.members.extend([(now, call_id)] * cost)
        self.members.sort(key=lambda m: m[0])
        ttl_ms = ceil_ms(reset)
        self.expires_at = now + ttl_ms * 1000
        return ttl_ms


def tb_wait(need, rate):
    if need <= 0:
        return 0
    wait = math.ceil(need / rate)
    if math.floor(wait * rate) < need:
        wait += 1
    return int(wait)


NEW_ALGOS = ("sliding_window", "fixed_window", "quota")

# How many call ids of recent admissions a key remembers (a bucket, counters,
# a period counter). A settled call keeps its place, marked ("settled", id).
# A settle of a call not found while 64 entries that still count are newer
# calls' is an invalid_argument error (the call was pushed out). The log's
# model keeps every unit's id: its cases stay below 64 ids.
TB_IDS = 64


def pushed_out(ids, call_id, live=None):
    """For a call a settle did not find among `ids` (ids, or (sub-window,
    id) for counters): not marked settled there, and 64 entries that still
    count (`live`)."""
    own = [e[1] if isinstance(e, tuple) and e[0] != "settled" else e for e in ids]
    return ("settled", call_id) not in own and sum(1 for e in ids if live is None or live(e)) >= TB_IDS


class Bucket:
    """Token bucket state: micro-tokens after the last admission, its time,
    and the ids of the recent admissions that carried a call id."""

    def __init__(self):
        self.tokens = None
        self.last = None
        self.ids = []
        self.expires_at = None

    def current(self, now, capacity, rate):
        full = capacity * MICRO
        if self.tokens is None:
            return full
        tokens = self.tokens
        if now > self.last:
            refill = math.floor((now - self.last) * rate)
            tokens = full if refill >= full - tokens else tokens + refill
        return tokens

    def decide(self, now, cost, capacity, rate):
        full = capacity * MICRO
        tokens = self.current(now, capacity, rate)
        want = cost * MICRO
        if tokens >= want:
            left = tokens - want
            return dict(allowed=True, remaining=left // MICRO, retry=0,
                        reset=tb_wait(full - left, rate), left=left)
        return dict(allowed=False, remaining=max(tokens, 0) // MICRO,
                    retry=tb_wait(want - tokens, rate), reset=tb_wait(full - tokens, rate))

    def seen(self, call_id):
        return self.tokens is not None and call_id in self.ids

    def settle(self, now, call_id, estimate, actual, capacity, rate):
        if self.tokens is None or call_id not in self.ids:
            return None
        self.ids[self.ids.index(call_id)] = ("settled", call_id)
        full = capacity * MICRO
        self.tokens = min(full, self.tokens + (estimate - actual) * MICRO)
        ttl_ms = max(1, ceil_ms(self.last + tb_wait(full - self.tokens, rate) - now))
        self.expires_at = now + ttl_ms * 1000
        return ttl_ms

    def commit(self, now, left, reset, call_id):
        self.tokens = left
        self.last = now if self.last is None else max(self.last, now)
        if call_id is not None:
            self.ids = (self.ids + [call_id])[-TB_IDS:]
        ttl_ms = max(1, ceil_ms(reset))
        self.expires_at = now + ttl_ms * 1000
        return ttl_ms


class Counters:
    """Sliding window of counters: {sub-window: units}, and the recent
    (sub-window, call id) of admissions that carried an id."""

    fragile = False

    def __init__(self):
        self.subs = {}
        self.ids = []
        self.expires_at = None

    def counted(self, now, window, precision):
        first = (now - window) // precision
        return sorted((j, c) for j, c in self.subs.items() if j >= first)

    def decide(self, now, cost, limit, window, precision):
        subs = self.counted(now, window, precision)
        count = sum(c for _, c in subs)
        release = lambda j: (j + 1) * precision + window - now
        if count + cost <= limit:
            top = subs[-1][0] if subs else None
            if cost > 0:
                cur = now // precision
                top = cur if top is None else max(top, cur)
            return dict(allowed=True, remaining=limit - count - cost, retry=0,
                        reset=release(top) if top is not None else 0)
        need = count + cost - limit
        held = 0
        for j, c in subs:
            held += c
            if held >= need:
                retry = release(j)
                break
        return dict(allowed=False, remaining=max(0, limit - count), retry=retry, reset=release(subs[-1][0]))

    def seen(self, call_id, now, rule):
        first = (now - rule.window_us) // rule.precision_us
        return any(i == call_id and j >= first for j, i in self.ids)

    def settle(self, now, call_id, estimate, actual, window, precision):
        """None when the call is not found, else whether any unit is left."""
        first = (now - window) // precision
        found = [(j, i) for j, i in self.ids if i == call_id and j >= first]
        if not found:
            return None
        j = found[0][0]
        self.ids[self.ids.index(found[0])] = (j, ("settled", call_id))
        units = self.subs.get(j, 0) + max(actual - estimate, -self.subs.get(j, 0))
        if units:
            self.subs[j] = units
        else:
            self.subs.pop(j, None)
        return sum(self.subs.values()) > 0

    def commit(self, now, cost, window, precision, reset, call_id):
        first = (now - window) // precision
        self.subs = {j: c for j, c in self.subs.items() if j >= first}
        cur = now // precision
        self.subs[cur] = self.subs.get(cur, 0) + cost
        if call_id is not None:
            self.ids = ([(j, i) for j, i in self.ids if j >= first] + [(cur, call_id)])[-TB_IDS:]
        ttl_ms = ceil_ms(reset)
        self.expires_at = now + ttl_ms * 1000
        return ttl_ms


DAY_US = 86_400 * MICRO
UNIX_DAY0 = datetime.date(1970, 1, 1)


def period_end(rule, now):
    """The end (exclusive, UTC microseconds) of the period holding `now`."""
    if rule.algo == "fixed_window":
        return (now // rule.window_us + 1) * rule.window_us
    off = rule.offset_s * MICRO
    local = now + off
    if rule.period == "hour":
        return (local // (3600 * MICRO) + 1) * 3600 * MICRO - off
    day = UNIX_DAY0 + datetime.timedelta(days=local // DAY_US)
    if rule.period == "day":
        nxt = day + datetime.timedelta(days=1)
    elif rule.period == "week":
        nxt = day + datetime.timedelta(days=7 - day.weekday())
    else:
        nxt = datetime.date(day.year + (day.month == 12), day.month % 12 + 1, 1)
    return (nxt - UNIX_DAY0).days * DAY_US - off


class PeriodCount:
    """Fixed window or quota: the end of the counted period, its units and
    the call ids of its admissions that carried one."""

    fragile = False

    def __init__(self):
        self.end = None
        self.count = 0
        self.ids = []
        self.expires_at = None

    def live(self, now):
        return self.end is not None and self.end > now

    def decide(self, now, cost, limit, end):
        count = 0
        if self.live(now):
            count = self.count
            end = max(end, self.end)
        if count + cost <= limit:
            return dict(allowed=True, remaining=limit - count - cost, retry=0,
                        reset=end - now if count + cost > 0 else 0, end=end)
        return dict(allowed=False, remaining=max(0, limit - count), retry=end - now, reset=end - now, end=end)

    def seen(self, call_id, now, rule):
        return self.live(now) and call_id in self.ids

    def settle(self, now, call_id, estimate, actual):
        """None when the call is not found, else whether any unit is left."""
        if not self.live(now) or call_id not in self.ids:
            return None
        self.ids[self.ids.index(call_id)] = ("settled", call_id)
        self.count = max(0, self.count + actual - estimate)
        return self.count > 0

    def commit(self, now, cost, end, call_id):
        if not self.live(now):
            self.count, self.ids = 0, []
        self.end = end
        self.count += cost
        if call_id is not None:
            self.ids = (self.ids + [call_id])[-TB_IDS:]
        ttl_ms = max(1, ceil_ms(end - now))
        self.expires_at = now + ttl_ms * 1000
        return ttl_ms


class Leases:
    """A concurrency rule's key: per lease id, its end and its slots. A
    slot counts while end > now; a denial waits for the slot, counted one
    per slot in order of end, that brings the count low enough."""

    fragile = False

    def __init__(self):
        self.held = {}  # lease id -> [end, slots]
        self.expires_at = None

    def live(self, now):
        return {i: v for i, v in self.held.items() if v[0] > now}

    def latest(self, now):
        live = self.live(now)
        return max(v[0] for v in live.values()) if live else None

    def decide(self, now, cost, limit, lease):
        live = self.live(now)
        count = sum(v[1] for v in live.values())
        latest = self.latest(now)
        reset = latest - now if latest is not None else 0
        if count + cost <= limit:
            if cost > 0:
                reset = max(reset, lease)
            return dict(allowed=True, remaining=limit - count - cost, retry=0, reset=reset)
        need = count + cost - limit
        slots = sorted(e for e, n in live.values() for _ in range(n))
        return dict(allowed=False, remaining=max(0, limit - count), retry=slots[need - 1] - now, reset=reset)

    def seen(self, call_id, now, rule):
        return call_id in self.live(now)

    def commit(self, now, cost, lease, lease_id):
        self.held = self.live(now)
        self.held[lease_id] = [now + lease, cost]
        self.expires_at = self.latest(now)

    def release(self, now, lease_id):
        held = lease_id in self.live(now)
        self.held = self.live(now)
        self.held.pop(lease_id, None)
        self.expires_at = self.latest(now)
        return held

    def extend(self, now, lease_id, end):
        self.held = self.live(now)
        if lease_id not in self.held:
            return False
        self.held[lease_id][0] = end
        self.expires_at = self.latest(now)
        return True


# ---- decisions and headers --------------------------------------------------

def headline(results):
    live = [r for r in results if not r["shadow"]]
    allowed = all(r["allowed"] for r in live)
    head = None
    for r in live:
        if not allowed and r["allowed"]:
            continue
        if head is None:
            head = r
        elif not allowed:
            if r["retry"] > head["retry"]:
                head = r
        elif (r["remaining"], r["reset"]) < (head["remaining"], head["reset"]):
            head = r
    return allowed, head


def headers(allowed, head, results):
    if head is None:
        return []
    live = [r for r in results if not r["shadow"]]
    out = [
        ["RateLimit-Limit", str(head["limit"])],
        ["RateLimit-Remaining", str(head["remaining"])],
        ["RateLimit-Reset", str(ceil_s(head["reset"]))],
        ["RateLimit-Policy", ", ".join(f'"{r["rule"]}";q={r["limit"]};w={r["w"]}' for r in live)],
        ["RateLimit", ", ".join(f'"{r["rule"]}";r={r["remaining"]};t={ceil_s(r["reset"])}' for r in live)],
    ]
    if not allowed:
        out.append(["Retry-After", str(max(1, ceil_s(head["retry"])))])
    return out


def expect_of(allowed, head, results):
    return {
        "allowed": allowed,
        "limit": head["limit"] if head else 0,
        "remaining": head["remaining"] if head else 0,
        "retry_after_ms": ceil_ms(head["retry"]) if head and not allowed else 0,
        "reset_after_ms": ceil_ms(head["reset"]) if head else 0,
        "rule": head["rule"] if head else None,
        "results": [
            {
                "rule": r["rule"], "allowed": r["allowed"], "shadow": r["shadow"],
                "limit": r["limit"], "remaining": r["remaining"],
                "retry_after_ms": ceil_ms(r["retry"]), "reset_after_ms": ceil_ms(r["reset"]),
            }
            for r in results
        ],
        "headers": headers(allowed, head, results),
    }


# ---- the model of one limiter ----------------------------------------------

class Model:
    def __init__(self, policy, start_us):
        self.rules = [Rule(r) for r in policy["rules"]]
        self.now = start_us
        self.state = {}
        # Overrides: rule key -> limit; blocks: rule key -> [until, duration, record end].
        self.overrides = {}
        self.blocks = {}
        self.metrics = {r.name: metric_zero() for r in self.rules}

    def count_results(self, results):
        """Count a decision's per-rule results in the metrics."""
        for res in results:
            m = self.metrics[res["rule"]]
            m["checks"] += 1
            if res["allowed"]:
                m["allowed"] += 1
            elif res["shadow"]:
                m["shadow_denied"] += 1
            else:
                m["denied"] += 1

    def metrics_list(self):
        return [{"rule": r.name, **self.metrics[r.name]} for r in self.rules]

    def live_state(self, rule, attrs, purpose):
        st = self.state.get(rule.key(attrs))
        if st is not None and st.expires_at is not None and self.now >= st.expires_at:
            # The embedded backend has forgotten this key; Redis (real-time
            # TTL) may not have. The difference only shows through these ops.
            if purpose in ("reset", "replay"):
                raise CaseError(f"{purpose} of rule {rule.name} after its key expired on the manual clock")
        return st

    def applicable(self, attrs):
        return [r.variant(attrs) for r in self.rules if r.applies(attrs)]

    def override_op(self, op, rule_name, attrs, limit=None):
        rule = next((r for r in self.rules if r.name == rule_name), None)
        if rule is None or not rule.overrides:
            return {"error": "invalid_argument"}
        if op == "overrides":
            listed = [{"attributes": dict(zip(r_attrs, k[2:])), "limit": v}
                      for k, v, r_attrs in sorted((k, v, rule.attrs) for k, v in self.overrides.items() if k[0] == rule_name)]
            return {"expect": {"overrides": listed}}
        if any(a not in attrs for a in rule.attrs):
            return {"error": "invalid_argument"}
        k = rule.key(attrs)
        if op == "override_set":
            if not 1 <= limit <= 1_000_000_000:
                return {"error": "invalid_argument"}
            self.overrides[k] = limit
            return {"expect": {}}
        had = self.overrides.pop(k, None) is not None
        return {"expect": {"cleared": had}}

    def evaluate(self, attrs, cost, mode, call_id=None):
        rules = self.applicable(attrs)
        if cost < 1:
            return {"error": "invalid_argument"}
        if call_id is not None:
            ok = 1 <= len(call_id) <= 64 and all(c.isalnum() and c.isascii() or c in "_-" for c in call_id)
            if not ok:
                return {"error": "invalid_argument"}
        for r in rules:
            if cost > r.limit and not r.overrides:
                return {"error": "invalid_argument"}
        if mode == "validate":
            return {}
        if not rules:
            allowed, head = headline([])
            return {"expect": expect_of(allowed, head, [])}
        # Overrides replace the limit (a bucket's capacity, its rate scaled
        # alike), read before anything else; a cost above one is an error.
        over = {}
        for idx, r in enumerate(rules):
            if r.overrides and cost > self.overrides.get(r.key(attrs), r.limit):
                return {"error": "invalid_argument"}
            if r.overrides and r.key(attrs) in self.overrides:
                v = self.overrides[r.key(attrs)]
                if r.algo == "token_bucket":
                    r.rate = r.rate * v / r.limit
                r.limit = v
                over[idx] = v
        blocks = {}
        for idx, r in enumerate(rules):
            if r.block_us is not None and r.key(attrs) in self.blocks:
                until, dur, end = self.blocks[r.key(attrs)]
                blocks[idx] = (until if until > self.now else None, dur if end > self.now else None)
        for r in rules:
            st = self.state.get(r.key(attrs))
            if st is not None and getattr(st, "fragile", False) and self.now < st.expires_at:
                raise CaseError(f"rule {r.name}: its key's TTL was below {MIN_TTL_MS} ms of real time")
        if call_id is not None:
            for r in rules:
                st = self.state.get(r.key(attrs))
                if st is None:
                    continue
                if r.algo in NEW_ALGOS or r.algo == "concurrency":
                    seen = st.seen(call_id, self.now, r)
                elif r.algo == "sliding_window_log":
                    seen = st.seen(call_id, self.now, r.window_us)
                else:
                    seen = st.seen(call_id)
                if seen:
                    self.live_state(r, attrs, "replay")
                    mode, cost = "peek", 0
                    break
        results = []
        raw = []
        for r in rules:
            st = self.state.get(r.key(attrs))
            if r.algo == "concurrency":
                o = (st or Leases()).decide(self.now, cost, r.limit, r.lease_us)
            elif r.algo == "sliding_window_log":
                o = (st or Log()).decide(self.now, cost, r.limit, r.window_us)
            elif r.algo == "sliding_window":
                o = (st or Counters()).decide(self.now, cost, r.limit, r.window_us, r.precision_us)
            elif r.algo in ("fixed_window", "quota"):
                o = (st or PeriodCount()).decide(self.now, cost, r.limit, period_end(r, self.now))
            else:
                o = (st or Bucket()).decide(self.now, cost, r.limit, r.rate)
            raw.append(o)
            results.append(dict(rule=r.name, allowed=o["allowed"], shadow=r.shadow, limit=r.limit,
                                remaining=max(0, o["remaining"]), retry=o["retry"], reset=o["reset"], w=r.header_w))
        for idx, r in enumerate(rules):
            if r.block_us is None:
                continue
            res = results[idx]
            until, previous = blocks.get(idx, (None, None))
            if until is not None:
                res.update(allowed=False, remaining=0, retry=until - self.now, reset=until - self.now)
            elif not res["allowed"] and mode == "check":
                d = r.block_us if previous is None else min(math.floor(previous * r.block_factor), r.block_max_us)
                u = self.now + d
                self.blocks[r.key(attrs)] = [u, d, u + r.block_period_us]
                if ceil_ms(d + r.block_period_us) < MIN_TTL_MS:
                    raise CaseError(f"rule {r.name}: block record TTL below {MIN_TTL_MS} ms of real time")
                res.update(remaining=0, retry=max(res["retry"], d), reset=max(res["reset"], d))
        all_pass = all(res["allowed"] or res["shadow"] for res in results)
        if not all_pass:
            # The request does not go through: a rule that would have admitted
            # it still has what it had.
            for res in results:
                if res["allowed"]:
                    res["remaining"] += cost
        if mode == "check" and all_pass:
            for r, o in zip(rules, raw):
                if not o["allowed"]:
                    continue
                k = r.key(attrs)
                if r.algo == "concurrency":
                    st = self.state.setdefault(k, Leases())
                    # The lease id: the call id, or one the limiter makes (never a given id).
                    st.commit(self.now, cost, r.lease_us, call_id if call_id is not None else object())
                    if ceil_ms(r.lease_us) < MIN_TTL_MS:
                        raise CaseError(f"rule {r.name}: lease below {MIN_TTL_MS} ms of real time")
                    continue
                if r.algo == "sliding_window_log":
                    st = self.state.get(k)
                    if st is None or (st.expires_at is not None and self.now >= st.expires_at):
                        st = self.state[k] = Log()
                    # A call without an id gets a random one, never equal to a given id.
                    ttl = st.commit(self.now, cost, r.window_us, o["reset"],
                                    call_id if call_id is not None else object())
                elif r.algo in NEW_ALGOS:
                    st = self.state.get(k)
                    if st is None or (st.expires_at is not None and self.now >= st.expires_at):
                        st = self.state[k] = Counters() if r.algo == "sliding_window" else PeriodCount()
                    if r.algo == "sliding_window":
                        ttl = st.commit(self.now, cost, r.window_us, r.precision_us, o["reset"], call_id)
                    else:
                        ttl = st.commit(self.now, cost, o["end"], call_id)
                    # A key whose real-time TTL is short may be gone from
                    # Redis early: no later step may look at it before it
                    # expires on the manual clock too.
                    st.fragile = ttl < MIN_TTL_MS
                    continue
                else:
                    st = self.state.setdefault(k, Bucket())
                    if st.expires_at is not None and self.now >= st.expires_at:
                        # Forgotten on the manual clock; in Redis the key may
                        # still be there (real-time TTL), and its ids with it.
                        if st.ids:
                            raise CaseError(f"rule {r.name}: a bucket's call ids would outlive its expiry on the manual clock")
                        st = self.state[k] = Bucket()
                    ttl = st.commit(self.now, o["left"], o["reset"], call_id)
                if ttl < MIN_TTL_MS:
                    raise CaseError(f"rule {r.name}: key TTL {ttl} ms is below {MIN_TTL_MS} ms of real time")
        for res in results:
            for f in ("retry", "reset"):
                if not 0 <= res[f] < MAX_SAFE:
                    raise CaseError(f"{f} out of range")
        allowed, head = headline(results)
        return {"expect": expect_of(allowed, head, results)}

    def reload(self, policy):
        rules = [Rule(r) for r in policy["rules"]]
        for new in rules:
            for old in self.rules:
                if old.name != new.name or old.template != new.template:
                    continue
                if old.algo != new.algo or getattr(old, "precision_us", None) != getattr(new, "precision_us", None):
                    return {"error": "invalid_policy"}
        self.rules = rules
        self.metrics = {r.name: self.metrics.get(r.name, metric_zero()) for r in rules}
        return {"expect": {}}

    def settle(self, attrs, call_id, estimate, actual):
        checked = self.evaluate(attrs, estimate, "validate", call_id)
        if "error" in checked:
            return checked
        if actual > 10 ** 15:
            return {"error": "invalid_argument"}
        n = 0
        lost = False
        for r in self.applicable(attrs):
            k = r.key(attrs)
            st = self.state.get(k)
            if st is None or r.algo == "concurrency":
                # Slots are released, not settled.
                continue
            if st.expires_at is not None and self.now >= st.expires_at:
                # Logs, counters and periods check the time themselves; a
                # bucket's ids would outlive the manual clock's expiry in Redis.
                if r.algo == "token_bucket":
                    raise CaseError(f"settle of rule {r.name} after its key expired on the manual clock")
                continue
            a = min(actual, r.limit)
            if r.algo == "sliding_window_log":
                if len({i for _, i in st.members}) > TB_IDS:
                    raise CaseError(f"rule {r.name}: the log's model keeps every id, not the last {TB_IDS}")
                done = st.settle(self.now, call_id, estimate, a, r.window_us)
            elif r.algo == "token_bucket":
                ttl = st.settle(self.now, call_id, estimate, a, r.limit, r.rate)
                # A bucket full again may be gone from Redis at once: the same as full.
                if ttl is not None and ttl < MIN_TTL_MS and st.tokens < r.limit * MICRO:
                    raise CaseError(f"rule {r.name}: key TTL {ttl} ms after a settle is below {MIN_TTL_MS} ms")
                done = ttl is not None
                lost = lost or (not done and pushed_out(st.ids, call_id))
            else:
                if r.algo == "sliding_window":
                    left = st.settle(self.now, call_id, estimate, a, r.window_us, r.precision_us)
                else:
                    left = st.settle(self.now, call_id, estimate, a)
                done = left is not None
                if left is False:
                    del self.state[k]
                if not done and r.algo == "sliding_window":
                    first = (self.now - r.window_us) // r.precision_us
                    lost = lost or pushed_out(st.ids, call_id, lambda e: e[0] >= first)
                elif not done:
                    lost = lost or (st.live(self.now) and pushed_out(st.ids, call_id))
            n += bool(done)
            if done:
                m = self.metrics[r.name]
                m["settles"] += 1
                m["settle_refunded"] += max(0, estimate - a)
                m["settle_debited"] += max(0, a - estimate)
        if lost:
            return {"error": "invalid_argument"}
        return {"expect": {"settled": n}}

    def lease_op(self, attrs, call_id, duration_ms=None):
        """A release (duration_ms None) or an extend of lease `call_id`:
        the number of concurrency rules where it held slots."""
        if duration_ms is not None and not 1 <= duration_ms <= 366 * 86_400_000:
            return {"error": "invalid_argument"}
        checked = self.evaluate(attrs, 1, "validate", call_id)
        if "error" in checked:
            return checked
        n = 0
        for r in self.applicable(attrs):
            if r.algo != "concurrency":
                continue
            st = self.state.get(r.key(attrs))
            if st is None:
                continue
            if duration_ms is None:
                n += st.release(self.now, call_id)
            else:
                n += st.extend(self.now, call_id, self.now + duration_ms * 1000)
        return {"expect": {"released" if duration_ms is None else "extended": n}}

    def acquire(self, attrs, cost, timeout_ms):
        out = self.evaluate(attrs, cost, "peek")
        if "error" in out or out["expect"]["allowed"]:
            return self.evaluate(attrs, cost, "check")
        if out["expect"]["retry_after_ms"] <= timeout_ms:
            raise CaseError("an acquire that would wait on the manual clock")
        # The check it made was denied: counted as such.
        self.count_results(out["expect"]["results"])
        return {"error": "timeout"}

    def reset(self, attrs):
        n = 0
        for r in self.applicable(attrs):
            k = r.key(attrs)
            if k in self.state:
                self.live_state(r, attrs, "reset")
                st = self.state[k]
                if getattr(st, "fragile", False) and self.now < st.expires_at:
                    raise CaseError(f"reset of rule {r.name}: its key's TTL was below {MIN_TTL_MS} ms of real time")
                del self.state[k]
                n += 1
            if k in self.blocks:
                if self.now >= self.blocks[k][2]:
                    raise CaseError(f"reset of rule {r.name}: its block record ended on the manual clock")
                del self.blocks[k]
                n += 1
        return {"expect": {"deleted": n}}


METRIC_FIELDS = ("checks", "allowed", "denied", "shadow_denied", "degraded_allowed", "degraded_denied",
                 "backend_errors", "timeouts", "settles", "settle_refunded", "settle_debited")


def metric_zero():
    return {f: 0 for f in METRIC_FIELDS}


def build(case):
    model = Model(case["policy"], case.get("start_us", START_US))
    steps = []
    for s in case["steps"]:
        adv = s.get("advance_ms", 0)
        model.now += adv * 1000
        op = s.get("op", "check")
        if op == "reload":
            step = {"advance_ms": adv, "op": op, "policy": s["policy"]}
            # A policy that does not parse is refused by the parser, which
            # the model does not restate: the case says so.
            out = {"error": "invalid_policy"} if s.get("invalid") else model.reload(s["policy"])
            if "error" in out:
                step["expect_error"] = out["error"]
            else:
                step["expect"] = out["expect"]
            steps.append(step)
            continue
        if op == "metrics":
            steps.append({"advance_ms": adv, "op": op, "expect": {"rules": copy.deepcopy(model.metrics_list())}})
            continue
        attrs = s.get("attributes", {})
        step = {"advance_ms": adv, "op": op, "attributes": attrs}
        if op == "reset":
            out = model.reset(attrs)
        elif op in ("override_set", "override_clear", "overrides"):
            step["rule"] = s["rule"]
            if op == "override_set":
                step["limit"] = s["limit"]
            out = model.override_op(op, s["rule"], attrs, s.get("limit"))
        elif op == "settle":
            step["call_id"] = s["call_id"]
            step["cost"] = s.get("cost", 1)
            step["actual_cost"] = s["actual_cost"]
            out = model.settle(attrs, s["call_id"], step["cost"], s["actual_cost"])
        elif op in ("release", "extend"):
            step["call_id"] = s["call_id"]
            if op == "extend":
                step["duration_ms"] = s["duration_ms"]
            out = model.lease_op(attrs, s["call_id"], s.get("duration_ms"))
        elif op == "acquire":
            step["cost"] = s.get("cost", 1)
            step["timeout_ms"] = s["timeout_ms"]
            out = model.acquire(attrs, step["cost"], s["timeout_ms"])
            if "expect" in out:
                model.count_results(out["expect"]["results"])
        else:
            cost = s.get("cost", 1)
            step["cost"] = cost
            if "call_id" in s:
                step["call_id"] = s["call_id"]
            out = model.evaluate(attrs, cost, op, s.get("call_id"))
            if "expect" in out:
                model.count_results(out["expect"]["results"])
        if "error" in out:
            step["expect_error"] = out["error"]
        else:
            step["expect"] = out["expect"]
        # Assertions written into the case definitions, so that a mistake in
        # the model cannot silently produce a vector that says the wrong thing.
        for field, want in s.get("assert", {}).items():
            got = step.get("expect_error") if field == "error" else step.get("expect", {}).get(field)
            if got != want:
                raise CaseError(f"{case['name']}: step {len(steps)}: {field} is {got!r}, the case says {want!r}")
        steps.append(step)
    return {
        "name": case["name"],
        "description": case["description"],
        "policy": case["policy"],
        "start_us": case.get("start_us", START_US),
        "steps": steps,
    }


# ---- the cases --------------------------------------------------------------

IP = {"ip": "203.0.113.7"}
IP2 = {"ip": "198.51.100.23"}


def swl(name, key, limit, window, **extra):
    r = {"name": name, "key": key, "limit": limit, "window": window}
    r.update(extra)
    return {k: v for k, v in r.items() if v is not None}


def tb(name, key, capacity, rate, **extra):
    r = {"name": name, "key": key, "algorithm": "token_bucket", "capacity": capacity, "refill_rate": rate}
    r.update(extra)
    return {k: v for k, v in r.items() if v is not None}


def chk(attrs, cost=1, adv=0, **kw):
    s = {"attributes": attrs, "cost": cost, "advance_ms": adv}
    if "call_id" in kw:
        s["call_id"] = kw.pop("call_id")
    if "op" in kw:
        s["op"] = kw.pop("op")
    s["assert"] = kw
    return s


def peek(attrs, cost=1, adv=0, **kw):
    return chk(attrs, cost, adv, op="peek", **kw)


def reset(attrs, adv=0, deleted=None):
    s = {"op": "reset", "attributes": attrs, "advance_ms": adv}
    if deleted is not None:
        s["assert"] = {"deleted": deleted}
    return s


def reload(rules, adv=0, invalid=False):
    return {"op": "reload", "policy": {"rules": rules}, "advance_ms": adv, "invalid": invalid}


def ovr_set(rule, attrs, limit, adv=0, **kw):
    return {"op": "override_set", "rule": rule, "attributes": attrs, "limit": limit, "advance_ms": adv, "assert": kw}


def ovr_clear(rule, attrs, adv=0, **kw):
    return {"op": "override_clear", "rule": rule, "attributes": attrs, "advance_ms": adv, "assert": kw}


def ovr_list(rule, **kw):
    return {"op": "overrides", "rule": rule, "advance_ms": 0, "assert": kw}


def metrics(adv=0):
    """A step that reads the per-rule metrics (expected from the model)."""
    return {"op": "metrics", "advance_ms": adv}


def settle(attrs, call_id, cost, actual, adv=0, settled=None, **kw):
    s = {"op": "settle", "attributes": attrs, "call_id": call_id, "cost": cost, "actual_cost": actual,
         "advance_ms": adv, "assert": kw}
    if settled is not None:
        s["assert"]["settled"] = settled
    return s


def acquire(attrs, cost=1, timeout_ms=1000, adv=0, **kw):
    return {"op": "acquire", "attributes": attrs, "cost": cost, "timeout_ms": timeout_ms, "advance_ms": adv,
            "assert": kw}


def sw(name, key, limit, window, **extra):
    r = {"name": name, "key": key, "algorithm": "sliding_window", "limit": limit, "window": window}
    r.update(extra)
    return {k: v for k, v in r.items() if v is not None}


def fw(name, key, limit, window, **extra):
    r = {"name": name, "key": key, "algorithm": "fixed_window", "limit": limit, "window": window}
    r.update(extra)
    return {k: v for k, v in r.items() if v is not None}


def quota(name, key, limit, period, **extra):
    r = {"name": name, "key": key, "algorithm": "quota", "limit": limit, "period": period}
    r.update(extra)
    return {k: v for k, v in r.items() if v is not None}


def utc_us(*ymdhms):
    """Microseconds since the epoch of a UTC date and time."""
    t = datetime.datetime(*ymdhms, tzinfo=datetime.timezone.utc)
    return int(t.timestamp()) * MICRO


CASES = []


def case(name, description, rules, steps, start_us=START_US, **top):
    policy = dict(top)
    policy["rules"] = rules
    CASES.append({"name": name, "description": description, "policy": policy, "steps": steps, "start_us": start_us})


# -- sliding window log

case("swl-exact-limit", "Three requests fit a limit of 3; the fourth is denied until the first leaves the window.",
     [swl("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP, remaining=2), chk(IP, remaining=1), chk(IP, remaining=0),
      chk(IP, allowed=False, retry_after_ms=60_000, reset_after_ms=60_000),
      chk(IP, adv=59_999, allowed=False, retry_after_ms=1),
      chk(IP, adv=1, allowed=True, remaining=2), metrics()])

case("rate-string", "A rule's `rate` gives its limit and window in one string (`3 per minute`, `2/10s`), as route limits do; the "
     "policy's [attributes] table (headers the HTTP integrations read) changes no decision.",
     [{"name": "per-ip", "key": "ip:{ip}", "rate": "3 per minute"},
      {"name": "burst", "key": "b:{ip}", "algorithm": "fixed_window", "rate": "2/10s"}],
     [chk(IP, remaining=1), chk(IP, remaining=0),
      chk(IP, allowed=False, retry_after_ms=10_000),
      chk(IP, adv=10_000, allowed=True, remaining=0),
      chk(IP, allowed=False, retry_after_ms=50_000)],
     attributes={"api_key": "header:x-api-key"})

case("swl-window-boundary", "A member scored s counts while now < s + window: denied 1 ms before, admitted exactly at the boundary.",
     [swl("per-ip", "ip:{ip}", 2, "10s")],
     [chk(IP), chk(IP, adv=1), chk(IP, adv=9_998, allowed=False, retry_after_ms=1, reset_after_ms=2),
      chk(IP, adv=1, allowed=True, remaining=0, reset_after_ms=10_000),
      chk(IP, allowed=False, retry_after_ms=1)])

case("swl-slides", "The window slides with each request instead of resetting at fixed boundaries.",
     [swl("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP), chk(IP, adv=20_000), chk(IP, adv=20_000, remaining=0),
      chk(IP, adv=10_000, allowed=False, retry_after_ms=10_000, reset_after_ms=50_000),
      chk(IP, adv=10_000, allowed=True),
      chk(IP, adv=1_000, allowed=False, retry_after_ms=19_000),
      chk(IP, adv=19_000, allowed=True, remaining=0)])

case("swl-cost", "A request of cost > 1 takes that many units; a denied one reports what is left and waits for enough members to leave.",
     [swl("per-tenant", "tenant:{tenant}", 10, "1m")],
     [chk({"tenant": "acme"}, 4, remaining=6), chk({"tenant": "acme"}, 4, adv=1_000, remaining=2),
      chk({"tenant": "acme"}, 4, adv=1_000, allowed=False, remaining=2, retry_after_ms=58_000),
      chk({"tenant": "acme"}, 2, remaining=0),
      chk({"tenant": "acme"}, 3, adv=58_000, allowed=True, remaining=1)])

case("swl-cost-nth-member", "retry_after waits for exactly the oldest `count + cost - limit` members to leave.",
     [swl("per-tenant", "tenant:{tenant}", 10, "1m")],
     [chk({"tenant": "acme"}, 3), chk({"tenant": "acme"}, 3, adv=10_000), chk({"tenant": "acme"}, 3, adv=10_000),
      chk({"tenant": "acme"}, 5, adv=10_000, allowed=False, remaining=1, retry_after_ms=40_000, reset_after_ms=50_000),
      chk({"tenant": "acme"}, 4, allowed=False, retry_after_ms=30_000),
      chk({"tenant": "acme"}, 1, remaining=0)])

case("swl-cost-limits", "cost equal to the limit passes on an empty log; above the limit, or zero, is an invalid argument.",
     [swl("per-ip", "ip:{ip}", 5, "30s")],
     [chk(IP, 6, error="invalid_argument"), chk(IP, 0, error="invalid_argument"),
      chk(IP, 5, remaining=0), chk(IP, 1, allowed=False, retry_after_ms=30_000)])

case("swl-denied-consumes-nothing", "Denied requests do not extend the wait: the log holds admitted units only.",
     [swl("per-ip", "ip:{ip}", 2, "1m")],
     [chk(IP), chk(IP), chk(IP, adv=10_000, allowed=False, retry_after_ms=50_000),
      chk(IP, adv=10_000, allowed=False, retry_after_ms=40_000),
      chk(IP, adv=10_000, allowed=False, retry_after_ms=30_000),
      chk(IP, adv=30_000, allowed=True, remaining=1)])

case("swl-peek", "peek answers what a check of that cost would get now and consumes nothing.",
     [swl("per-ip", "ip:{ip}", 3, "1m")],
     [peek(IP, remaining=2), peek(IP, 3, remaining=0), chk(IP, 2, remaining=1),
      peek(IP, adv=5_000, remaining=0, reset_after_ms=60_000), peek(IP, 2, allowed=False, remaining=1, retry_after_ms=55_000),
      chk(IP, remaining=0), peek(IP, allowed=False)])

case("swl-reset", "reset deletes the key of every applicable rule and returns how many existed; the client is then unblocked.",
     [swl("per-ip", "ip:{ip}", 2, "1m")],
     [reset(IP, deleted=0), chk(IP), chk(IP), chk(IP, allowed=False),
      reset(IP, adv=1_000, deleted=1), chk(IP, remaining=1), reset(IP2, deleted=0)])

case("swl-distinct-clients", "Each rendered key has its own log.",
     [swl("per-ip", "ip:{ip}", 1, "1m")],
     [chk(IP), chk(IP2), chk(IP, allowed=False), chk(IP2, allowed=False),
      chk({"ip": "203.0.113.70"}, allowed=True)])

case("swl-reset-after-tracks-newest", "reset_after is the time until the log is empty: it follows the newest member.",
     [swl("per-ip", "ip:{ip}", 5, "1m")],
     [chk(IP, reset_after_ms=60_000), chk(IP, adv=30_000, reset_after_ms=60_000),
      peek(IP, adv=10_000, reset_after_ms=60_000),
      chk(IP, 3, adv=10_000, remaining=0, reset_after_ms=60_000),
      chk(IP, adv=5_000, allowed=False, retry_after_ms=5_000, reset_after_ms=55_000)])

case("swl-window-units", "Windows in ms, s, m, h and d, and as integer milliseconds; the policy header rounds the window up to whole seconds.",
     [swl("ms", "a:{ip}", 2, "2500ms"), swl("int", "b:{ip}", 2, 90_500), swl("hour", "c:{ip}", 100, "1h"),
      swl("day", "d:{ip}", 1000, "1d"), swl("sec", "e:{ip}", 50, "45s")],
     [chk(IP), chk(IP, adv=100), chk(IP, adv=100, allowed=False, rule="int", retry_after_ms=90_300),
      chk(IP, adv=2_300, allowed=False, rule="int", retry_after_ms=88_000)])

case("swl-large-clock", "Wall-clock microseconds (2026) stay exact: integers below 2^53 end to end.",
     [swl("per-ip", "ip:{ip}", 2, "7d")],
     [chk(IP), chk(IP, adv=86_400_000), chk(IP, adv=1, allowed=False, retry_after_ms=604_800_000 - 86_400_001),
      chk(IP, adv=604_800_000 - 86_400_001, allowed=True)],
     start_us=EPOCH_2026_US + 123_456)

case("swl-big-cost", "A cost of several thousand units is stored and counted exactly.",
     [swl("bulk", "tenant:{tenant}", 5000, "1m")],
     [chk({"tenant": "acme"}, 2500, remaining=2500), chk({"tenant": "acme"}, 2499, adv=1, remaining=1),
      chk({"tenant": "acme"}, 2, adv=1, allowed=False, remaining=1, retry_after_ms=59_998),
      chk({"tenant": "acme"}, 1, remaining=0)])

# -- token bucket

case("tb-starts-full", "A bucket starts full; each admission takes a token; the sixth waits for one token.",
     [tb("per-key", "key:{api_key}", 5, 0.5)],
     [chk({"api_key": "k1"}, remaining=4, reset_after_ms=2_000), chk({"api_key": "k1"}, remaining=3),
      chk({"api_key": "k1"}), chk({"api_key": "k1"}), chk({"api_key": "k1"}, remaining=0, reset_after_ms=10_000),
      chk({"api_key": "k1"}, allowed=False, remaining=0, retry_after_ms=2_000, reset_after_ms=10_000)])

case("tb-continuous-refill", "Tokens refill continuously, not in steps; fractions count toward the next token.",
     [tb("per-key", "key:{api_key}", 4, 0.5)],
     [chk({"api_key": "k1"}, 4, remaining=0), chk({"api_key": "k1"}, adv=1_000, allowed=False, retry_after_ms=1_000),
      chk({"api_key": "k1"}, adv=999, allowed=False, retry_after_ms=1),
      chk({"api_key": "k1"}, adv=1, allowed=True, remaining=0, reset_after_ms=8_000),
      chk({"api_key": "k1"}, adv=5_000, remaining=1)])

case("tb-exact-micro-wait", "With 3 tokens/s one token takes 333,334 us: denied at 333,333 us, admitted at 333,334 us (rounded up to 334 ms).",
     [tb("per-key", "key:{api_key}", 100, 3)],
     [chk({"api_key": "k1"}, 100, remaining=0, reset_after_ms=33_334),
      chk({"api_key": "k1"}, allowed=False, retry_after_ms=334),
      chk({"api_key": "k1"}, adv=333, allowed=False, retry_after_ms=1),
      chk({"api_key": "k1"}, adv=1, allowed=True, remaining=0)])

case("tb-cost", "A request of cost > 1 needs that many tokens; retry_after is (cost - tokens) / rate.",
     [tb("per-key", "key:{api_key}", 10, 1)],
     [chk({"api_key": "k1"}, 7, remaining=3), chk({"api_key": "k1"}, 4, allowed=False, remaining=3, retry_after_ms=1_000),
      chk({"api_key": "k1"}, 10, allowed=False, retry_after_ms=7_000, reset_after_ms=7_000),
      chk({"api_key": "k1"}, 4, adv=1_000, remaining=0, reset_after_ms=10_000)])

case("tb-refill-caps-at-capacity", "A long idle period refills to the capacity and no further.",
     [tb("per-key", "key:{api_key}", 6, 0.25)],
     [chk({"api_key": "k1"}, 5, remaining=1), chk({"api_key": "k1"}, adv=3_600_000, remaining=5, reset_after_ms=4_000),
      chk({"api_key": "k1"}, 6, allowed=False, remaining=5, retry_after_ms=4_000)])

case("tb-remaining-floor", "remaining is the whole tokens available (floor); fractions show only in the waits.",
     [tb("per-key", "key:{api_key}", 3, 0.4)],
     [chk({"api_key": "k1"}, 3), chk({"api_key": "k1"}, adv=1_000, allowed=False, remaining=0, retry_after_ms=1_500),
      chk({"api_key": "k1"}, 2, adv=2_000, allowed=False, remaining=1, retry_after_ms=2_000),
      chk({"api_key": "k1"}, 1, remaining=0)])

case("tb-cost-limits", "cost equal to the capacity passes on a full bucket; above it, or zero, is an invalid argument.",
     [tb("per-key", "key:{api_key}", 8, 0.1)],
     [chk({"api_key": "k1"}, 9, error="invalid_argument"), chk({"api_key": "k1"}, 0, error="invalid_argument"),
      chk({"api_key": "k1"}, 8, remaining=0, reset_after_ms=80_000),
      chk({"api_key": "k1"}, 8, allowed=False, retry_after_ms=80_000)])

case("tb-peek", "peek on a bucket consumes nothing and reports the refill so far.",
     [tb("per-key", "key:{api_key}", 10, 2)],
     [peek({"api_key": "k1"}, remaining=9, reset_after_ms=500), chk({"api_key": "k1"}, 10, remaining=0),
      peek({"api_key": "k1"}, 3, adv=1_250, allowed=False, remaining=2, retry_after_ms=250),
      peek({"api_key": "k1"}, 2, remaining=0), chk({"api_key": "k1"}, 2, remaining=0)])

case("tb-reset", "reset refills the bucket at once by deleting its key.",
     [tb("per-key", "key:{api_key}", 5, 0.05)],
     [chk({"api_key": "k1"}, 5), chk({"api_key": "k1"}, allowed=False, retry_after_ms=20_000),
      reset({"api_key": "k1"}, deleted=1), chk({"api_key": "k1"}, remaining=4), reset({"api_key": "k2"}, deleted=0)])

case("tb-slow-rate", "A rate below one token per second (1 per 1000 s); the policy header advertises the full refill time.",
     [tb("per-key", "key:{api_key}", 2, 0.001)],
     [chk({"api_key": "k1"}, remaining=1, reset_after_ms=1_000_000), chk({"api_key": "k1"}),
      chk({"api_key": "k1"}, adv=600_000, allowed=False, retry_after_ms=400_000, reset_after_ms=1_400_000),
      chk({"api_key": "k1"}, adv=400_000, remaining=0)])

case("tb-fast-rate", "A fast rate: 1000 tokens/s refills one token per millisecond.",
     [tb("per-key", "key:{api_key}", 50_000, 1000)],
     [chk({"api_key": "k1"}, 50_000, remaining=0, reset_after_ms=50_000),
      chk({"api_key": "k1"}, 3, allowed=False, retry_after_ms=3),
      chk({"api_key": "k1"}, 3, adv=2, allowed=False, retry_after_ms=1), chk({"api_key": "k1"}, 3, adv=1, remaining=0)])

case("tb-inexact-rate", "A rate with no exact binary form (0.3/s): micro-token arithmetic floors every refill the same way everywhere.",
     [tb("per-key", "key:{api_key}", 3, 0.3)],
     [chk({"api_key": "k1"}, 3), chk({"api_key": "k1"}, adv=3_333, allowed=False, retry_after_ms=1),
      chk({"api_key": "k1"}, adv=1, remaining=0), chk({"api_key": "k1"}, 3, adv=7_000, allowed=False, remaining=2, retry_after_ms=3_000)])

case("tb-fractional-window-header", "The bucket's advertised window is ceil(capacity / refill_rate) seconds (10 / 3 -> 4).",
     [tb("per-key", "key:{api_key}", 10, 3)],
     [chk({"api_key": "k1"}, 10), chk({"api_key": "k1"}, allowed=False)])

# -- stacking

WEB = {"ip": "203.0.113.7", "api_key": "k_live_1"}

case("stack-mixed-all-or-nothing", "A bucket denies; the sliding window of the same request consumes nothing.",
     [swl("per-ip", "ip:{ip}", 5, "1m"), tb("per-key", "key:{api_key}", 2, 0.1)],
     [chk(WEB, rule="per-key", remaining=1), chk(WEB, rule="per-key", remaining=0),
      chk(WEB, allowed=False, rule="per-key", retry_after_ms=10_000),
      chk(WEB, allowed=False), chk({"ip": WEB["ip"]}, rule="per-ip", remaining=2)])

case("stack-window-denies", "A sliding window denies; the bucket of the same request keeps its tokens.",
     [swl("per-ip", "ip:{ip}", 1, "1m"), tb("per-key", "key:{api_key}", 10, 0.2)],
     [chk(WEB, rule="per-ip"), chk(WEB, adv=1_000, allowed=False, rule="per-ip", retry_after_ms=59_000),
      chk({"api_key": WEB["api_key"]}, 9, remaining=0, rule="per-key")])

case("stack-both-deny-longest-retry", "When several rules deny, the headline and Retry-After are the longest wait.",
     [swl("short", "s:{ip}", 1, "10s"), swl("long", "l:{ip}", 1, "1h"), tb("bucket", "b:{ip}", 1, 0.01)],
     [chk(IP), chk(IP, adv=2_000, allowed=False, rule="long", retry_after_ms=3_598_000)])

case("stack-fewest-remaining", "When allowed, the headline is the rule with the fewest remaining.",
     [swl("minute", "m:{ip}", 10, "1m"), swl("second", "s:{ip}", 3, "5s"), tb("bucket", "b:{ip}", 20, 0.2)],
     [chk(IP, rule="second", remaining=2), chk(IP, 2, rule="second", remaining=0),
      chk(IP, adv=5_000, rule="second", remaining=2), chk(IP, 3, allowed=False, rule="second", remaining=2)])

case("stack-tie-shortest-reset", "Equal remaining: the rule whose state resets first is the headline.",
     [swl("hour", "h:{ip}", 5, "1h"), swl("minute", "m:{ip}", 5, "1m")],
     [chk(IP, rule="minute", remaining=4, reset_after_ms=60_000)])

case("stack-tie-policy-order", "Equal remaining and reset_after: the first rule in policy order is the headline.",
     [swl("first", "a:{ip}", 4, "1m"), swl("second", "b:{ip}", 4, "1m")],
     [chk(IP, rule="first"), chk(IP, 3, rule="first", remaining=0),
      chk(IP, allowed=False, rule="first", retry_after_ms=60_000)])

case("stack-tie-policy-order-reversed", "The same tie with the rules swapped picks the other rule: order, not name, decides.",
     [swl("second", "b:{ip}", 4, "1m"), swl("first", "a:{ip}", 4, "1m")],
     [chk(IP, rule="second"), chk(IP, 3, rule="second", allowed=True),
      chk(IP, allowed=False, rule="second")])

case("stack-bucket-vs-window-tie", "A bucket and a window with equal remaining: the bucket refills sooner and leads.",
     [swl("window", "w:{ip}", 3, "1m"), tb("bucket", "b:{ip}", 3, 0.5)],
     [chk(IP, rule="bucket", remaining=2, reset_after_ms=2_000), chk(IP, 2, rule="bucket", reset_after_ms=6_000),
      chk(IP, allowed=False, rule="window", retry_after_ms=60_000)])

case("stack-three-rules-headers", "Three applied rules give three entries in RateLimit-Policy and RateLimit, in policy order.",
     [swl("per-ip", "ip:{ip}", 100, "1m"), tb("per-key", "key:{api_key}", 20, 5),
      swl("per-key-daily", "day:{api_key}", 1000, "1d")],
     [chk(WEB, 15, rule="per-key", remaining=5), chk(WEB, 5, adv=500)])

case("stack-many-clients-share-rule", "A per-tenant rule stacked on per-user rules: users of one tenant share the tenant's budget.",
     [swl("per-user", "t:{tenant}:u:{user}", 3, "1m"), swl("per-tenant", "t:{tenant}", 4, "1m")],
     [chk({"tenant": "acme", "user": "ann"}, 2), chk({"tenant": "acme", "user": "bob"}, 2, rule="per-tenant", remaining=0),
      chk({"tenant": "acme", "user": "cid"}, allowed=False, rule="per-tenant"),
      chk({"tenant": "zeta", "user": "ann"}, remaining=2)])

# -- applicability

case("missing-attribute", "A rule whose template names an absent attribute does not apply.",
     [swl("per-ip", "ip:{ip}", 3, "1m"), tb("per-key", "key:{api_key}", 1, 0.1)],
     [chk(IP, rule="per-ip", remaining=2), chk(WEB, rule="per-key", remaining=0),
      chk(IP, rule="per-ip", remaining=0), chk(WEB, allowed=False, rule="per-ip")])

case("no-rule-applies", "No applicable rule: admitted, no headline rule, no results, no headers; cost is not bounded by rules that do not apply.",
     [swl("per-user", "user:{user}", 1, "1m")],
     [chk(IP, rule=None, allowed=True), chk(IP, 50, allowed=True, rule=None), peek(IP, rule=None),
      reset(IP, deleted=0)])

case("match-single-value", "`match` with one value: the login rule applies to that route only.",
     [swl("per-ip", "ip:{ip}", 50, "1m"),
      swl("login", "login:{ip}", 2, "15m", match={"route": "/login"})],
     [chk({"ip": "203.0.113.7", "route": "/login"}, rule="login", remaining=1),
      chk({"ip": "203.0.113.7", "route": "/home"}, rule="per-ip", remaining=48),
      chk({"ip": "203.0.113.7", "route": "/login"}, remaining=0),
      chk({"ip": "203.0.113.7", "route": "/login"}, allowed=False, rule="login", retry_after_ms=900_000),
      chk({"ip": "203.0.113.7", "route": "/home"}, allowed=True)])

case("match-value-list", "`match` with a list: any listed value applies; matching is exact and case-sensitive.",
     [swl("writes", "w:{ip}", 1, "1m", match={"method": ["POST", "PUT", "DELETE"]})],
     [chk({"ip": "203.0.113.7", "method": "PUT"}, rule="writes"),
      chk({"ip": "203.0.113.7", "method": "DELETE"}, allowed=False),
      chk({"ip": "203.0.113.7", "method": "GET"}, allowed=True, rule=None),
      chk({"ip": "203.0.113.7", "method": "post"}, allowed=True, rule=None)])

case("match-several-attributes", "Every attribute of `match` must hold; a missing match attribute means the rule does not apply.",
     [tb("login-post", "lp:{ip}", 1, 0.01, match={"route": "/login", "method": ["POST"]})],
     [chk({"ip": "203.0.113.7", "route": "/login", "method": "GET"}, rule=None),
      chk({"ip": "203.0.113.7", "route": "/login"}, rule=None),
      chk({"ip": "203.0.113.7", "route": "/login", "method": "POST"}, rule="login-post"),
      chk({"ip": "203.0.113.7", "route": "/login", "method": "POST"}, allowed=False, retry_after_ms=100_000)])

case("cost-bounded-by-applicable-rules", "cost is checked against the limits of the rules that apply to the request only.",
     [swl("small", "s:{ip}", 2, "1m", match={"route": "/s"}), swl("big", "b:{ip}", 10, "1m")],
     [chk({"ip": "203.0.113.7", "route": "/x"}, 5, rule="big", remaining=5),
      chk({"ip": "203.0.113.7", "route": "/s"}, 5, error="invalid_argument"),
      chk({"ip": "203.0.113.7", "route": "/s"}, 2, rule="small", remaining=0)])

case("attribute-values-escaped", "Values that contain the key delimiter cannot collide: tenant 'a:b' + user 'c' and tenant 'a' + user 'b:c' are different clients.",
     [swl("per-user", "t:{tenant}:u:{user}", 1, "1m")],
     [chk({"tenant": "a:b", "user": "c"}), chk({"tenant": "a", "user": "b:c"}, allowed=True),
      chk({"tenant": "a:b", "user": "c"}, allowed=False), chk({"tenant": "{x}", "user": "%3A"}, allowed=True),
      chk({"tenant": "", "user": ""}, allowed=True), chk({"tenant": "", "user": ""}, allowed=False)])

case("long-values-hashed", "Very long attribute values (hashed into bounded keys) still count per value.",
     [swl("per-key", "key:{api_key}", 1, "1m")],
     [chk({"api_key": "k" * 300}), chk({"api_key": "k" * 299 + "j"}, allowed=True),
      chk({"api_key": "k" * 300}, allowed=False)])

# -- shadow rules

case("shadow-never-denies", "A shadow rule reports that it would deny, but the request is admitted and the headline comes from live rules.",
     [swl("per-ip", "ip:{ip}", 10, "1m"), swl("strict", "s:{ip}", 1, "1m", shadow=True)],
     [chk(IP, rule="per-ip", remaining=9), chk(IP, allowed=True, rule="per-ip", remaining=8),
      chk(IP, allowed=True, remaining=7), metrics()])

case("shadow-only", "When only shadow rules apply: admitted, no headline, no headers, results still reported.",
     [tb("trial", "t:{ip}", 1, 0.1, shadow=True)],
     [chk(IP, rule=None), chk(IP, allowed=True, rule=None), chk(IP, adv=10_000, allowed=True)])

case("shadow-commits-only-when-admitted", "A shadow rule consumes when it admits and the request passes; not when it would deny, nor when a live rule denies.",
     [swl("live", "l:{ip}", 3, "1m"), swl("trial", "t:{ip}", 2, "1m", shadow=True)],
     [chk(IP), chk(IP), chk(IP, remaining=0), chk(IP, allowed=False, rule="live"),
      chk(IP, adv=60_000, remaining=2)])

case("shadow-not-consumed-on-denial", "A live rule denies: the shadow rule that would admit consumes nothing.",
     [tb("live", "l:{ip}", 1, 0.05), tb("trial", "t:{ip}", 5, 0.05, shadow=True)],
     [chk(IP), chk(IP, allowed=False), chk(IP, allowed=False), chk(IP, adv=20_000, allowed=True)])

case("shadow-longer-wait-ignored", "When a live rule and a shadow rule both deny, the wait and Retry-After come from the live rule only.",
     [swl("live", "l:{ip}", 1, "10s"), swl("trial", "t:{ip}", 1, "1h", shadow=True)],
     [chk(IP), chk(IP, adv=1_000, allowed=False, rule="live", retry_after_ms=9_000)])

# -- policy file format

case("policy-settings-accepted", "Top-level settings and per-rule overrides of the file format are accepted; they do not change decisions.",
     [swl("per-ip", "ip:{ip}", 2, 60_000, on_backend_error="deny", shadow=False),
      tb("per-key", "key:{api_key}", 4, 0.5, on_backend_error="error")],
     [chk(WEB, rule="per-ip", remaining=1), peek(WEB, 2, allowed=False, rule="per-ip", retry_after_ms=60_000),
      peek(WEB, 3, error="invalid_argument"), chk(WEB, 0, error="invalid_argument")],
     prefix="app:", timeout="250ms", on_backend_error="allow")

# -- call ids

case("call-id-replay-window", "A check repeating a call id already recorded counts once: it is answered with the current state.",
     [swl("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP, call_id="req-0001", remaining=2), chk(IP, adv=1_000, call_id="req-0001", allowed=True, remaining=2, reset_after_ms=59_000),
      chk(IP, call_id="req-0002", remaining=1), chk(IP, remaining=0),
      chk(IP, call_id="req-0002", allowed=True, remaining=0), chk(IP, call_id="req-0003", allowed=False)])

case("call-id-replay-bucket", "A bucket recognises a re-sent call id of its last admission.",
     [tb("per-key", "key:{api_key}", 3, 0.1)],
     [chk({"api_key": "k1"}, 2, call_id="A1", remaining=1), chk({"api_key": "k1"}, 2, call_id="A1", allowed=True, remaining=1),
      chk({"api_key": "k1"}, 2, call_id="A2", allowed=False, remaining=1)])

case("call-id-replay-after-anonymous-admission", "A bucket keeps remembering a call id across later admissions without one.",
     [tb("per-key", "key:{api_key}", 3, 0.01)],
     [chk({"api_key": "k1"}, call_id="A", remaining=2), chk({"api_key": "k1"}, remaining=1),
      chk({"api_key": "k1"}, call_id="A", allowed=True, remaining=1, reset_after_ms=200_000)])

case("call-id-denied-not-recorded", "A denied call records nothing, so its retry with the same id is decided afresh.",
     [swl("per-ip", "ip:{ip}", 1, "1m")],
     [chk(IP), chk(IP, call_id="retry_me", allowed=False, retry_after_ms=60_000),
      chk(IP, adv=60_000, call_id="retry_me", allowed=True, remaining=0),
      chk(IP, adv=1_000, call_id="retry_me", allowed=True, remaining=0)])

case("call-id-stacked", "In a stacked check, an id seen by any rule makes the whole call a replay.",
     [swl("per-ip", "ip:{ip}", 5, "1m"), tb("per-key", "key:{api_key}", 5, 0.1)],
     [chk(WEB, call_id="c-1", rule="per-key", remaining=4), chk(WEB, call_id="c-1", remaining=4),
      chk(WEB, 2, call_id="c-2", remaining=2), chk(WEB, call_id="c-1", allowed=True, remaining=2)])

case("call-id-invalid", "A call id must be 1-64 characters from A-Z a-z 0-9 _ -.",
     [swl("per-ip", "ip:{ip}", 5, "1m")],
     [chk(IP, call_id="", error="invalid_argument"), chk(IP, call_id="has space", error="invalid_argument"),
      chk(IP, call_id="x" * 65, error="invalid_argument"), chk(IP, call_id="x" * 64, allowed=True, remaining=4)])

# -- reset with stacking

case("reset-stacked", "reset counts the existing keys of the applicable rules only, and unblocks all of them.",
     [swl("per-ip", "ip:{ip}", 1, "1m"), tb("per-key", "key:{api_key}", 1, 0.01),
      swl("login", "login:{ip}", 1, "1m", match={"route": "/login"})],
     [chk(WEB), chk(WEB, allowed=False), reset({"ip": WEB["ip"], "route": "/login"}, deleted=1),
      chk(WEB, allowed=False, rule="per-key"), reset(WEB, deleted=1), chk(WEB, allowed=True),
      reset(dict(WEB, route="/login"), deleted=2)])


# -- sliding window of counters

case("sw-exact-limit", "Sliding window of counters (precision 1s, the default for 1m): a unit counts until its sub-window's end plus the window, so the fourth request waits 61 s.",
     [sw("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP, remaining=2, reset_after_ms=61_000), chk(IP, remaining=1), chk(IP, remaining=0),
      chk(IP, allowed=False, retry_after_ms=61_000, reset_after_ms=61_000),
      chk(IP, adv=60_999, allowed=False, retry_after_ms=1),
      chk(IP, adv=1, allowed=True, remaining=2)])

case("sw-sub-window-end-plus-window", "Units admitted late in a sub-window count until that sub-window's end plus the window: never shorter than the exact log, at most one sub-window longer.",
     [sw("per-ip", "ip:{ip}", 2, "1m", precision="10s")],
     [chk(IP, adv=9_000, reset_after_ms=61_000), chk(IP, adv=2_000, remaining=0, reset_after_ms=69_000),
      chk(IP, adv=58_999, allowed=False, retry_after_ms=1, reset_after_ms=10_001),
      chk(IP, adv=1, allowed=True, remaining=0, reset_after_ms=70_000),
      chk(IP, adv=9_999, allowed=False, retry_after_ms=1),
      chk(IP, adv=1, allowed=True, remaining=0)])

case("sw-cost-oldest-sub-windows", "A denied request of cost > 1 waits for the oldest sub-windows holding `count + cost - limit` units to stop counting.",
     [sw("per-tenant", "tenant:{tenant}", 10, "1m", precision="5s")],
     [chk({"tenant": "acme"}, 3), chk({"tenant": "acme"}, 3, adv=10_000), chk({"tenant": "acme"}, 3, adv=10_000),
      chk({"tenant": "acme"}, 5, adv=10_000, allowed=False, remaining=1, retry_after_ms=45_000, reset_after_ms=55_000),
      chk({"tenant": "acme"}, 4, allowed=False, retry_after_ms=35_000),
      chk({"tenant": "acme"}, 1, remaining=0),
      chk({"tenant": "acme"}, 3, adv=34_999, allowed=False, retry_after_ms=1),
      chk({"tenant": "acme"}, 3, adv=1, allowed=True, remaining=0)])

case("sw-never-more-than-log", "A burst of 4 (the limit) at the end of a sub-window: the counters admit again at that sub-window's end plus the window, at most one sub-window (5 s) after the exact log (beside them as a shadow rule) and never before it.",
     [sw("counters", "c:{ip}", 4, "1m", precision="5s"), swl("log", "l:{ip}", 4, "1m", shadow=True)],
     [chk(IP, 4, adv=55_000, remaining=0), chk(IP, adv=5_000, allowed=False, retry_after_ms=60_000),
      chk(IP, adv=54_999, allowed=False, retry_after_ms=5_001), chk(IP, adv=1, allowed=False, retry_after_ms=5_000),
      chk(IP, adv=4_999, allowed=False, retry_after_ms=1),
      chk(IP, 4, adv=1, allowed=True, remaining=0)])

case("sw-peek", "peek answers what a check of that cost would get now and consumes nothing.",
     [sw("per-ip", "ip:{ip}", 3, "1m")],
     [peek(IP, remaining=2, reset_after_ms=61_000), peek(IP, 3, remaining=0), chk(IP, 2, remaining=1),
      peek(IP, adv=5_000, remaining=0, reset_after_ms=61_000), peek(IP, 2, allowed=False, remaining=1, retry_after_ms=56_000),
      chk(IP, remaining=0), peek(IP, allowed=False, retry_after_ms=56_000)])

case("sw-reset", "reset deletes a sliding window's counters; the client is unblocked.",
     [sw("per-ip", "ip:{ip}", 2, "1m")],
     [reset(IP, deleted=0), chk(IP), chk(IP), chk(IP, allowed=False),
      reset(IP, adv=1_000, deleted=1), chk(IP, remaining=1)])

case("sw-default-precision-rounded", "The default precision is 1/60 of the window rounded up to whole milliseconds: 34 ms for 2s; windows and precisions as integer milliseconds.",
     [sw("fast", "f:{ip}", 2, "2s"), sw("int", "i:{ip}", 2, 90_500, precision=500)],
     [chk(IP, rule="fast", reset_after_ms=2_010), chk(IP, adv=100, rule="fast", remaining=0),
      chk(IP, adv=100, allowed=False, rule="int", retry_after_ms=90_800, reset_after_ms=90_800)])

case("sw-large-clock", "Wall-clock microseconds (2026) stay exact in the counters' sub-window indices.",
     [sw("per-ip", "ip:{ip}", 2, "7d", precision="1h")],
     [chk(IP, reset_after_ms=608_400_000), chk(IP, adv=86_400_000),
      chk(IP, adv=1, allowed=False, retry_after_ms=608_400_000 - 86_400_001)],
     start_us=EPOCH_2026_US)

# -- fixed window

case("fw-exact-limit", "Fixed windows are aligned to the Unix epoch: the first window of the case ends 20 s after it starts, and everything resets at once.",
     [fw("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP, remaining=2, reset_after_ms=20_000), chk(IP, remaining=1), chk(IP, remaining=0),
      chk(IP, allowed=False, retry_after_ms=20_000, reset_after_ms=20_000),
      chk(IP, adv=10_000, allowed=False, retry_after_ms=10_000),
      chk(IP, adv=10_000, allowed=True, remaining=2, reset_after_ms=60_000)])

case("fw-boundary-burst", "The documented boundary burst: a full window's worth at the end of one window and another at the start of the next pass within 2 s.",
     [fw("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP, 3, adv=18_000, remaining=0, reset_after_ms=2_000), chk(IP, allowed=False, retry_after_ms=2_000),
      chk(IP, 3, adv=2_000, allowed=True, remaining=0, reset_after_ms=60_000)])

case("fw-cost-peek", "A fixed window counts cost units; peek consumes nothing; a denial waits for the window's end.",
     [fw("per-tenant", "tenant:{tenant}", 10, "1h")],
     [peek({"tenant": "acme"}, 10, remaining=0), chk({"tenant": "acme"}, 4, remaining=6),
      chk({"tenant": "acme"}, 7, adv=1_000, allowed=False, remaining=6),
      chk({"tenant": "acme"}, 6, remaining=0), peek({"tenant": "acme"}, allowed=False),
      chk({"tenant": "acme"}, 11, error="invalid_argument")],
     start_us=utc_us(2026, 3, 10, 12, 30))

case("fw-reset", "reset deletes a fixed window's counter.",
     [fw("per-ip", "ip:{ip}", 1, "1h")],
     [chk(IP), chk(IP, allowed=False), reset(IP, deleted=1), chk(IP, allowed=True), reset(IP2, deleted=0)])

case("fw-large-clock", "Wall-clock microseconds (2026), a 1d fixed window aligned to UTC midnight.",
     [fw("per-ip", "ip:{ip}", 2, "1d")],
     [chk(IP, reset_after_ms=36_000_000), chk(IP), chk(IP, adv=1_000, allowed=False, retry_after_ms=35_999_000)],
     start_us=utc_us(2026, 5, 4, 14))

# -- calendar quotas

case("quota-day-utc", "A daily quota in UTC: Reset and Retry-After count to midnight UTC.",
     [quota("daily", "key:{api_key}", 1000, "day")],
     [chk({"api_key": "k1"}, 600, remaining=400, reset_after_ms=14 * 3_600_000),
      chk({"api_key": "k1"}, 500, adv=3_600_000, allowed=False, remaining=400, retry_after_ms=13 * 3_600_000),
      chk({"api_key": "k1"}, 400, remaining=0)],
     start_us=utc_us(2026, 1, 15, 10))

case("quota-month-end", "A monthly quota resets on the first of the next month; February 2026 has 28 days.",
     [quota("monthly", "key:{api_key}", 3, "month")],
     [chk({"api_key": "k1"}, 3, remaining=0, reset_after_ms=3_000), chk({"api_key": "k1"}, allowed=False, retry_after_ms=3_000),
      chk({"api_key": "k1"}, adv=3_000, allowed=True, remaining=2, reset_after_ms=28 * 86_400_000)],
     start_us=utc_us(2026, 1, 31, 23, 59, 57))

case("quota-leap-february", "February 2024 has 29 days: a monthly quota opened on the 28th resets on March 1st, and one opened on the 29th too.",
     [quota("monthly", "key:{api_key}", 2, "month"), quota("daily", "day:{api_key}", 10, "day")],
     [chk({"api_key": "k1"}, rule="monthly", remaining=1, reset_after_ms=25 * 3_600_000),
      chk({"api_key": "k1"}, adv=2 * 3_600_000, rule="monthly", remaining=0, reset_after_ms=23 * 3_600_000),
      chk({"api_key": "k1"}, adv=22 * 3_600_000, allowed=False, rule="monthly", retry_after_ms=3_600_000),
      chk({"api_key": "k1"}, adv=3_600_000, allowed=True, rule="monthly", remaining=1, reset_after_ms=31 * 86_400_000)],
     start_us=utc_us(2024, 2, 28, 23))

case("quota-year-end", "A monthly quota in December resets on January 1st of the next year; a weekly one on Monday.",
     [quota("monthly", "m:{api_key}", 5, "month"), quota("weekly", "w:{api_key}", 5, "week")],
     [chk({"api_key": "k1"}, 5, rule="monthly", remaining=0, reset_after_ms=86_400_000),
      chk({"api_key": "k1"}, allowed=False, rule="weekly", retry_after_ms=5 * 86_400_000, reset_after_ms=5 * 86_400_000),
      chk({"api_key": "k1"}, adv=86_400_000, allowed=False, rule="weekly", retry_after_ms=4 * 86_400_000),
      chk({"api_key": "k1"}, adv=4 * 86_400_000, allowed=True, rule="weekly", remaining=4)],
     start_us=utc_us(2025, 12, 31))

case("quota-week-monday", "A weekly quota runs Monday 00:00 to Monday 00:00; 2026-01-01 is a Thursday.",
     [quota("weekly", "w:{api_key}", 2, "week")],
     [chk({"api_key": "k1"}, 2, remaining=0, reset_after_ms=4 * 86_400_000),
      chk({"api_key": "k1"}, adv=4 * 86_400_000 - 1, allowed=False, retry_after_ms=1),
      chk({"api_key": "k1"}, adv=1, allowed=True, remaining=1, reset_after_ms=7 * 86_400_000)],
     start_us=EPOCH_2026_US)

case("quota-hour", "An hourly quota resets at the next whole hour.",
     [quota("hourly", "h:{api_key}", 1, "hour")],
     [chk({"api_key": "k1"}, reset_after_ms=15 * 60_000),
      chk({"api_key": "k1"}, adv=60_000, allowed=False, retry_after_ms=14 * 60_000),
      chk({"api_key": "k1"}, adv=14 * 60_000, allowed=True, reset_after_ms=3_600_000)],
     start_us=utc_us(2026, 6, 1, 8, 45))

case("quota-utc-offset", "A daily quota at +02:00 resets at local midnight (22:00 UTC); a monthly one at -05:00 still counts January on February 1st 03:00 UTC and February until March 1st 05:00 UTC.",
     [quota("daily-cest", "d:{api_key}", 2, "day", utc_offset="+02:00"),
      quota("monthly-est", "m:{api_key}", 1, "month", utc_offset="-05:00")],
     [chk({"api_key": "k1"}, rule="monthly-est", reset_after_ms=2 * 3_600_000),
      chk({"api_key": "k1"}, adv=2 * 3_600_000, allowed=True, rule="daily-cest", remaining=0, reset_after_ms=17 * 3_600_000),
      chk({"api_key": "k1"}, adv=17 * 3_600_000 - 1_000, allowed=False, rule="monthly-est", retry_after_ms=28 * 86_400_000 - 17 * 3_600_000 + 1_000),
      chk({"api_key": "k1"}, adv=1_000, allowed=False, rule="monthly-est")],
     start_us=utc_us(2026, 2, 1, 3))

# -- reserved rules (reserve): one limiter decides exactly as the direct path

case("reserve-fw-one-limiter", "A fixed window with reserve = 4: one limiter's decisions, remaining and headers are the direct "
     "path's (remaining is the backend's count plus the units it holds), across a window's end, peeks, costs and a denial.",
     [fw("hot", "ip:{ip}", 10, "10s", reserve=4, reserve_for="1h")],
     [chk(IP, remaining=9, reset_after_ms=10_000), chk(IP, remaining=8), chk(IP, 2, remaining=6), peek(IP, 3, remaining=3),
      chk(IP, 3, adv=1_000, remaining=3), chk(IP, remaining=2), chk(IP, 2, remaining=0), chk(IP, allowed=False, retry_after_ms=9_000),
      peek(IP, allowed=False), chk(IP, adv=9_000, remaining=9, reset_after_ms=10_000), chk(IP, 5, adv=9_999, remaining=4),
      chk(IP, 4, adv=1, remaining=6, reset_after_ms=10_000), chk(IP, remaining=5)])

case("reserve-quota-one-limiter", "A daily quota with reserve = 8: the same answers as without it, and reset forgets the key "
     "(and the limiter's reservation of it).",
     [quota("daily", "key:{api_key}", 20, "day", reserve=8)],
     [chk({"api_key": "k1"}, 3, remaining=17, reset_after_ms=14 * 3_600_000), chk({"api_key": "k1"}, remaining=16),
      chk({"api_key": "k1"}, 7, remaining=9), chk({"api_key": "k1"}, 9, remaining=0), chk({"api_key": "k1"}, allowed=False),
      reset({"api_key": "k1"}, deleted=1), chk({"api_key": "k1"}, 20, remaining=0), chk({"api_key": "k2"}, remaining=19)],
     start_us=utc_us(2026, 1, 15, 10))

case("reserve-counters-one-limiter", "A sliding window of counters with reserve = 4: the reservation is counted in the "
     "current sub-window and spent before it ends; one limiter's answers are the direct path's, leftovers given back "
     "into the sub-window they were taken in, a denial and the sub-window leaving the count included.",
     [sw("hot", "c:{ip}", 10, "10s", precision="1s", reserve=4, reserve_for="1h")],
     [chk(IP, remaining=9, reset_after_ms=11_000), chk(IP, remaining=8, reset_after_ms=11_000),
      chk(IP, 2, adv=500, remaining=6, reset_after_ms=10_500), chk(IP, 2, remaining=4),
      chk(IP, adv=500, remaining=3, reset_after_ms=11_000), chk(IP, remaining=2),
      chk(IP, 3, allowed=False, remaining=2, retry_after_ms=10_000),
      chk(IP, 3, adv=10_000, remaining=5), peek(IP, remaining=4), chk(IP, remaining=4)])

case("reserve-log-one-limiter", "A sliding-window log with reserve = 4: the reservation is one entry stamped at its "
     "spend deadline; given back, it becomes the entries of the checks it paid, at their times, so one limiter's "
     "answers are the direct path's, across give-backs, a denial and entries leaving the window.",
     [swl("hot", "l:{ip}", 10, "10s", reserve=4, reserve_for="1s")],
     [chk(IP, remaining=9, reset_after_ms=10_000), chk(IP, remaining=8), chk(IP, 2, adv=200, remaining=6),
      chk(IP, 2, adv=300, remaining=4), chk(IP, adv=1_100, remaining=3), chk(IP, remaining=2),
      chk(IP, 3, allowed=False, remaining=2, retry_after_ms=8_400),
      chk(IP, 2, adv=8_400, remaining=2), peek(IP, remaining=1), chk(IP, remaining=1)])

case("reserve-bucket-one-limiter", "A token bucket with reserve = 4: the reservation is spendable until the bucket "
     "could refill to its capacity, so refilling is never clipped meanwhile; one limiter's answers, remaining and "
     "reset included, are the direct path's, across refills, give-backs (also after the reservation ended) and a denial.",
     [tb("hot", "b:{ip}", 10, 1, reserve=4, reserve_for="1h")],
     [chk(IP, 3, remaining=7, reset_after_ms=3_000), chk(IP, remaining=6, reset_after_ms=4_000),
      chk(IP, 2, adv=500, remaining=4, reset_after_ms=5_500), chk(IP, 2, adv=400, remaining=2, reset_after_ms=7_100),
      chk(IP, remaining=1, reset_after_ms=8_100), chk(IP, 3, adv=9_100, remaining=7, reset_after_ms=3_000),
      chk(IP, 5, remaining=2, reset_after_ms=8_000), chk(IP, 5, adv=9_000, remaining=5, reset_after_ms=5_000),
      chk(IP, 4, remaining=1), chk(IP, 2, allowed=False, remaining=1, retry_after_ms=1_000),
      peek(IP, remaining=0), chk(IP, 2, adv=1_000, remaining=0)])

case("reserve-stacked-all-or-nothing", "A reserved sliding window of counters stacked with a direct fixed window "
     "(their keys in one Redis Cluster slot, as a check with a reserved rule needs there): the fixed window's denial "
     "spends nothing from the reservation, and its remaining stays the direct path's.",
     [sw("hot", "{{ip:{ip}}}:c", 10, "10s", precision="1s", reserve=4, reserve_for="1h"),
      fw("fixed", "{{ip:{ip}}}:f", 3, "1m")],
     [chk(IP, rule="fixed", remaining=2), chk(IP, rule="fixed", remaining=1), chk(IP, rule="fixed", remaining=0),
      chk(IP, allowed=False, rule="fixed"), chk(IP, allowed=False, rule="fixed"), metrics()])

case("quota-big-limit", "Quotas take limits up to 10^15 (token budgets): counts stay exact.",
     [quota("tokens", "t:{tenant}", 10 ** 12, "month")],
     [chk({"tenant": "acme"}, 10 ** 12 - 1, remaining=1), chk({"tenant": "acme"}, 2, allowed=False, remaining=1),
      chk({"tenant": "acme"}, 1, remaining=0), chk({"tenant": "acme"}, 10 ** 12 + 1, error="invalid_argument")],
     start_us=utc_us(2026, 4, 10))

case("quota-peek-reset", "peek on a quota consumes nothing; reset deletes it.",
     [quota("daily", "d:{api_key}", 2, "day")],
     [peek({"api_key": "k1"}, 2, remaining=0, reset_after_ms=12 * 3_600_000), chk({"api_key": "k1"}, 2),
      peek({"api_key": "k1"}, allowed=False, retry_after_ms=12 * 3_600_000),
      reset({"api_key": "k1"}, deleted=1), chk({"api_key": "k1"}, remaining=1)],
     start_us=utc_us(2026, 7, 1, 12))

# -- the new algorithms stacked with the others

case("stack-all-algorithms", "All five algorithms in one check: admitted by all, headlined by the fewest remaining; then the quota denies and nothing is consumed anywhere.",
     [swl("log", "l:{ip}", 10, "1m"), tb("bucket", "b:{ip}", 10, 1), sw("counters", "c:{ip}", 10, "1m"),
      fw("fixed", "f:{ip}", 10, "1m"), quota("daily", "d:{api_key}", 3, "day")],
     [chk(WEB, 2, rule="daily", remaining=1), chk(WEB, 2, allowed=False, rule="daily", retry_after_ms=36_000_000),
      chk(WEB, 1, rule="daily", remaining=0),
      chk(IP, 7, rule="bucket", remaining=0),
      chk(IP, allowed=False, rule="counters", retry_after_ms=61_000), metrics()],
     start_us=utc_us(2026, 3, 2, 14))

case("stack-new-all-or-nothing", "A sliding window of counters denies: the fixed window and quota stacked with it consume nothing.",
     [sw("counters", "c:{ip}", 2, "10s", precision="1s"), fw("fixed", "f:{ip}", 5, "1h"), quota("daily", "d:{ip}", 5, "day")],
     [chk(IP, 2, rule="counters", remaining=0), chk(IP, 2, allowed=False, rule="counters", retry_after_ms=11_000),
      chk(IP, 2, adv=11_000, allowed=True, rule="counters", remaining=0),
      chk(IP, 1, adv=11_000, allowed=True, rule="fixed", remaining=0)],
     start_us=utc_us(2026, 3, 2, 14))

case("shadow-new-algorithms", "Shadow fixed windows, counters and quotas report their denials but never deny; they consume only when they admit.",
     [swl("live", "l:{ip}", 4, "1m"), fw("trial-fixed", "f:{ip}", 1, "1h", shadow=True),
      sw("trial-counters", "c:{ip}", 2, "1m", shadow=True), quota("trial-quota", "q:{ip}", 1, "day", shadow=True)],
     [chk(IP, rule="live", remaining=3), chk(IP, allowed=True, rule="live", remaining=2),
      chk(IP, allowed=True, remaining=1), chk(IP, allowed=True, remaining=0), chk(IP, allowed=False, rule="live")],
     start_us=utc_us(2026, 3, 2, 14))

case("call-id-replay-new-algorithms", "A re-sent call id counts once on counters, a fixed window and a quota; a denied call records nothing.",
     [sw("counters", "c:{ip}", 3, "1m"), fw("fixed", "f:{ip}", 3, "1h"), quota("daily", "d:{ip}", 3, "day")],
     [chk(IP, call_id="req-1", remaining=2), chk(IP, adv=1_000, call_id="req-1", allowed=True, remaining=2),
      chk(IP, 2, call_id="req-2", remaining=0), chk(IP, call_id="req-2", allowed=True, remaining=0),
      chk(IP, call_id="req-3", allowed=False), chk(IP, call_id="req-1", allowed=True, remaining=0)],
     start_us=utc_us(2026, 3, 2, 14))

case("call-id-counters-forgotten-with-sub-window", "A call id of a sliding window of counters is remembered while its sub-window counts; a fixed window forgets its ids when the window ends.",
     [sw("counters", "c:{ip}", 1, "10s", precision="2s")],
     [chk(IP, call_id="A", remaining=0), chk(IP, adv=11_999, call_id="A", allowed=True, remaining=0),
      chk(IP, adv=1, call_id="A", allowed=True, remaining=0, reset_after_ms=12_000),
      chk(IP, adv=1_000, call_id="B", allowed=False)],
     start_us=utc_us(2026, 3, 2, 14))

case("reset-new-algorithms", "reset counts the existing keys of counters, fixed windows and quotas.",
     [sw("counters", "c:{ip}", 1, "1m"), fw("fixed", "f:{ip}", 1, "1h"), quota("daily", "d:{api_key}", 1, "day")],
     [chk(WEB), chk(WEB, allowed=False), reset(IP, deleted=2), chk(WEB, allowed=False, rule="daily"),
      reset(WEB, deleted=1), chk(WEB, allowed=True)],
     start_us=utc_us(2026, 3, 2, 14))



# -- tiers: the limit picked by an attribute

FREE = {"user": "u1", "plan": "free"}
PRO = {"user": "u2", "plan": "pro"}
OTHER = {"user": "u3", "plan": "trial"}
NOPLAN = {"user": "u4"}
PLANS = {"attribute": "plan", "free": 2, "pro": 4, "default": 1}

case("tiers-window-by-plan", "A tier per plan value: the limit (and the headers' q) is the tier's; an unlisted value and an absent attribute get the default.",
     [swl("per-user", "user:{user}", None, "1m", tiers=PLANS)],
     [chk(FREE, limit=2, remaining=1), chk(FREE, remaining=0), chk(FREE, allowed=False, limit=2),
      chk(PRO, limit=4, remaining=3), chk(PRO, 3, remaining=0),
      chk(OTHER, limit=1, remaining=0), chk(OTHER, allowed=False),
      chk(NOPLAN, limit=1, remaining=0)])

case("tiers-no-default-does-not-apply", "Without a default tier, a request whose value is not listed (or absent) is not limited by the rule; the other rules still apply.",
     [swl("per-user", "user:{user}", None, "1m", tiers={"attribute": "plan", "pro": 3}),
      swl("per-ip", "ip:{ip}", 5, "1m")],
     [chk({"user": "u1", "plan": "pro", "ip": "203.0.113.7"}, rule="per-user", remaining=2),
      chk({"user": "u1", "plan": "free", "ip": "203.0.113.7"}, rule="per-ip", remaining=3),
      chk({"user": "u1"}, rule=None)])

case("tiers-cost-above-tier", "A cost above the tier's limit is an invalid argument for that tier only.",
     [swl("per-user", "user:{user}", None, "1m", tiers=PLANS)],
     [chk(FREE, 3, error="invalid_argument"), chk(PRO, 3, remaining=1), chk(FREE, 2, remaining=0)])

case("tiers-bucket", "A token bucket's tiers give capacity and refill rate; the header window is the tier's refill time.",
     [tb("per-key", "key:{api_key}", None, None,
         tiers={"attribute": "plan", "free": {"capacity": 2, "refill_rate": 0.5},
                "pro": {"capacity": 10, "refill_rate": 1}})],
     [chk({"api_key": "a", "plan": "free"}, 2, remaining=0, limit=2),
      chk({"api_key": "a", "plan": "free"}, allowed=False, retry_after_ms=2_000),
      chk({"api_key": "b", "plan": "pro"}, 4, remaining=6, limit=10),
      chk({"api_key": "c", "plan": "gold"}, rule=None)])

case("tiers-every-algorithm", "Tiers on a sliding window of counters, a fixed window and a quota, stacked.",
     [sw("sw", "u:{user}", None, "1m", tiers={"attribute": "plan", "free": 3, "pro": 6}),
      fw("fw", "u:{user}", None, "10s", tiers={"attribute": "plan", "free": 2, "pro": 5}),
      quota("day", "u:{user}", None, "day", tiers={"attribute": "plan", "free": 10, "default": 100})],
     [chk(FREE, 2, rule="fw", remaining=0), chk(FREE, allowed=False, rule="fw"),
      chk(PRO, 5, rule="fw", remaining=0), chk(PRO, adv=10_000, rule="sw", remaining=0),
      chk(PRO, adv=1_000, allowed=False, rule="sw")],
     start_us=EPOCH_2026_US + 3_600_000_000)

# -- overrides: a limit set at run time for one key

case("override-raises-and-clears", "An override replaces the limit of one key (others keep the rule's); listing shows it; clearing restores the rule's limit.",
     [swl("per-key", "key:{api_key}", 2, "1m", overrides=True)],
     [chk({"api_key": "k1"}, remaining=1, limit=2),
      ovr_set("per-key", {"api_key": "k1"}, 5),
      chk({"api_key": "k1"}, remaining=3, limit=5),
      chk({"api_key": "k2"}, remaining=1, limit=2),
      ovr_list("per-key", overrides=[{"attributes": {"api_key": "k1"}, "limit": 5}]),
      chk({"api_key": "k1"}, 3, remaining=0, limit=5),
      chk({"api_key": "k1"}, allowed=False, limit=5),
      ovr_clear("per-key", {"api_key": "k1"}, cleared=True),
      chk({"api_key": "k1"}, allowed=False, limit=2, remaining=0),
      ovr_clear("per-key", {"api_key": "k1"}, cleared=False),
      ovr_list("per-key", overrides=[])])

case("override-lowers-below-cost", "A cost above an override's limit is an invalid argument; an override below what is used denies.",
     [swl("per-key", "key:{api_key}", 10, "1m", overrides=True)],
     [chk({"api_key": "k1"}, 3, remaining=7),
      ovr_set("per-key", {"api_key": "k1"}, 2),
      chk({"api_key": "k1"}, 3, error="invalid_argument"),
      chk({"api_key": "k1"}, allowed=False, limit=2, remaining=0),
      peek({"api_key": "k2"}, 10, allowed=True, limit=10)])

case("override-bucket-scales-rate", "On a token bucket an override is the capacity and scales the refill rate alike: the refill time stays.",
     [tb("per-key", "key:{api_key}", 10, 1, overrides=True)],
     [ovr_set("per-key", {"api_key": "k1"}, 20),
      chk({"api_key": "k1"}, 20, remaining=0, limit=20, reset_after_ms=10_000),
      chk({"api_key": "k1"}, 4, allowed=False, retry_after_ms=2_000),
      chk({"api_key": "k1"}, 4, adv=2_000, remaining=0)])

case("override-with-tiers", "An override wins over the tier the request's attribute picks.",
     [swl("per-user", "user:{user}", None, "1m", tiers=PLANS, overrides=True)],
     [ovr_set("per-user", {"user": "u1"}, 3),
      chk(FREE, limit=3, remaining=2), chk(PRO, limit=4, remaining=3)])

case("override-errors", "Overrides only on a rule with overrides = true, for a key its attributes make, within the limit range.",
     [swl("per-key", "key:{api_key}", 2, "1m", overrides=True), swl("per-ip", "ip:{ip}", 2, "1m")],
     [ovr_set("per-ip", IP, 5, error="invalid_argument"),
      ovr_set("per-key", IP, 5, error="invalid_argument"),
      ovr_set("per-key", {"api_key": "k1"}, 0, error="invalid_argument"),
      ovr_set("nope", {"api_key": "k1"}, 5, error="invalid_argument"),
      ovr_list("per-ip", error="invalid_argument")])

# -- blocks: a denial that holds

LOGIN = {"ip": "203.0.113.7", "route": "/login"}

case("block-holds-after-window", "Once the rule denies, every check is denied until the block ends, with Retry-After to its end, though the window frees earlier.",
     [swl("login", "login:{ip}", 2, "5s", block="30s")],
     [chk(LOGIN), chk(LOGIN),
      chk(LOGIN, allowed=False, remaining=0, retry_after_ms=30_000, reset_after_ms=30_000),
      chk(LOGIN, adv=10_000, allowed=False, retry_after_ms=20_000),
      peek(LOGIN, adv=10_000, allowed=False, retry_after_ms=10_000),
      chk(LOGIN, adv=9_999, allowed=False, retry_after_ms=1),
      chk(LOGIN, adv=1, allowed=True, remaining=1),
      chk({"ip": "198.51.100.23"}, allowed=True)])

case("block-escalates", "A key blocked again within block_period after its block ended is blocked block_factor times as long, up to block_max.",
     [swl("login", "login:{ip}", 1, "2s", block="3s", block_factor=2, block_max="10s", block_period="1m")],
     [chk(LOGIN), chk(LOGIN, allowed=False, retry_after_ms=3_000),
      chk(LOGIN, adv=3_000, allowed=True), chk(LOGIN, allowed=False, retry_after_ms=6_000),
      chk(LOGIN, adv=6_000, allowed=True), chk(LOGIN, allowed=False, retry_after_ms=10_000),
      chk(LOGIN, adv=10_000, allowed=True), chk(LOGIN, allowed=False, retry_after_ms=10_000)])

case("block-period-forgets", "After block_period has passed since a block ended, the next denial starts from block again.",
     [fw("login", "login:{ip}", 1, "2s", block="4s", block_factor=3, block_max="1m", block_period="20s")],
     [chk(LOGIN), chk(LOGIN, allowed=False, retry_after_ms=4_000),
      chk(LOGIN, adv=4_000), chk(LOGIN, allowed=False, retry_after_ms=12_000),
      chk(LOGIN, adv=12_000), chk(LOGIN, adv=40_000), chk(LOGIN, allowed=False, retry_after_ms=4_000)],
     start_us=START_US)

case("block-peek-sets-none", "A peek that would be denied sets no block; a check does.",
     [swl("login", "login:{ip}", 1, "2s", block="10s")],
     [chk(LOGIN), peek(LOGIN, allowed=False, retry_after_ms=2_000),
      chk(LOGIN, adv=2_000, allowed=True), chk(LOGIN, allowed=False, retry_after_ms=10_000),
      peek(LOGIN, adv=5_000, allowed=False, retry_after_ms=5_000)])

case("block-stacked-all-or-nothing", "A block is set only by its own rule's denial; a denied check consumes nothing elsewhere, and the block's write is the only one it makes.",
     [swl("per-ip", "ip:{ip}", 3, "1m", block="1m"), swl("per-user", "user:{user}", 1, "1m")],
     [chk({"ip": "203.0.113.7", "user": "a"}, rule="per-user", remaining=0),
      chk({"ip": "203.0.113.7", "user": "a"}, allowed=False, rule="per-user", retry_after_ms=60_000),
      chk({"ip": "203.0.113.7", "user": "b"}, allowed=True, remaining=0, rule="per-user"),
      chk({"ip": "203.0.113.7", "user": "c"}, allowed=True, rule="per-ip", remaining=0),
      chk({"ip": "203.0.113.7", "user": "d"}, allowed=False, rule="per-ip", retry_after_ms=60_000),
      chk({"ip": "203.0.113.7", "user": "d"}, adv=30_000, allowed=False, rule="per-ip", retry_after_ms=30_000),
      chk({"ip": "203.0.113.7", "user": "d"}, adv=30_000, allowed=True, rule="per-user")])

case("block-shadow-reports", "A shadow rule's block is reported but never denies.",
     [swl("login", "login:{ip}", 1, "1m", block="5m", shadow=True), swl("per-ip", "ip:{ip}", 10, "1m")],
     [chk(LOGIN), chk(LOGIN, allowed=True, rule="per-ip"), chk(LOGIN, adv=60_000, allowed=True), metrics()])

case("block-with-override-and-tiers", "Blocks, tiers and overrides together: the tier or override gives the limit, the block follows its denial.",
     [fw("per-user", "user:{user}", None, "1m", tiers=PLANS, overrides=True, block="2m")],
     [ovr_set("per-user", {"user": "u2"}, 1),
      chk(PRO, limit=1, remaining=0), chk(PRO, allowed=False, limit=1, retry_after_ms=120_000),
      chk(FREE, 2, limit=2, remaining=0), chk(FREE, allowed=False, retry_after_ms=120_000)],
     start_us=START_US)

# -- settle: costs known only after the response

case("settle-window-refund-once", "A log check of estimate 5 settled at 2 gives 3 units back; a second settle of the same call id changes nothing.",
     [swl("per-ip", "ip:{ip}", 10, "1m")],
     [chk(IP, 5, call_id="req-1", remaining=5),
      settle(IP, "req-1", 5, 2, adv=10, settled=1),
      peek(IP, remaining=7),
      settle(IP, "req-1", 5, 9, settled=0),
      chk(IP, remaining=7),
      chk(IP, adv=59_990, remaining=8)])

case("settle-window-debit-beyond-limit", "A debit beyond the limit is recorded at the check's time (capped at the limit): the next requests wait until the check leaves the window.",
     [swl("per-ip", "ip:{ip}", 5, "1m")],
     [chk(IP, 2, call_id="req-1", remaining=3),
      chk(IP, adv=1_000, remaining=2),
      settle(IP, "req-1", 2, 40, adv=1_000, settled=1),
      chk(IP, allowed=False, retry_after_ms=58_000),
      chk(IP, adv=57_999, allowed=False, retry_after_ms=1),
      chk(IP, adv=1, allowed=True, remaining=3)])

case("settle-window-to-zero", "Settling at 0 removes every unit of the check; the call id is gone, so a second settle finds nothing.",
     [swl("per-ip", "ip:{ip}", 3, "1m")],
     [chk(IP, 3, call_id="req-1", remaining=0),
      chk(IP, allowed=False),
      settle(IP, "req-1", 3, 0, settled=1),
      peek(IP, 3, allowed=True, remaining=0),
      settle(IP, "req-1", 3, 3, settled=0),
      chk(IP, 3, remaining=0)])

case("settle-window-after-the-window", "A settle after the check's units have left the window changes nothing.",
     [swl("per-ip", "ip:{ip}", 3, "5s")],
     [chk(IP, 2, call_id="req-1"), chk(IP, adv=3_000),
      settle(IP, "req-1", 2, 3, adv=2_000, settled=0),
      chk(IP, remaining=1)])

case("settle-bucket-refund-and-debit", "A bucket gets a refund back (at most full) and loses a debit below zero, which the refill waits off.",
     [tb("per-key", "k:{api_key}", 10, 0.5)],
     [chk(WEB, 4, call_id="a", remaining=6),
      settle(WEB, "a", 4, 1, settled=1),
      peek(WEB, remaining=8),
      chk(WEB, 9, call_id="b", remaining=0),
      settle(WEB, "b", 9, 10, settled=1),
      chk(WEB, allowed=False, remaining=0, retry_after_ms=4_000),
      settle(WEB, "b", 9, 1, settled=0),
      chk(WEB, adv=4_000, allowed=True, remaining=0),
      peek(WEB, 10, adv=10_000, allowed=False, remaining=5),

      peek(WEB, 10, adv=10_000, allowed=True), metrics()])

case("settle-bucket-refund-capped-at-capacity", "A refund never fills a bucket beyond its capacity.",
     [tb("per-key", "k:{api_key}", 5, 0.5)],
     [chk(WEB, 5, call_id="a", remaining=0),
      chk(WEB, adv=4_000, remaining=1),
      settle(WEB, "a", 5, 0, settled=1),
      peek(WEB, 5, allowed=True, remaining=0),
      chk(WEB, 5, allowed=True, remaining=0),
      chk(WEB, allowed=False)])

case("settle-counters", "A sliding window of counters settles in the check's own sub-window: the refund leaves when it would have, the debit counts until that sub-window stops counting.",
     [sw("per-ip", "c:{ip}", 10, "1m", precision="1s")],
     [chk(IP, 6, call_id="a", remaining=4),
      chk(IP, 1, adv=5_000, remaining=3),
      settle(IP, "a", 6, 2, settled=1),
      peek(IP, remaining=6),
      settle(IP, "a", 6, 12, settled=0),
      chk(IP, 3, call_id="b", remaining=4),
      settle(IP, "b", 3, 9, settled=1),
      chk(IP, allowed=False, retry_after_ms=61_000),
      chk(IP, adv=60_999, allowed=False, retry_after_ms=1),
      chk(IP, adv=1, allowed=True, remaining=9)])

case("settle-fixed-window-and-quota", "Fixed windows and quotas settle while the check's period runs; after it ends, a settle changes nothing.",
     [fw("fixed", "f:{ip}", 10, "1h"), quota("daily", "d:{api_key}", 100, "day")],
     [chk(WEB, 3, call_id="a", remaining=7, rule="fixed"),
      settle(WEB, "a", 3, 8, settled=2),
      peek(WEB, remaining=1, rule="fixed"),
      chk(WEB, 3, call_id="b", allowed=False, rule="fixed"),
      chk(WEB, 1, call_id="c", remaining=1),
      settle(WEB, "c", 1, 0, settled=2),
      peek(WEB, remaining=1),
      settle(WEB, "a", 3, 0, settled=0),
      chk(WEB, 1, call_id="d", remaining=1),
      settle(WEB, "d", 1, 5, adv=3_600_000, settled=1),
      peek(WEB, rule="fixed", remaining=9)],
     start_us=utc_us(2026, 3, 2, 10))

case("settle-stacked-only-where-consumed", "A stacked check settles on every rule it consumed from: a shadow rule that would have denied recorded nothing and is not settled.",
     [swl("per-ip", "ip:{ip}", 10, "1m"), tb("per-key", "k:{api_key}", 20, 0.5),
      fw("shadow-fixed", "s:{ip}", 2, "1h", shadow=True)],
     [chk(WEB, 2, call_id="a", remaining=8, rule="per-ip"),
      chk(WEB, 1, call_id="b"),
      settle(WEB, "b", 1, 4, settled=2),
      peek(WEB, remaining=3, rule="per-ip"),
      settle(WEB, "a", 2, 1, settled=3),
      settle(WEB, "never-checked", 1, 4, settled=0), metrics()],
     start_us=utc_us(2026, 3, 2, 10))

TENANT = {"tenant": "t"}

case("settle-pushed-out", "A key keeps the last 64 call ids recorded on it: a call still among them settles (once; a "
     "second settle answers 0 though the list is full); a call that 64 newer ones pushed out cannot be settled: an "
     "invalid_argument error, and nothing changes.",
     [tb("bucket", "b:{tenant}", 1_000, 0.001), sw("counters", "c:{tenant}", 1_000, "1h"),
      fw("window", "f:{tenant}", 1_000, "1h")],
     [chk(TENANT, 2, call_id="a")] + [chk(TENANT, call_id=f"n{i}") for i in range(1, 64)] +
     [settle(TENANT, "a", 2, 1, settled=3), settle(TENANT, "a", 2, 1, settled=0),
      chk(TENANT, 3, call_id="b")] + [chk(TENANT, call_id=f"n{i}") for i in range(64, 128)] +
     [peek(TENANT, remaining=868),
      settle(TENANT, "b", 3, 0, error="invalid_argument"), settle(TENANT, "b", 3, 9, error="invalid_argument"),
      peek(TENANT, remaining=868),
      settle(TENANT, "n127", 1, 0, settled=3), settle(TENANT, "n127", 1, 0, settled=0),
      peek(TENANT, remaining=869)],
     start_us=utc_us(2026, 3, 2, 10))

case("settle-invalid", "A settle validates like a check (the estimate is a cost, the call id well formed) and bounds the actual cost.",
     [swl("per-ip", "ip:{ip}", 10, "1m")],
     [chk(IP, 2, call_id="a"),
      settle(IP, "a", 0, 1, error="invalid_argument"),
      settle(IP, "a", 11, 1, error="invalid_argument"),
      settle(IP, "not valid!", 2, 1, error="invalid_argument"),
      settle(IP, "a", 2, 10 ** 15 + 1, error="invalid_argument"),
      settle(IP, "a", 2, 10 ** 15, settled=1),
      chk(IP, allowed=False, retry_after_ms=60_000), metrics()])

# -- acquire: waiting instead of refusing (on a manual clock: no wait)

case("acquire-admitted-at-once", "acquire returns the admitting decision at once when the check admits.",
     [swl("per-ip", "ip:{ip}", 2, "1m"), tb("per-key", "k:{api_key}", 5, 0.2)],
     [acquire(WEB, 1, timeout_ms=100, remaining=1, rule="per-ip"),
      acquire(WEB, 1, timeout_ms=0, remaining=0)])

case("acquire-timeout-when-the-wait-is-longer", "acquire fails with the timeout error kind at once when the wait asked for is longer than its timeout; it consumes nothing.",
     [swl("per-ip", "ip:{ip}", 1, "1m")],
     [chk(IP), acquire(IP, 1, timeout_ms=59_999, error="timeout"),
      acquire(IP, 1, adv=30_000, timeout_ms=29_999, error="timeout"),
      acquire(IP, 0, timeout_ms=10, error="invalid_argument"),
      acquire(IP, 1, adv=30_000, timeout_ms=0, remaining=0), metrics()])



# ---- concurrency ------------------------------------------------------------

def conc(name, key, limit, lease, **extra):
    r = {"name": name, "key": key, "algorithm": "concurrency", "limit": limit, "lease": lease}
    r.update(extra)
    return {k: v for k, v in r.items() if v is not None}


def release(attrs, call_id, adv=0, released=None, **kw):
    s = {"op": "release", "attributes": attrs, "call_id": call_id, "advance_ms": adv, "assert": kw}
    if released is not None:
        s["assert"]["released"] = released
    return s


def extend(attrs, call_id, duration_ms, adv=0, extended=None, **kw):
    s = {"op": "extend", "attributes": attrs, "call_id": call_id, "duration_ms": duration_ms,
         "advance_ms": adv, "assert": kw}
    if extended is not None:
        s["assert"]["extended"] = extended
    return s


USER = {"user": "u1"}

case("conc-check-release", "A concurrency rule admits `limit` slots at once; a denial waits for the earliest lease to end; a release frees its slot at once, and a second release frees nothing.",
     [conc("jobs", "user:{user}", 2, "30s")],
     [chk(USER, call_id="a", remaining=1, reset_after_ms=30_000),
      chk(USER, adv=1_000, call_id="b", remaining=0, reset_after_ms=30_000),
      chk(USER, adv=1_000, allowed=False, remaining=0, retry_after_ms=28_000, reset_after_ms=29_000),
      release(USER, "a", released=1),
      release(USER, "a", released=0),
      peek(USER, remaining=0, allowed=True),
      chk(USER, call_id="c", remaining=0),
      chk(USER, allowed=False, retry_after_ms=29_000)])

case("conc-expiry-on-the-clock", "A slot never released comes back when its lease ends, not before; a release after that frees nothing.",
     [conc("jobs", "user:{user}", 1, "10s")],
     [chk(USER, call_id="a", remaining=0),
      chk(USER, adv=9_999, allowed=False, retry_after_ms=1),
      chk(USER, adv=1, call_id="b", allowed=True, remaining=0),
      release(USER, "a", released=0),
      release(USER, "b", released=1),
      peek(USER, remaining=0, allowed=True, reset_after_ms=10_000)])

case("conc-extend", "An extend renews a lease still held to end `duration` from now; a lease that has ended is never brought back.",
     [conc("jobs", "user:{user}", 1, "10s")],
     [chk(USER, call_id="a", remaining=0),
      extend(USER, "a", 20_000, adv=5_000, extended=1),
      chk(USER, adv=10_000, allowed=False, retry_after_ms=10_000, reset_after_ms=10_000),
      extend(USER, "a", 5_000, adv=10_000, extended=0),
      release(USER, "a", released=0),
      chk(USER, call_id="b", remaining=0),
      extend(USER, "b", 1_000, extended=1),
      chk(USER, adv=999, allowed=False, retry_after_ms=1),
      chk(USER, adv=1, allowed=True)])

case("conc-cost-slots", "A check of cost N takes N slots under one lease; a denial waits for the slot, counted one per slot by end, that makes room; a release gives all N back.",
     [conc("jobs", "user:{user}", 5, "30s")],
     [chk(USER, 3, call_id="a", remaining=2),
      chk(USER, 2, adv=1_000, call_id="b", remaining=0),
      chk(USER, 4, allowed=False, remaining=0, retry_after_ms=30_000),
      chk(USER, 1, allowed=False, retry_after_ms=29_000),
      release(USER, "a", released=1),
      peek(USER, 3, allowed=True, remaining=0),
      chk(USER, 4, allowed=False, retry_after_ms=30_000),
      chk(USER, 6, error="invalid_argument")])

case("conc-replay-call-id", "A check re-sent with the same call id while its lease holds is answered without taking slots again.",
     [conc("jobs", "user:{user}", 2, "30s")],
     [chk(USER, call_id="a", remaining=1),
      chk(USER, adv=1_000, call_id="a", allowed=True, remaining=1),
      chk(USER, call_id="b", remaining=0),
      release(USER, "a", released=1),
      chk(USER, call_id="a", remaining=0)])

case("conc-stacked-all-or-nothing", "Stacked with a rate rule: a request denied by either takes no slot and consumes no rate unit.",
     [conc("jobs", "user:{user}", 1, "30s"), swl("rate", "r:{user}", 2, "1m")],
     [chk(USER, call_id="a", allowed=True, rule="jobs"),
      chk(USER, call_id="b", allowed=False, rule="jobs", retry_after_ms=30_000),
      peek(USER, allowed=False, rule="jobs"),
      release(USER, "a", released=1),
      chk(USER, call_id="c", allowed=True, remaining=0),
      release(USER, "c", released=1),
      chk(USER, call_id="d", allowed=False, rule="rate"),
      release(USER, "d", released=0),
      peek(USER, allowed=False, rule="rate"),
      chk(USER, adv=60_000, call_id="e", allowed=True)])

case("conc-shadow-and-settle", "A shadow concurrency rule reports a denial but takes no slot for it; a settle skips concurrency rules (slots are released, not settled).",
     [conc("jobs", "user:{user}", 1, "30s", shadow=True), swl("rate", "r:{user}", 10, "1m")],
     [chk(USER, call_id="a", allowed=True, rule="rate"),
      chk(USER, call_id="b", allowed=True, rule="rate"),
      release(USER, "b", released=0),
      settle(USER, "a", 1, 3, settled=1),
      release(USER, "a", released=1),
      chk(USER, call_id="c", allowed=True)])

case("conc-exempt", "Exempt attribute values and IP networks skip a rule before any round trip, as if it did not match; other requests are limited.",
     [conc("jobs", "ip:{ip}", 1, "30s", exempt={"ip": ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"],
                                                  "api_key": "healthcheck"}),
      swl("rate", "r:{ip}", 1, "1m", exempt={"route": ["/health"]})],
     [chk({"ip": "10.1.2.3"}, call_id="a", allowed=True, rule="rate"),
      chk({"ip": "10.1.2.3"}, allowed=False, rule="rate"),
      chk({"ip": "10.1.2.3", "route": "/health"}, allowed=True, rule=None),
      chk({"ip": "2001:db8::5", "route": "/health"}, allowed=True, rule=None),
      chk({"ip": "192.0.2.7", "route": "/health"}, allowed=True, rule=None),
      chk({"ip": "192.0.2.8", "route": "/health"}, call_id="b", allowed=True, rule="jobs"),
      chk({"ip": "192.0.2.8", "route": "/health"}, allowed=False, rule="jobs"),
      chk({"ip": "192.0.2.8", "route": "/health", "api_key": "healthcheck"}, allowed=True, rule=None),
      release({"ip": "192.0.2.8"}, "b", released=1),
      release({"ip": "10.1.2.3"}, "a", released=0)])

def random_cases(count, seed):
    """Random cases for exploratory runs (`--random N --out DIR`): not part
    of the suite, but replayed by the same runners to look for disagreements."""
    import random
    rnd = random.Random(seed)
    made = []
    attempts = 0
    while len(made) < count and attempts < count * 20:
        attempts += 1
        rules = []
        for i in range(rnd.randint(1, 3)):
            key = rnd.choice(["ip:{ip}", "k:{api_key}", "t:{ip}:{api_key}", "all"])
            extra = {}
            if rnd.random() < 0.2:
                extra["shadow"] = True
            if rnd.random() < 0.2:
                extra["match"] = {"route": rnd.choice(["/a", ["/a", "/b"]])}
            pick = rnd.random()
            if pick < 0.25:
                rules.append(swl(f"r{i}", key, rnd.randint(1, 8), rnd.choice(["5s", "30s", "1m", 90_500, "1h"]), **extra))
            elif pick < 0.45:
                window = rnd.choice(["10s", "30s", "1m", 90_500, "1h"])
                if rnd.random() < 0.5:
                    extra["precision"] = rnd.choice(["1m", "6m"] if window == "1h" else ["1s", "2500ms", 700, "10s"])
                rules.append(sw(f"r{i}", key, rnd.randint(1, 8), window, **extra))
            elif pick < 0.6:
                rules.append(fw(f"r{i}", key, rnd.randint(1, 8), rnd.choice(["10s", "1m", 90_500, "1h"]), **extra))
            elif pick < 0.75:
                if rnd.random() < 0.5:
                    extra["utc_offset"] = rnd.choice(["+02:00", "-05:00", "+05:30", "+14:00", "-12:00"])
                rules.append(quota(f"r{i}", key, rnd.randint(1, 8), rnd.choice(["hour", "day", "week", "month"]), **extra))
            else:
                rate = rnd.choice([0.01, 0.1, 0.3, 0.5, 0.25, 0.05, 0.7])
                rules.append(tb(f"r{i}", key, rnd.randint(2, 12), rate, **extra))
        steps = []
        for _ in range(rnd.randint(3, 25)):
            attrs = {"ip": rnd.choice(["1.1.1.1", "2.2.2.2"])}
            if rnd.random() < 0.7:
                attrs["api_key"] = rnd.choice(["a", "b"])
            if rnd.random() < 0.6:
                attrs["route"] = rnd.choice(["/a", "/b", "/c"])
            op = rnd.choices(["check", "peek", "reset"], [10, 2, 1])[0]
            adv = rnd.choice([0, 0, 1, 10, 333, 999, 1000, 2500, 10_000, 60_000])
            if op == "reset":
                steps.append(reset(attrs, adv))
                continue
            s = chk(attrs, rnd.choice([1, 1, 1, 2, 3]), adv, op=op)
            if op == "check" and rnd.random() < 0.15:
                s["call_id"] = rnd.choice(["id1", "id2"])
            steps.append(s)
        c = {"name": f"random-{seed}-{len(made)}", "description": "random", "policy": {"rules": rules},
             "steps": steps, "start_us": rnd.choice([START_US, EPOCH_2026_US]) + rnd.randint(0, 10 ** 9) * rnd.choice([1, 1000])}
        try:
            made.append(build(c))
        except CaseError:
            continue
    return made


def render(v):
    return json.dumps(v, indent=2, ensure_ascii=False) + "\n"


# -- reload

IPK = {"ip": "203.0.113.7", "api_key": "k_1"}

case("reload-keeps-state",
     "A reload keeps the state of rules whose name, key and algorithm are unchanged (a higher limit counts "
     "what was admitted), starts a rule with a new key afresh, refuses a new algorithm under the same name "
     "and key and a policy that does not parse (the old rules stay), and a key given back finds its state again.",
     [swl("per-ip", "ip:{ip}", 3, "10s"), tb("per-key", "key:{api_key}", 4, 0.25)],
     [chk(IPK, remaining=2), chk(IPK, remaining=1),
      reload([swl("per-ip", "ip:{ip}", 5, "10s"), tb("per-key", "apikey:{api_key}", 4, 0.25),
              swl("login", "login:{ip}", 1, "10s", match={"route": "/login"})]),
      chk(IPK, remaining=2, limit=5), metrics(),
      reload([tb("per-ip", "ip:{ip}", 5, 1)]),
      reload([swl("per-ip", "ip:{ip}", 0, "10s")], invalid=True),
      chk(IPK, remaining=1, limit=5),
      reload([swl("per-ip", "ip:{ip}", 5, "10s"), tb("per-key", "key:{api_key}", 4, 0.25)]),
      chk(IPK, remaining=0, rule="per-ip"),
      chk(IPK, adv=10_000, remaining=2, rule="per-key"), metrics()])

def main(argv):
    if "--random" in argv:
        count = int(argv[argv.index("--random") + 1])
        out = argv[argv.index("--out") + 1]
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1
        os.makedirs(out, exist_ok=True)
        for v in random_cases(count, seed):
            with open(os.path.join(out, v["name"] + ".json"), "w", encoding="utf-8") as f:
                f.write(render(v))
        print(f"wrote random vectors to {out}")
        return 0
    check = "--check" in argv
    names = set()
    stale = []
    for c in CASES:
        if c["name"] in names:
            raise CaseError(f"duplicate case name {c['name']}")
        names.add(c["name"])
        text = render(build(c))
        path = os.path.join(HERE, c["name"] + ".json")
        old = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                old = f.read()
        if old != text:
            if check:
                stale.append(os.path.basename(path))
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
    extra = sorted(f for f in os.listdir(HERE) if f.endswith(".json") and f[:-5] not in names)
    if check:
        if stale or extra:
            print("stale vectors: " + ", ".join(stale + extra) + "; run python3 tests/vectors/generate.py",
                  file=sys.stderr)
            return 1
        print(f"{len(CASES)} vectors up to date")
        return 0
    for f in extra:
        os.remove(os.path.join(HERE, f))
    print(f"wrote {len(CASES)} vectors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
