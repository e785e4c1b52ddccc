/*
 * A small JSON reader for the conformance vector runner (see json.h).
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *start;
    const char *p;
    char *err;
    size_t err_len;
    int depth;
} parser;

static void fail(parser *ps, const char *what) {
    if (ps->err[0] == '\0') {
        snprintf(ps->err, ps->err_len, "%s at offset %ld", what, (long)(ps->p - ps->start));
    }
}

static void skip_ws(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') {
        ps->p++;
    }
}

static json_value *new_value(json_type type, const char *raw) {
    json_value *v = calloc(1, sizeof *v);
    if (v != NULL) {
        v->type = type;
        v->raw = raw;
    }
    return v;
}

static int hex4(const char *s, unsigned *out) {
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = x;
    return 1;
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes a string literal at ps->p (on the opening quote). */
static char *parse_string_raw(parser *ps) {
    const char *s = ps->p + 1;
    const char *end = s;
    while (*end != '"') {
        if (*end == '\0') {
            fail(ps, "unterminated string");
            return NULL;
        }
        if (*end == '\\' && end[1] != '\0') end++;
        end++;
    }
    /* Escapes only shrink or keep the length (\uXXXX is 6 bytes for at most 4). */
    char *out = malloc((size_t)(end - s) + 1);
    if (out == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    size_t n = 0;
    const char *q = s;
    while (q < end) {
        if (*q != '\\') {
            out[n++] = *q++;
            continue;
        }
        q++;
        switch (*q) {
        case '"': out[n++] = '"'; q++; break;
        case '\\': out[n++] = '\\'; q++; break;
        case '/': out[n++] = '/'; q++; break;
        case 'b': out[n++] = '\b'; q++; break;
        case 'f': out[n++] = '\f'; q++; break;
        case 'n': out[n++] = '\n'; q++; break;
        case 'r': out[n++] = '\r'; q++; break;
        case 't': out[n++] = '\t'; q++; break;
        case 'u': {
            unsigned cp;
            if (end - q < 5 || !hex4(q + 1, &cp)) {
                ps->p = q;
                fail(ps, "bad \\u escape");
                free(out);
                return NULL;
            }
            q += 5;
            if (cp >= 0xD800 && cp < 0xDC00 && end - q >= 6 && q[0] == '\\' && q[1] == 'u') {
                unsigned lo;
                if (hex4(q + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                }
            }
            n += put_utf8(out + n, cp);
            break;
        }
        default:
            ps->p = q;
            fail(ps, "bad escape");
            free(out);
            return NULL;
        }
    }
    out[n] = '\0';
    ps->p = end + 1;
    return out;
}

static json_value *parse_value(parser *ps);

static json_value *parse_container(parser *ps, bool object) {
    json_value *v = new_value(object ? JSON_OBJECT : JSON_ARRAY, ps->p);
    if (v == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    char close = object ? '}' : ']';
    ps->p++;
    skip_ws(ps);
    if (*ps->p == close) {
        ps->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        if (object) {
            skip_ws(ps);
            if (*ps->p != '"') {
                fail(ps, "expected a member name");
                json_free(v);
                return NULL;
            }
            key = parse_string_raw(ps);
            if (key == NULL) {
                json_free(v);
                return NULL;
            }
            skip_ws(ps);
            if (*ps->p != ':') {
                fail(ps, "expected ':'");
                free(key);
                json_free(v);
                return NULL;
            }
            ps->p++;
        }
        json_value *item = parse_value(ps);
        if (item == NULL) {
            free(key);
            json_free(v);
            return NULL;
        }
        json_value **items = realloc(v->items, (v->count + 1) * sizeof *items);
        char **keys = object ? realloc(v->keys, (v->count + 1) * sizeof *keys) : NULL;
        if (items != NULL) v->items = items;
        if (keys != NULL) v->keys = keys;
        if (items == NULL || (object && keys == NULL)) {
            fail(ps, "out of memory");
            free(key);
            json_free(item);
            json_free(v);
            return NULL;
        }
        v->items[v->count] = item;
        if (object) v->keys[v->count] = key;
        v->count++;
        skip_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            return v;
        }
        fail(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
        json_free(v);
        return NULL;
    }
}

static json_value *parse_value(parser *ps) {
    skip_ws(ps);
    if (++ps->depth > 64) {
        fail(ps, "nested too deeply");
        return NULL;
    }
    const char *start = ps->p;
    json_value *v = NULL;
    if (*ps->p == '{' || *ps->p == '[') {
        v = parse_container(ps, *ps->p == '{');
    } else if (*ps->p == '"') {
        char *s = parse_string_raw(ps);
        if (s != NULL) {
            v = new_value(JSON_STRING, start);
            if (v == NULL) free(s);
            else v->string = s;
        }
    } else if (strncmp(ps->p, "true", 4) == 0 || strncmp(ps->p, "false", 5) == 0) {
        v = new_value(JSON_BOOL, start);
        if (v != NULL) v->boolean = ps->p[0] == 't';
        ps->p += ps->p[0] == 't' ? 4 : 5;
    } else if (strncmp(ps->p, "null", 4) == 0) {
        v = new_value(JSON_NULL, start);
        ps->p += 4;
    } else if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) {
        char *end;
        double d = strtod(ps->p, &end);
        bool integer = true;
        for (const char *q = ps->p; q < end; q++) {
            if (*q == '.' || *q == 'e' || *q == 'E') integer = false;
        }
        v = new_value(JSON_NUMBER, start);
        if (v != NULL) {
            v->number = d;
            v->is_integer = integer;
            if (integer) {
                errno = 0;
                v->integer = strtoll(ps->p, NULL, 10);
                if (errno != 0) v->is_integer = false;
            }
        }
        ps->p = end;
    } else {
        fail(ps, "unexpected character");
        return NULL;
    }
    ps->depth--;
    if (v != NULL) v->raw_len = (size_t)(ps->p - start);
    else fail(ps, "out of memory");
    return v;
}

json_value *json_parse(const char *text, char *err, size_t err_len) {
    parser ps = {text, text, err, err_len, 0};
    err[0] = '\0';
    json_value *v = parse_value(&ps);
    if (v == NULL) return NULL;
    skip_ws(&ps);
    if (*ps.p != '\0') {
        fail(&ps, "trailing text");
        json_free(v);
        return NULL;
    }
    return v;
}

void json_free(json_value *v) {
    if (v == NULL) return;
    for (size_t i = 0; i < v->count; i++) {
        json_free(v->items[i]);
        if (v->keys != NULL) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v);
}

const json_value *json_get(const json_value *object, const char *key) {
    if (object == NULL || object->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < object->count; i++) {
        if (strcmp(object->keys[i], key) == 0) return object->items[i];
    }
    return NULL;
}

char *json_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
        if (cap - n - 1 == 0) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf != NULL) buf[n] = '\0';
    return buf;
}
