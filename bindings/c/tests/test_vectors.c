/*
 * Conformance vector runner for the C API: replays every vector file given
 * on the command line (the tests/vectors files, format in tests/vectors/README.md)
 * against the embedded backend, the Redis at $TG_REDIS_URL and, when
 * $TG_REDIS_CLUSTER_URL is set, the Redis Cluster it names, each with a
 * manual clock and a fresh key prefix per file, and compares every field,
 * per-rule result and header with the expected values.
 *
 * A file with a `cases` array holds bad-input vectors (tests/vectors/errors):
 * each policy text goes to tg_policy_from_str(), each option and call case
 * runs on every backend, and every failure must have the result code of the
 * expected kind and exactly the expected tg_last_error_message().
 *
 * Usage: test_vectors FILE.json...   (exit status 0 when every step matches)
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <throttlegate.h>

#include "json.h"

static int failures = 0;
static const char *current_file = "";
static const char *current_backend = "";
static size_t current_step = 0;

static void mismatch(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s [%s] step %zu: ", current_file, current_backend, current_step);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

static int expect_u64(const json_value *expect, const char *key, uint64_t got) {
    const json_value *want = json_get(expect, key);
    if (want == NULL) return 1;
    if (want->type != JSON_NUMBER || !want->is_integer || want->integer < 0 ||
        (uint64_t)want->integer != got) {
        mismatch("%s: expected %.*s, got %" PRIu64, key, (int)want->raw_len, want->raw, got);
        return 0;
    }
    return 1;
}

static int expect_bool(const json_value *expect, const char *key, bool got) {
    const json_value *want = json_get(expect, key);
    if (want == NULL) return 1;
    if (want->type != JSON_BOOL || want->boolean != got) {
        mismatch("%s: expected %.*s, got %s", key, (int)want->raw_len, want->raw, got ? "true" : "false");
        return 0;
    }
    return 1;
}

static int expect_str(const json_value *expect, const char *key, const char *got) {
    const json_value *want = json_get(expect, key);
    if (want == NULL) return 1;
    if (want->type == JSON_NULL && got == NULL) return 1;
    if (want->type == JSON_STRING && got != NULL && strcmp(want->string, got) == 0) return 1;
    mismatch("%s: expected %.*s, got %s%s%s", key, (int)want->raw_len, want->raw, got ? "\"" : "",
             got ? got : "null", got ? "\"" : "");
    return 0;
}

static void check_decision(const tg_decision *d, const json_value *expect) {
    tg_decision_info info;
    if (tg_decision_get(d, &info) != TG_OK) {
        mismatch("tg_decision_get failed: %s", tg_last_error_message());
        return;
    }
    expect_bool(expect, "allowed", info.allowed);
    expect_u64(expect, "limit", info.limit);
    expect_u64(expect, "remaining", info.remaining);
    expect_u64(expect, "retry_after_ms", info.retry_after_ms);
    expect_u64(expect, "reset_after_ms", info.reset_after_ms);
    expect_str(expect, "rule", info.rule);
    expect_bool(expect, "degraded", info.degraded);

    const json_value *results = json_get(expect, "results");
    if (results != NULL) {
        if (results->count != info.result_count) {
            mismatch("results: expected %zu, got %zu", results->count, info.result_count);
        } else {
            for (size_t i = 0; i < results->count; i++) {
                tg_rule_result r;
                if (tg_decision_result(d, i, &r) != TG_OK) {
                    mismatch("tg_decision_result(%zu) failed: %s", i, tg_last_error_message());
                    continue;
                }
                const json_value *w = results->items[i];
                expect_str(w, "rule", r.rule);
                expect_bool(w, "allowed", r.allowed);
                expect_bool(w, "shadow", r.shadow);
                expect_u64(w, "limit", r.limit);
                expect_u64(w, "remaining", r.remaining);
                expect_u64(w, "retry_after_ms", r.retry_after_ms);
                expect_u64(w, "reset_after_ms", r.reset_after_ms);
                expect_u64(w, "window_ms", r.window_ms);
            }
        }
    }

    const json_value *headers = json_get(expect, "headers");
    if (headers != NULL) {
        size_t n = 0;
        if (tg_decision_header_count(d, false, &n) != TG_OK) {
            mismatch("tg_decision_header_count failed: %s", tg_last_error_message());
            return;
        }
        if (n != headers->count) {
            mismatch("headers: expected %zu, got %zu", headers->count, n);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            const char *name = NULL, *value = NULL;
            if (tg_decision_header(d, false, i, &name, &value) != TG_OK) {
                mismatch("tg_decision_header(%zu) failed: %s", i, tg_last_error_message());
                continue;
            }
            const json_value *pair = headers->items[i];
            if (pair->type != JSON_ARRAY || pair->count != 2 || strcmp(pair->items[0]->string, name) != 0 ||
                strcmp(pair->items[1]->string, value) != 0) {
                mismatch("header %zu: expected %.*s, got [\"%s\", \"%s\"]", i, (int)pair->raw_len, pair->raw,
                         name, value);
            }
        }
    }
}

/* Attributes of a step as tg_attribute pairs pointing into the JSON tree. */
static tg_attribute *step_attributes(const json_value *step, size_t *len) {
    const json_value *attrs = json_get(step, "attributes");
    *len = 0;
    if (attrs == NULL || attrs->count == 0) return NULL;
    tg_attribute *out = calloc(attrs->count, sizeof *out);
    for (size_t i = 0; i < attrs->count; i++) {
        out[i].name = attrs->keys[i];
        out[i].value = attrs->items[i]->string;
    }
    *len = attrs->count;
    return out;
}

/* A reload step: its policy (the JSON text as written) to tg_limiter_reload(). */
static tg_result reload_step(tg_limiter *limiter, const json_value *step) {
    const json_value *policy_json = json_get(step, "policy");
    if (policy_json == NULL) {
        mismatch("a reload step has no policy");
        return TG_INTERNAL;
    }
    char *text = strndup(policy_json->raw, policy_json->raw_len);
    tg_policy *policy = NULL;
    tg_result rc = tg_policy_from_str(text, &policy);
    if (rc == TG_OK) rc = tg_limiter_reload(limiter, policy, NULL);
    tg_policy_free(policy);
    free(text);
    return rc;
}

/* Two JSON values are equal: same type and value, objects whatever their
 * members' order. */
static bool json_equal(const json_value *a, const json_value *b) {
    if (a == NULL || b == NULL || a->type != b->type) return false;
    switch (a->type) {
    case JSON_NULL: return true;
    case JSON_BOOL: return a->boolean == b->boolean;
    case JSON_NUMBER: return a->number == b->number;
    case JSON_STRING: return strcmp(a->string, b->string) == 0;
    case JSON_ARRAY:
        if (a->count != b->count) return false;
        for (size_t i = 0; i < a->count; i++)
            if (!json_equal(a->items[i], b->items[i])) return false;
        return true;
    case JSON_OBJECT:
        if (a->count != b->count) return false;
        for (size_t i = 0; i < a->count; i++)
            if (!json_equal(a->items[i], json_get(b, a->keys[i]))) return false;
        return true;
    }
    return false;
}

/* The overrides listed (tg_limiter_overrides_json) must be the step's
 * `overrides`, each without its "rule" (which is the step's). */
static void check_overrides(const char *listed, const json_value *expect, const char *rule) {
    char err[200];
    json_value *got = json_parse(listed, err, sizeof err);
    const json_value *want = json_get(expect, "overrides");
    if (got == NULL || got->type != JSON_ARRAY || want == NULL || want->type != JSON_ARRAY) {
        mismatch("overrides: not an array: %s", listed);
    } else if (got->count != want->count) {
        mismatch("overrides: %zu listed, expected %zu: %s", got->count, want->count, listed);
    } else {
        for (size_t i = 0; i < got->count; i++) {
            const json_value *r = json_get(got->items[i], "rule");
            if (r == NULL || r->type != JSON_STRING || strcmp(r->string, rule) != 0) mismatch("overrides[%zu]: rule", i);
            if (!json_equal(json_get(got->items[i], "attributes"), json_get(want->items[i], "attributes")) ||
                !json_equal(json_get(got->items[i], "limit"), json_get(want->items[i], "limit"))) {
                mismatch("overrides[%zu]: got %s", i, listed);
            }
        }
    }
    json_free(got);
}

/* A metrics step: every rule of the policy in force, in order, with its
 * counters (tg_limiter_rule_metrics by index) and its name (the samples of
 * tg_limiter_metrics_text); no rule beyond those expected. */
static void check_metrics(const tg_limiter *limiter, const json_value *expect) {
    const json_value *rules = json_get(expect, "rules");
    if (rules == NULL || rules->type != JSON_ARRAY) {
        mismatch("metrics: the step expects no rules");
        return;
    }
    char *text = NULL;
    if (tg_limiter_metrics_text(limiter, &text) != TG_OK || text == NULL) {
        mismatch("metrics: no text: %s", tg_last_error_message());
        return;
    }
    for (size_t i = 0; i < rules->count; i++) {
        const json_value *want = rules->items[i];
        tg_rule_metrics m;
        if (tg_limiter_rule_metrics(limiter, i, &m) != TG_OK) {
            mismatch("metrics: rule %zu: %s", i, tg_last_error_message());
            break;
        }
        expect_u64(want, "checks", m.checks);
        expect_u64(want, "allowed", m.allowed);
        expect_u64(want, "denied", m.denied);
        expect_u64(want, "shadow_denied", m.shadow_denied);
        expect_u64(want, "degraded_allowed", m.degraded_allowed);
        expect_u64(want, "degraded_denied", m.degraded_denied);
        expect_u64(want, "backend_errors", m.backend_errors);
        expect_u64(want, "timeouts", m.timeouts);
        expect_u64(want, "settles", m.settles);
        expect_u64(want, "settle_refunded", m.settle_refunded);
        expect_u64(want, "settle_debited", m.settle_debited);
        const json_value *name = json_get(want, "rule");
        char sample[256];
        snprintf(sample, sizeof sample, "throttlegate_checks_total{rule=\"%s\"} %" PRIu64 "\n",
                 name != NULL && name->type == JSON_STRING ? name->string : "", m.checks);
        if (strstr(text, sample) == NULL) mismatch("metrics: rule %zu: no sample %s", i, sample);
    }
    tg_rule_metrics beyond;
    if (tg_limiter_rule_metrics(limiter, rules->count, &beyond) != TG_INVALID_ARGUMENT) {
        mismatch("metrics: more rules than the %zu expected", rules->count);
    }
    tg_string_free(text);
}

/* Run one step's op (check, with a call id or not, peek, reset, reload, the
 * override ops, settle, release and extend by call id, acquire, metrics) on its attributes; false (and a
 * mismatch) for an unknown op. */
static bool run_op(tg_limiter *limiter, const json_value *step, const char *op, uint64_t cost,
                   const json_value *call_id, tg_result *rc, tg_decision **d, uint64_t *deleted,
                   bool *cleared, char **listed) {
    size_t attrs_len;
    tg_attribute *attrs = step_attributes(step, &attrs_len);
    bool known = true;
    const json_value *rule = json_get(step, "rule");
    const char *rule_name = rule != NULL && rule->type == JSON_STRING ? rule->string : "";
    const json_value *limit = json_get(step, "limit");
    if (strcmp(op, "override_set") == 0) {
        *rc = tg_limiter_set_override(limiter, rule_name, attrs, attrs_len,
                                      limit != NULL ? (uint64_t)limit->integer : 0);
    } else if (strcmp(op, "override_clear") == 0) {
        *rc = tg_limiter_clear_override(limiter, rule_name, attrs, attrs_len, cleared);
    } else if (strcmp(op, "overrides") == 0) {
        *rc = tg_limiter_overrides_json(limiter, rule_name, listed);
    } else if (strcmp(op, "check") == 0 && call_id != NULL && call_id->type == JSON_STRING) {
        *rc = tg_limiter_check_with_call_id(limiter, attrs, attrs_len, cost, call_id->string, d);
    } else if (strcmp(op, "check") == 0) {
        *rc = tg_limiter_check(limiter, attrs, attrs_len, cost, d);
    } else if (strcmp(op, "peek") == 0) {
        *rc = tg_limiter_peek(limiter, attrs, attrs_len, cost, d);
    } else if (strcmp(op, "reset") == 0) {
        *rc = tg_limiter_reset(limiter, attrs, attrs_len, deleted);
    } else if (strcmp(op, "reload") == 0) {
        *rc = reload_step(limiter, step);
    } else if (strcmp(op, "settle") == 0) {
        const json_value *actual = json_get(step, "actual_cost");
        uint32_t settled = 0;
        *rc = tg_limiter_settle_call(limiter, attrs, attrs_len, call_id != NULL ? call_id->string : NULL, cost,
                                     actual != NULL ? (uint64_t)actual->integer : 0, &settled);
        *deleted = settled;
    } else if (strcmp(op, "metrics") == 0) {
        *rc = TG_OK; /* read and compared with the expectation by check_metrics() */
    } else if (strcmp(op, "release") == 0) {
        uint32_t released = 0;
        *rc = tg_limiter_release_call(limiter, attrs, attrs_len, call_id != NULL ? call_id->string : NULL, &released);
        *deleted = released;
    } else if (strcmp(op, "extend") == 0) {
        const json_value *duration = json_get(step, "duration_ms");
        uint32_t extended = 0;
        *rc = tg_limiter_extend_call(limiter, attrs, attrs_len, call_id != NULL ? call_id->string : NULL,
                                     duration != NULL ? (uint64_t)duration->integer : 0, &extended);
        *deleted = extended;
    } else if (strcmp(op, "acquire") == 0) {
        const json_value *timeout = json_get(step, "timeout_ms");
        *rc = tg_limiter_acquire(limiter, attrs, attrs_len, cost, timeout != NULL ? (uint64_t)timeout->integer : 0, d);
    } else {
        mismatch("unknown op %s", op);
        known = false;
    }
    free(attrs);
    return known;
}

static void run_steps(const json_value *vector, tg_limiter *limiter, tg_clock *clock) {
    const json_value *steps = json_get(vector, "steps");
    if (steps == NULL || steps->type != JSON_ARRAY) {
        mismatch("no steps");
        return;
    }
    for (size_t i = 0; i < steps->count; i++) {
        const json_value *step = steps->items[i];
        current_step = i;
        const json_value *advance = json_get(step, "advance_ms");
        if (advance != NULL && advance->integer > 0 &&
            tg_clock_advance_ms(clock, (uint64_t)advance->integer) != TG_OK) {
            mismatch("tg_clock_advance_ms failed: %s", tg_last_error_message());
        }
        const json_value *op_v = json_get(step, "op");
        const char *op = op_v != NULL ? op_v->string : "check";
        const json_value *cost_v = json_get(step, "cost");
        uint64_t cost = cost_v != NULL ? (uint64_t)cost_v->integer : 1;
        const json_value *call_id = json_get(step, "call_id");
        const json_value *expect = json_get(step, "expect");
        const json_value *expect_error = json_get(step, "expect_error");
        tg_result rc;
        tg_decision *d = NULL;
        uint64_t deleted = 0;
        bool cleared = false;
        char *listed = NULL;
        if (!run_op(limiter, step, op, cost, call_id, &rc, &d, &deleted, &cleared, &listed)) continue;

        if (expect_error != NULL) {
            if (rc == TG_OK) {
                mismatch("expected error %s, got success", expect_error->string);
            } else if (strcmp(tg_result_name(rc), expect_error->string) != 0) {
                mismatch("expected error %s, got %s (%s)", expect_error->string, tg_result_name(rc),
                         tg_last_error_message());
            } else if (tg_last_error_message()[0] == '\0') {
                mismatch("error %s has no message", tg_result_name(rc));
            }
        } else if (rc != TG_OK) {
            mismatch("unexpected error %s: %s", tg_result_name(rc), tg_last_error_message());
        } else if (expect != NULL && strcmp(op, "reset") == 0) {
            expect_u64(expect, "deleted", deleted);
        } else if (strcmp(op, "reload") == 0) {
            if (expect == NULL || expect->type != JSON_OBJECT || expect->count != 0) mismatch("a reload expects {}");
        } else if (expect != NULL && strcmp(op, "override_set") == 0) {
            if (expect->count != 0) mismatch("override_set expects nothing");
        } else if (expect != NULL && strcmp(op, "override_clear") == 0) {
            const json_value *want = json_get(expect, "cleared");
            if (want == NULL || want->type != JSON_BOOL || want->boolean != cleared)
                mismatch("cleared: got %s", cleared ? "true" : "false");
        } else if (expect != NULL && strcmp(op, "overrides") == 0) {
            check_overrides(listed, expect, json_get(step, "rule")->string);
        } else if (expect != NULL && strcmp(op, "settle") == 0) {
            expect_u64(expect, "settled", deleted);
        } else if (expect != NULL && strcmp(op, "metrics") == 0) {
            check_metrics(limiter, expect);
        } else if (expect != NULL && strcmp(op, "release") == 0) {
            expect_u64(expect, "released", deleted);
        } else if (expect != NULL && strcmp(op, "extend") == 0) {
            expect_u64(expect, "extended", deleted);
        } else if (expect != NULL) {
            check_decision(d, expect);
        }
        tg_string_free(listed);
        tg_decision_free(d);
    }
}

#define MAX_BACKENDS 3
static const char *backend_urls[MAX_BACKENDS];
static const char *backend_names[MAX_BACKENDS];
static int backend_count = 0;

/* The outcome rc of a call must be the failure `want` names: its
 * `expect_error` (the result code's id) and its exact `message`. */
static void expect_failure(tg_result rc, const char *message_now, const json_value *want) {
    const json_value *kind = json_get(want, "expect_error");
    const json_value *message = json_get(want, "message");
    if (kind == NULL || kind->type != JSON_STRING || message == NULL || message->type != JSON_STRING) {
        mismatch("expect_error and message must be strings");
        return;
    }
    if (rc == TG_OK) {
        mismatch("expected %s \"%s\", got success", kind->string, message->string);
    } else if (strcmp(tg_result_name(rc), kind->string) != 0 || strcmp(message_now, message->string) != 0) {
        mismatch("expected %s \"%s\", got %s \"%s\"", kind->string, message->string, tg_result_name(rc),
                 message_now);
    }
}

/* A limiter for an error case's policy on `url`, with a fresh prefix and
 * then the case's own `options`. On failure returns the code of the call
 * that failed and copies its message to `message`. */
static tg_result error_case_limiter(const json_value *c, const char *url, const char *prefix, tg_limiter **out,
                                    char *message, size_t message_len) {
    const json_value *policy_json = json_get(c, "policy");
    message[0] = '\0';
    if (policy_json == NULL) {
        mismatch("no policy");
        return TG_INTERNAL;
    }
    char *policy_text = strndup(policy_json->raw, policy_json->raw_len);
    tg_policy *policy = NULL;
    tg_limiter_options *options = NULL;
    tg_result rc = tg_policy_from_str(policy_text, &policy);
    if (rc != TG_OK) {
        mismatch("the case's policy is rejected: %s", tg_last_error_message());
    } else if ((rc = tg_limiter_options_new(&options)) != TG_OK ||
               (rc = tg_limiter_options_set_url(options, url)) != TG_OK ||
               (rc = tg_limiter_options_set_prefix(options, prefix)) != TG_OK ||
               (rc = tg_limiter_options_set_timeout_ms(options, 60000)) != TG_OK ||
               (rc = tg_limiter_options_set_on_backend_error(options, TG_FAILURE_ERROR)) != TG_OK) {
        mismatch("cannot make the options: %s", tg_last_error_message());
    } else {
        /* The vector's option names are the setters' names. */
        const json_value *opts = json_get(c, "options");
        for (size_t i = 0; opts != NULL && rc == TG_OK && i < opts->count; i++) {
            const char *value = opts->items[i]->string;
            if (value == NULL) {
                mismatch("option %s is not a string", opts->keys[i]);
                rc = TG_INTERNAL;
            } else if (strcmp(opts->keys[i], "url") == 0) {
                rc = tg_limiter_options_set_url(options, value);
            } else if (strcmp(opts->keys[i], "prefix") == 0) {
                rc = tg_limiter_options_set_prefix(options, value);
            } else {
                mismatch("unknown option %s", opts->keys[i]);
                rc = TG_INTERNAL;
            }
        }
        if (rc == TG_OK) rc = tg_limiter_new_with_options(policy, options, out);
    }
    if (rc != TG_OK) snprintf(message, message_len, "%s", tg_last_error_message());
    tg_limiter_options_free(options);
    tg_policy_free(policy);
    free(policy_text);
    return rc;
}

static void run_error_steps(const json_value *c, tg_limiter *limiter) {
    const json_value *steps = json_get(c, "steps");
    for (size_t i = 0; i < steps->count; i++) {
        const json_value *step = steps->items[i];
        current_step = i;
        const json_value *op_v = json_get(step, "op");
        const char *op = op_v != NULL ? op_v->string : "check";
        if (strcmp(op, "close") == 0) {
            if (tg_limiter_close(limiter) != TG_OK) mismatch("tg_limiter_close failed: %s", tg_last_error_message());
            continue;
        }
        const json_value *cost_v = json_get(step, "cost");
        uint64_t cost = cost_v != NULL ? (uint64_t)cost_v->integer : 1;
        const json_value *call_id = json_get(step, "call_id");
        tg_result rc;
        tg_decision *d = NULL;
        uint64_t deleted = 0;
        bool cleared = false;
        char *listed = NULL;
        if (!run_op(limiter, step, op, cost, call_id, &rc, &d, &deleted, &cleared, &listed)) continue;
        expect_failure(rc, tg_last_error_message(), step);
        tg_string_free(listed);
        tg_decision_free(d);
    }
}

/* The bad-input cases of one file (see the header comment). */
static void run_error_cases(const char *path, const json_value *cases, int index) {
    char where[512];
    for (size_t n = 0; n < cases->count; n++) {
        const json_value *c = cases->items[n];
        const json_value *name = json_get(c, "name");
        snprintf(where, sizeof where, "%s %s", path, name != NULL && name->string != NULL ? name->string : "?");
        current_file = where;
        current_backend = "-";
        current_step = 0;
        const json_value *text = json_get(c, "policy_text");
        if (text != NULL) {
            tg_policy *policy = NULL;
            tg_result rc = tg_policy_from_str(text->string, &policy);
            expect_failure(rc, tg_last_error_message(), c);
            tg_policy_free(policy);
            continue;
        }
        const json_value *steps = json_get(c, "steps");
        for (int b = 0; b < backend_count; b++) {
            current_backend = backend_names[b];
            current_step = 0;
            char prefix[64];
            snprintf(prefix, sizeof prefix, "tgc-err-%ld-%d-%zu-%d:", (long)getpid(), index, n, b);
            tg_limiter *limiter = NULL;
            char message[1024];
            tg_result rc = error_case_limiter(c, backend_urls[b], prefix, &limiter, message, sizeof message);
            if (json_get(c, "options") != NULL) {
                expect_failure(rc, message, c);
            } else if (rc != TG_OK) {
                mismatch("cannot build the limiter: %s", message);
            } else if (steps == NULL || steps->type != JSON_ARRAY) {
                mismatch("a case has one of policy_text, options or steps");
            } else {
                run_error_steps(c, limiter);
            }
            tg_limiter_free(limiter);
        }
    }
}

static void run_file(const char *path, int index) {
    current_file = path;
    current_backend = "-";
    current_step = 0;
    char *text = json_read_file(path);
    if (text == NULL) {
        mismatch("cannot read the file");
        return;
    }
    char err[256];
    json_value *vector = json_parse(text, err, sizeof err);
    if (vector == NULL) {
        mismatch("malformed JSON: %s", err);
        free(text);
        return;
    }
    const json_value *cases = json_get(vector, "cases");
    if (cases != NULL && cases->type == JSON_ARRAY) {
        run_error_cases(path, cases, index);
        json_free(vector);
        free(text);
        return;
    }
    const json_value *policy_json = json_get(vector, "policy");
    const json_value *start_us = json_get(vector, "start_us");
    if (policy_json == NULL || start_us == NULL || !start_us->is_integer) {
        mismatch("no policy or start_us");
        json_free(vector);
        free(text);
        return;
    }
    char *policy_text = strndup(policy_json->raw, policy_json->raw_len);
    tg_policy *policy = NULL;
    if (tg_policy_from_str(policy_text, &policy) != TG_OK) {
        mismatch("policy rejected: %s", tg_last_error_message());
    } else {
        for (int b = 0; b < backend_count; b++) {
            current_backend = backend_names[b];
            char prefix[64];
            snprintf(prefix, sizeof prefix, "tgc-vec-%ld-%d-%d:", (long)getpid(), index, b);
            tg_clock *clock = NULL;
            tg_limiter_options *options = NULL;
            tg_limiter *limiter = NULL;
            if (tg_clock_manual_new(start_us->integer, &clock) != TG_OK ||
                tg_limiter_options_new(&options) != TG_OK ||
                tg_limiter_options_set_url(options, backend_urls[b]) != TG_OK ||
                tg_limiter_options_set_prefix(options, prefix) != TG_OK ||
                tg_limiter_options_set_clock(options, clock) != TG_OK ||
                /* Slow machines and valgrind must not turn answers into degraded ones. */
                tg_limiter_options_set_timeout_ms(options, 60000) != TG_OK ||
                tg_limiter_options_set_on_backend_error(options, TG_FAILURE_ERROR) != TG_OK ||
                tg_limiter_new_with_options(policy, options, &limiter) != TG_OK) {
                mismatch("cannot build the limiter: %s", tg_last_error_message());
            } else {
                run_steps(vector, limiter, clock);
            }
            tg_limiter_free(limiter);
            tg_limiter_options_free(options);
            tg_clock_free(clock);
        }
    }
    tg_policy_free(policy);
    free(policy_text);
    json_free(vector);
    free(text);
}

int main(int argc, char **argv) {
    const char *redis_url = getenv("TG_REDIS_URL");
    if (redis_url == NULL || redis_url[0] == '\0') {
        fprintf(stderr, "test_vectors: TG_REDIS_URL must name the test redis-server\n");
        return 2;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: test_vectors FILE.json...\n");
        return 2;
    }
    backend_urls[backend_count] = "memory://";
    backend_names[backend_count++] = "memory";
    backend_urls[backend_count] = redis_url;
    backend_names[backend_count++] = "redis";
    const char *cluster_url = getenv("TG_REDIS_CLUSTER_URL");
    if (cluster_url != NULL && cluster_url[0] != '\0') {
        backend_urls[backend_count] = cluster_url;
        backend_names[backend_count++] = "cluster";
    }
    for (int i = 1; i < argc; i++) {
        run_file(argv[i], i);
    }
    printf("test_vectors: %d files x %d backends, %d mismatches\n", argc - 1, backend_count, failures);
    return failures == 0 ? 0 : 1;
}
