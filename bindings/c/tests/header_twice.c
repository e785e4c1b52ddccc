/*
 * The header compiles as C11 and as C++ (scripts/test-c.sh builds this file
 * both ways with -Wall -Wextra -Werror -pedantic) and can be included twice.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#include <throttlegate.h>
#include <throttlegate.h>

#ifdef __cplusplus
static_assert(sizeof(tg_result) == 4, "tg_result is 32 bits");
#else
_Static_assert(sizeof(tg_result) == 4, "tg_result is 32 bits");
#endif

/* Every type and a few functions used, so a broken declaration cannot hide. */
int header_twice_uses(void);
int header_twice_uses(void) {
    tg_attribute attrs[1] = {{"ip", "203.0.113.7"}};
    tg_decision_info info;
    tg_rule_result result;
    tg_stats stats;
    tg_policy *policy = NULL;
    tg_limiter *limiter = NULL;
    tg_limiter_options *options = NULL;
    tg_clock *clock = NULL;
    tg_decision *decision = NULL;
    tg_result rc = tg_policy_from_str("{}", &policy);
    tg_failure_mode mode = TG_FAILURE_DENY;
    (void)attrs;
    (void)info;
    (void)result;
    (void)stats;
    (void)limiter;
    (void)options;
    (void)clock;
    (void)decision;
    (void)mode;
    tg_policy_free(policy);
    return rc == TG_OK ? 0 : (int)rc;
}
