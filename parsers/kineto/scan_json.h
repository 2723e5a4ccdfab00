/* Strict JSON reading for scan.c (included by it once: one translation unit, so the compiler inlines across
 * both): whitespace, strings (UTF-8 validated, escapes decoded), numbers read exactly as msgspec and Arrow read
 * them, any value skipped and validated, an object's members, a member read as str | None or int | None. Every
 * function that finds what the typed path might read differently declines (DECLINE: NULL, with the reason).
 */

static inline const uint8_t *ws(const uint8_t *p, const uint8_t *e) {
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static inline int hex4(const uint8_t *p) {
    int a = hexval(p[0]), b = hexval(p[1]), c = hexval(p[2]), d = hexval(p[3]);
    if ((a | b | c | d) < 0) return -1;
    return (a << 12) | (b << 8) | (c << 4) | d;
}

/* one UTF-8 sequence starting with a byte >= 0x80 at p: its end, or NULL if it is not well-formed */
static inline const uint8_t *utf8_seq(const uint8_t *p, const uint8_t *e) {
    uint8_t c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (e - p < 2 || (p[1] & 0xC0) != 0x80) return NULL;
        return p + 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (e - p < 3) return NULL;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F; /* no UTF-16 surrogates */
        if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80) return NULL;
        return p + 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (e - p < 4) return NULL;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
        if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return NULL;
        return p + 4;
    }
    return NULL;
}

/* A string whose content starts at p (after the quote): the position after its closing quote, or NULL. */
static const uint8_t *str_scan(Scan *s, const uint8_t *p, int *esc) {
    const uint8_t *e = s->end;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
#endif
    for (;;) {
#if defined(__SSE2__)
        while (e - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            /* signed compare: control characters and every byte >= 0x80 */
            __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                     _mm_cmplt_epi8(v, space));
            int mask = _mm_movemask_epi8(m);
            if (mask) {
                p += __builtin_ctz((unsigned)mask);
                goto special;
            }
            p += 16;
        }
#endif
        while (p < e && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        if (p >= e) DECLINE(s, "string not closed");
#if defined(__SSE2__)
    special:
#endif
        {
            uint8_t c = *p;
            if (c == '"') return p + 1;
            if (c == '\\') {
                *esc = 1;
                if (e - p < 2) DECLINE(s, "string not closed");
                uint8_t x = p[1];
                if (x == 'u') {
                    if (e - p < 6) DECLINE(s, "bad \\u escape");
                    int cp = hex4(p + 2);
                    if (cp < 0) DECLINE(s, "bad \\u escape");
                    p += 6;
                    if (cp >= 0xDC00 && cp <= 0xDFFF) DECLINE(s, "lone surrogate");
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (e - p < 6 || p[0] != '\\' || p[1] != 'u') DECLINE(s, "lone surrogate");
                        int lo = hex4(p + 2);
                        if (lo < 0xDC00 || lo > 0xDFFF) DECLINE(s, "lone surrogate");
                        p += 6;
                    }
                } else if (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r' ||
                           x == 't') {
                    p += 2;
                } else {
                    DECLINE(s, "bad escape");
                }
            } else if (c < 0x20) {
                DECLINE(s, "control character in a string");
            } else {
                p = utf8_seq(p, e);
                if (p == NULL) DECLINE(s, "invalid UTF-8");
            }
        }
    }
}

/* The decoded UTF-8 of a validated string's content into out (room for len bytes: decoding never grows it);
 * returns the decoded length. */
static size_t str_decode(const uint8_t *p, size_t len, uint8_t *out) {
    const uint8_t *e = p + len;
    uint8_t *o = out;
    while (p < e) {
        if (*p != '\\') {
            *o++ = *p++;
            continue;
        }
        uint8_t x = p[1];
        switch (x) {
        case 'b': *o++ = '\b'; p += 2; break;
        case 'f': *o++ = '\f'; p += 2; break;
        case 'n': *o++ = '\n'; p += 2; break;
        case 'r': *o++ = '\r'; p += 2; break;
        case 't': *o++ = '\t'; p += 2; break;
        case 'u': {
            uint32_t cp = (uint32_t)hex4(p + 2);
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo = (uint32_t)hex4(p + 2);
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp < 0x80) {
                *o++ = (uint8_t)cp;
            } else if (cp < 0x800) {
                *o++ = (uint8_t)(0xC0 | (cp >> 6));
                *o++ = (uint8_t)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *o++ = (uint8_t)(0xE0 | (cp >> 12));
                *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (uint8_t)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (uint8_t)(0xF0 | (cp >> 18));
                *o++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (uint8_t)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: /* " \ / */
            *o++ = x;
            p += 2;
        }
    }
    return (size_t)(o - out);
}

typedef struct {
    int neg, has_exp;
    const uint8_t *int_p, *frac_p;
    int int_len, frac_len;
    long exp;
} Num;

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* A JSON number at p: its end, or NULL (not a number, or one of more than MAX_DIGITS digits or a magnitude
 * near the limits of a double: msgspec refuses some of those where it reads them). */
static const uint8_t *num_scan(Scan *s, const uint8_t *p, Num *n) {
    const uint8_t *e = s->end;
    n->neg = 0;
    n->has_exp = 0;
    n->frac_len = 0;
    n->frac_p = NULL;
    n->exp = 0;
    if (p < e && *p == '-') {
        n->neg = 1;
        p++;
    }
    n->int_p = p;
    if (p >= e) DECLINE(s, "bad number");
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < e && is_digit(*p))
            p++;
    } else {
        DECLINE(s, "bad number");
    }
    n->int_len = (int)(p - n->int_p > MAX_DIGITS + 1 ? MAX_DIGITS + 1 : p - n->int_p);
    if (p < e && *p == '.') {
        p++;
        n->frac_p = p;
        while (p < e && is_digit(*p))
            p++;
        if (p == n->frac_p) DECLINE(s, "bad number");
        n->frac_len = (int)(p - n->frac_p > MAX_DIGITS + 1 ? MAX_DIGITS + 1 : p - n->frac_p);
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        n->has_exp = 1;
        p++;
        if (p < e && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        const uint8_t *d = p;
        long x = 0;
        while (p < e && is_digit(*p)) {
            if (x < 1000000) x = x * 10 + (*p - '0');
            p++;
        }
        if (p == d) DECLINE(s, "bad number");
        n->exp = eneg ? -x : x;
    }
    if (n->int_len > MAX_DIGITS || n->frac_len > MAX_DIGITS) DECLINE(s, "number of too many digits");
    if (n->has_exp && (n->exp > MAX_DIGITS || n->exp < -MAX_DIGITS || n->int_len + n->exp > MAX_DIGITS))
        DECLINE(s, "number of an extreme magnitude");
    return p;
}

/* an integer literal within int64 */
static inline int num_int64(const Num *n, int64_t *out) {
    if (n->has_exp || n->frac_p != NULL || n->int_len > 19) return 0;
    uint64_t v = 0;
    for (int i = 0; i < n->int_len; i++)
        v = v * 10 + (uint64_t)(n->int_p[i] - '0'); /* 19 digits fit in uint64 */
    if (n->neg) {
        if (v > (uint64_t)INT64_MAX + 1) return 0;
        *out = (int64_t)(0 - v);
    } else {
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
    }
    return 1;
}

/* a timestamp in µs as Arrow's decimal128(24, 3) reads it: the exact ns */
static inline int num_ts(const Num *n, __int128 *out) {
    if (n->has_exp || n->frac_len > 3 || n->int_len > 21) return 0;
    int f0 = n->frac_len > 0 ? n->frac_p[0] - '0' : 0, f1 = n->frac_len > 1 ? n->frac_p[1] - '0' : 0,
        f2 = n->frac_len > 2 ? n->frac_p[2] - '0' : 0;
    if (n->int_len <= 15) { /* 18 digits fit in int64 */
        int64_t v = 0;
        for (int i = 0; i < n->int_len; i++)
            v = v * 10 + (n->int_p[i] - '0');
        v = v * 1000 + f0 * 100 + f1 * 10 + f2;
        *out = n->neg ? -v : v;
        return 1;
    }
    __int128 v = 0;
    for (int i = 0; i < n->int_len; i++)
        v = v * 10 + (n->int_p[i] - '0');
    v = v * 1000 + f0 * 100 + f1 * 10 + f2;
    *out = n->neg ? -v : v;
    return 1;
}

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* a duration as msgspec reads a float: exactly (correctly rounded) for the digits of the cases taken */
static inline int num_dur(const Num *n, double *out) {
    if (n->has_exp || n->int_len + n->frac_len > 19) return 0;
    uint64_t m = 0;
    for (int i = 0; i < n->int_len; i++)
        m = m * 10 + (uint64_t)(n->int_p[i] - '0');
    for (int i = 0; i < n->frac_len; i++)
        m = m * 10 + (uint64_t)(n->frac_p[i] - '0');
    if (m >> 53) return 0;
    /* both operands exact: one correctly rounded IEEE division */
    double f = (double)m / POW10[n->frac_len];
    *out = n->neg ? -f : f;
    return 1;
}

static const uint8_t *skip_value(Scan *s, const uint8_t *p, int depth);

/* An object member's key at p (where its quote should be): *k, *klen and *esc say what it is; returns the position
   of its value (whitespace skipped), or NULL */
static inline const uint8_t *member_key(Scan *s, const uint8_t *p, const uint8_t **k, size_t *klen, int *esc) {
    const uint8_t *e = s->end;
    if (p >= e || *p != '"') DECLINE(s, "bad object");
    *k = p + 1;
    p = str_scan(s, *k, esc);
    if (p == NULL) return NULL;
    *klen = (size_t)(p - 1 - *k);
    p = ws(p, e);
    if (p >= e || *p != ':') DECLINE(s, "bad object");
    p = ws(p + 1, e);
    if (p >= e) DECLINE(s, "value missing");
    return p;
}

/* After a member's value at p: the next member's key (*more = 1) or the position after the closing brace
   (*more = 0), or NULL */
static inline const uint8_t *member_next(Scan *s, const uint8_t *p, int *more) {
    const uint8_t *e = s->end;
    p = ws(p, e);
    if (p >= e) DECLINE(s, "bad object");
    if (*p == ',') {
        *more = 1;
        return ws(p + 1, e);
    }
    if (*p != '}') DECLINE(s, "bad object");
    *more = 0;
    return p + 1;
}

static const uint8_t *skip_object(Scan *s, const uint8_t *p, int depth) {
    const uint8_t *e = s->end;
    if (depth > MAX_DEPTH) DECLINE(s, "nested too deep");
    p = ws(p + 1, e);
    if (p < e && *p == '}') return p + 1;
    for (int more = 1; more;) {
        const uint8_t *k;
        size_t klen;
        int esc = 0;
        p = member_key(s, p, &k, &klen, &esc);
        if (p == NULL) return NULL;
        p = skip_value(s, p, depth);
        if (p == NULL) return NULL;
        p = member_next(s, p, &more);
        if (p == NULL) return NULL;
    }
    return p;
}

static const uint8_t *skip_array(Scan *s, const uint8_t *p, int depth) {
    const uint8_t *e = s->end;
    if (depth > MAX_DEPTH) DECLINE(s, "nested too deep");
    p = ws(p + 1, e);
    if (p < e && *p == ']') return p + 1;
    for (;;) {
        p = skip_value(s, p, depth);
        if (p == NULL) return NULL;
        p = ws(p, e);
        if (p >= e) DECLINE(s, "bad array");
        if (*p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        if (*p == ']') return p + 1;
        DECLINE(s, "bad array");
    }
}

/* any JSON value at p (whitespace before it skipped), validated; depth: of the container holding it */
static const uint8_t *skip_value(Scan *s, const uint8_t *p, int depth) {
    const uint8_t *e = s->end;
    if (p >= e) DECLINE(s, "value missing");
    switch (*p) {
    case '"': {
        int esc = 0;
        return str_scan(s, p + 1, &esc);
    }
    case '{':
        return skip_object(s, p, depth + 1);
    case '[':
        return skip_array(s, p, depth + 1);
    case 't':
        if (e - p >= 4 && memcmp(p, "true", 4) == 0) return p + 4;
        DECLINE(s, "bad literal");
    case 'f':
        if (e - p >= 5 && memcmp(p, "false", 5) == 0) return p + 5;
        DECLINE(s, "bad literal");
    case 'n':
        if (e - p >= 4 && memcmp(p, "null", 4) == 0) return p + 4;
        DECLINE(s, "bad literal");
    default: {
        Num n;
        return num_scan(s, p, &n);
    }
    }
}

static inline int is_null(const uint8_t *p, const uint8_t *e) { return e - p >= 4 && memcmp(p, "null", 4) == 0; }

/* a member read as str | None: *t is T_OK (str filled), T_NULL or T_BAD */
static const uint8_t *str_member(Scan *s, const uint8_t *p, int depth, uint8_t *t, Str *str) {
    if (*p == '"') {
        int esc = 0;
        const uint8_t *q = str_scan(s, p + 1, &esc);
        if (q == NULL) return NULL;
        *t = T_OK;
        str->p = p + 1;
        str->len = (size_t)(q - 1 - (p + 1));
        str->esc = esc;
        return q;
    }
    if (is_null(p, s->end)) {
        *t = T_NULL;
        return p + 4;
    }
    *t = T_BAD;
    return skip_value(s, p, depth);
}

/* a member read as int | None */
static const uint8_t *int_member(Scan *s, const uint8_t *p, int depth, uint8_t *t, int64_t *v) {
    if (*p == '-' || is_digit(*p)) {
        Num n;
        const uint8_t *q = num_scan(s, p, &n);
        if (q == NULL) return NULL;
        *t = num_int64(&n, v) ? T_OK : T_BAD;
        return q;
    }
    if (is_null(p, s->end)) {
        *t = T_NULL;
        return p + 4;
    }
    *t = T_BAD;
    return skip_value(s, p, depth);
}
