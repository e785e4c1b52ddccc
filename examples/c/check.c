/*
 * throttlegate from C: load a policy file, check a burst of requests from one
 * client on the embedded backend (or the Redis named by $TG_REDIS_URL), print
 * each decision and the headers of the first denial.
 *
 *   cc check.c -o check -lthrottlegate
 *   ./check rules.toml
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <throttlegate.h>

/* Print the failed call's code and message, and give the exit status. */
static int report(const char *what, tg_result rc) {
    fprintf(stderr, "%s: %s (%s)\n", what, tg_last_error_message(), tg_result_name(rc));
    return 1;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "rules.toml";
    const char *url = getenv("TG_REDIS_URL") != NULL ? getenv("TG_REDIS_URL") : "memory://";
    tg_policy *policy = NULL;
    tg_limiter *limiter = NULL;
    int status = 0;

    tg_result rc = tg_policy_from_file(path, &policy);
    if (rc != TG_OK) return report("policy", rc);
    rc = tg_limiter_new(policy, url, &limiter);
    tg_policy_free(policy); /* the limiter keeps its own copy */
    if (rc != TG_OK) return report("limiter", rc);

    /* Reset first, so a shared Redis starts from a clean slate for this client. */
    tg_attribute attrs[] = {{"ip", "203.0.113.7"}, {"api_key", "k_example"}};
    uint64_t deleted = 0;
    rc = tg_limiter_reset(limiter, attrs, 2, &deleted);
    if (rc != TG_OK) status = report("reset", rc);

    int denials = 0;
    for (int i = 1; i <= 4 && status == 0; i++) {
        tg_decision *d = NULL;
        tg_decision_info info;
        rc = tg_limiter_check(limiter, attrs, 2, 1, &d);
        if (rc != TG_OK) {
            status = report("check", rc);
            break;
        }
        tg_decision_get(d, &info);
        printf("request %d: %s by %s, remaining %" PRIu64 ", retry after %" PRIu64 " ms\n", i,
               info.allowed ? "allowed" : "denied", info.rule != NULL ? info.rule : "(no rule)",
               info.remaining, info.retry_after_ms);
        if (!info.allowed && denials++ == 0) {
            size_t n = 0;
            tg_decision_header_count(d, false, &n);
            for (size_t h = 0; h < n; h++) {
                const char *name, *value;
                tg_decision_header(d, false, h, &name, &value);
                printf("  %s: %s\n", name, value);
            }
        }
        tg_decision_free(d);
    }
    /* Capacity 3: the fourth request is denied by the bucket. */
    if (status == 0 && denials != 1) {
        fprintf(stderr, "expected exactly one denial, got %d\n", denials);
        status = 1;
    }
    tg_limiter_free(limiter);
    return status;
}
