/*
 * A small JSON reader for the conformance vector runner: enough of RFC 8259
 * to read the tests/vectors files (objects, arrays, strings with escapes,
 * numbers, true/false/null), keeping each value's raw text so a nested
 * object can be handed to tg_policy_from_str() as is.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef TG_TEST_JSON_H
#define TG_TEST_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
    json_type type;
    bool boolean;
    double number;
    bool is_integer;       /* the literal had no fraction or exponent */
    long long integer;     /* valid when is_integer */
    char *string;          /* decoded UTF-8, NUL-terminated (strings) */
    size_t count;          /* items (arrays) or members (objects) */
    struct json_value **items;
    char **keys;           /* member names (objects) */
    const char *raw;       /* the value's text in the source */
    size_t raw_len;
} json_value;

/* Parse text; NULL on error with a message in err. Free with json_free(). */
json_value *json_parse(const char *text, char *err, size_t err_len);
void json_free(json_value *v);
/* The member `key` of an object, or NULL. */
const json_value *json_get(const json_value *object, const char *key);
/* A whole file's contents, NUL-terminated (free()), or NULL. */
char *json_read_file(const char *path);

#endif
