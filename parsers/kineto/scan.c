/* One batch of Kineto records ("[e0,e1,...]") -> the columns of its complete (X) events, in one pass of C with the
 * GIL released: what tracekit.parsers.kineto.columns._consume_typed makes of the batch with msgspec and Arrow.
 *
 * scan(data) returns None (declines) for anything that path might read differently or refuse: the caller then
 * runs it. Declining is always safe, so the scanner is stricter than msgspec wherever in doubt:
 *
 *   - the whole of data must be one JSON array of objects (RFC 8259: whitespace only space, tab, CR, LF; strict
 *     numbers; strings of valid UTF-8 without raw control characters, escapes only the JSON ones, no lone
 *     surrogate escape anywhere); nesting deeper than MAX_DEPTH, numbers of more than 300 digits or magnitudes
 *     near the limits of a double are declined;
 *   - every element has one string "ph" among the phases the typed decoder knows, B and E excepted; no member
 *     the scanner reads (ph, cat, name, pid, tid, ts, dur, args and the args members below) appears twice, and
 *     none of a record's or its args' keys is escaped (it could name one of those);
 *   - X events: cat and name strings or null; pid, tid and the ids of args (External id, external id,
 *     correlation, device, stream, bytes, wait_on_stream, wait_on_cuda_event_record_corr_id) integer literals in
 *     int64 or null; args an object; args.name and args.labels strings or null; ts null or a plain decimal with
 *     at most 3 decimals and 21 integer digits (exact ns, as Arrow's decimal128(24, 3) gives them; beyond
 *     +-2^62 ns invalid, not declined); dur null or a plain decimal of at most 19 digits whose value (below 2^53
 *     as an integer of them) is under 2^33 in magnitude (one exact division gives msgspec's double);
 *   - instants (i): name a string without escapes or null.
 *
 * What it returns is documented at scan() below. Metadata records (M) are only located: the caller decodes
 * them with msgspec, as it does the few events that may carry collective metadata. Negative pids and tids are
 * flagged: the caller then asks Arrow's path, as the typed path does.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_DEPTH 64
#define MAX_DIGITS 300

/* int64 columns of the result, in this order */
enum { C_START, C_DUR, C_PID, C_TID, C_EXT, C_EXT_L, C_CORR, C_DEV, C_STREAM, C_BYTES, C_WSTREAM, C_WCORR,
       C_REC_START, C_REC_END, N_INT };
/* validity columns */
enum { V_TS, V_PID, V_TID, V_EXT, V_EXT_L, V_CORR, V_DEV, V_STREAM, V_BYTES, V_WSTREAM, V_WCORR, N_VALID };
/* the result's columns, in their order in Scan.col */
#define COL_VALID N_INT
#define COL_CODE (COL_VALID + N_VALID)
#define COL_META (COL_CODE + 2)
#define N_COLS (COL_META + 1)
#define N_IDS 8

/* flags of the result */
#define F_FRACTION 1    /* a valid timestamp of an X event is not a whole µs */
#define F_DOT 2         /* the text of an X event's timestamp has a '.' */
#define F_WINDOW_END 4  /* an instant named "Record Window End" */
#define F_NEGATIVE 8    /* an X event's pid or tid is negative */

typedef struct {
    int64_t v[N_INT];
    int32_t code[2];
    uint8_t ok[N_VALID];
} Row;

typedef struct {
    uint8_t *arena;
    size_t alen, acap;
    size_t *off;
    size_t *len;
    uint64_t *hash;
    Py_ssize_t n, cap;
    int32_t *table;
    size_t tcap; /* a power of two */
} Dict;

typedef struct {
    const uint8_t *base, *end;
    const char *reason;
    Row *rows;
    Py_ssize_t n_rows, cap_rows;
    int64_t *meta;
    Py_ssize_t n_meta, cap_meta;
    Dict cats, names;
    uint8_t *scratch;
    size_t scratch_cap;
    int flags;
    /* the result's columns (layout()), each its own allocation: ints, the validity of ts (bytes) and of the others
       (Arrow bitmaps; NULL where none is null), codes, then the metadata ranges; NULL once handed out */
    uint8_t *col[N_COLS];
    Py_ssize_t col_len[N_COLS], nulls[N_VALID];
} Scan;

typedef struct {
    const uint8_t *p; /* the content, after the opening quote */
    size_t len;
    int esc;
} Str;

/* what a value of a member the scanner reads was */
enum { T_ABSENT = 0, T_NULL, T_OK, T_BAD };

typedef struct {
    /* zeroed for every record */
    struct {
        uint16_t seen, args_seen;
        uint8_t ph;
        uint8_t x_bad; /* some value an X event may not have */
        uint8_t cat_t, name_t, pid_t, tid_t, ts_t, ts_dot, dur_t;
        uint8_t id_t[N_IDS];
    } k;
    /* meaningful where their type above is T_OK */
    Str cat, name;
    int64_t pid, tid;
    __int128 ts_ns;
    double dur;
    int64_t id[N_IDS];
} Rec;

#define DECLINE(s, why) do { if ((s)->reason == NULL) (s)->reason = (why); return NULL; } while (0)

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

static int grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 1;
    Py_ssize_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = realloc(*buf, (size_t)c * item);
    if (q == NULL) return 0;
    *buf = q;
    *cap = c;
    return 1;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        h = (h ^ x) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t x = 0;
    if (n) memcpy(&x, p, n);
    h = (h ^ x) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 29;
    return h;
}

/* the code of a string in a batch's dictionary (first appearance first), added if new; -1 on failure */
static int32_t intern(Scan *s, Dict *d, const Str *str) {
    const uint8_t *p = str->p;
    size_t len = str->len;
    if (str->esc) {
        if (len > s->scratch_cap) {
            uint8_t *q = realloc(s->scratch, len);
            if (q == NULL) return -1;
            s->scratch = q;
            s->scratch_cap = len;
        }
        len = str_decode(p, len, s->scratch);
        p = s->scratch;
    }
    uint64_t h = hash_bytes(p, len);
    if ((size_t)(d->n + 1) * 2 > d->tcap) {
        size_t tc = d->tcap ? d->tcap * 2 : 64;
        int32_t *t = malloc(tc * sizeof(int32_t));
        if (t == NULL) return -1;
        for (size_t i = 0; i < tc; i++)
            t[i] = -1;
        for (Py_ssize_t i = 0; i < d->n; i++) {
            size_t j = (size_t)d->hash[i] & (tc - 1);
            while (t[j] >= 0)
                j = (j + 1) & (tc - 1);
            t[j] = (int32_t)i;
        }
        free(d->table);
        d->table = t;
        d->tcap = tc;
    }
    size_t j = (size_t)h & (d->tcap - 1);
    while (d->table[j] >= 0) {
        int32_t c = d->table[j];
        if (d->hash[c] == h && d->len[c] == len && memcmp(d->arena + d->off[c], p, len) == 0) return c;
        j = (j + 1) & (d->tcap - 1);
    }
    if (d->n >= INT32_MAX - 1) return -1;
    if (d->n >= d->cap) {
        Py_ssize_t c = d->cap, c2 = d->cap;
        if (!grow((void **)&d->off, &c, d->n + 1, sizeof(size_t))) return -1;
        c = c2;
        if (!grow((void **)&d->len, &c, d->n + 1, sizeof(size_t))) return -1;
        c = c2;
        if (!grow((void **)&d->hash, &c, d->n + 1, sizeof(uint64_t))) return -1;
        d->cap = c;
    }
    if (d->arena == NULL || d->alen + len > d->acap) {
        size_t ac = d->acap ? d->acap : 4096;
        while (ac < d->alen + len)
            ac *= 2;
        uint8_t *a = realloc(d->arena, ac);
        if (a == NULL) return -1;
        d->arena = a;
        d->acap = ac;
    }
    if (len) memcpy(d->arena + d->alen, p, len);
    int32_t c = (int32_t)d->n++;
    d->off[c] = d->alen;
    d->len[c] = len;
    d->hash[c] = h;
    d->alen += len;
    d->table[j] = c;
    return c;
}

/* the members of an X event's args that the scanner reads, in the order of N_IDS then name, labels */
static int args_key(const uint8_t *k, size_t n) {
    switch (n) {
    case 4: return memcmp(k, "name", 4) == 0 ? 8 : -1;
    case 5: return memcmp(k, "bytes", 5) == 0 ? 5 : -1;
    case 6:
        if (memcmp(k, "device", 6) == 0) return 3;
        if (memcmp(k, "stream", 6) == 0) return 4;
        if (memcmp(k, "labels", 6) == 0) return 9;
        return -1;
    case 11:
        if (memcmp(k, "External id", 11) == 0) return 0;
        if (memcmp(k, "external id", 11) == 0) return 1;
        if (memcmp(k, "correlation", 11) == 0) return 2;
        return -1;
    case 14: return memcmp(k, "wait_on_stream", 14) == 0 ? 6 : -1;
    case 33: return memcmp(k, "wait_on_cuda_event_record_corr_id", 33) == 0 ? 7 : -1;
    default: return -1;
    }
}

static const uint8_t *args_object(Scan *s, const uint8_t *p, int depth, Rec *r) {
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
        if (esc) DECLINE(s, "escaped key in args");
        int key = args_key(k, klen);
        if (key >= 0) {
            if (r->k.args_seen & (1u << key)) DECLINE(s, "duplicate key in args");
            r->k.args_seen |= 1u << key;
        }
        if (key >= 0 && key < N_IDS) {
            p = int_member(s, p, depth, &r->k.id_t[key], &r->id[key]);
            if (p != NULL && r->k.id_t[key] == T_BAD) r->k.x_bad = 1;
        } else if (key >= N_IDS) {
            uint8_t t = T_ABSENT;
            Str unused;
            p = str_member(s, p, depth, &t, &unused);
            if (t == T_BAD) r->k.x_bad = 1;
        } else {
            p = skip_value(s, p, depth);
        }
        if (p == NULL) return NULL;
        p = member_next(s, p, &more);
        if (p == NULL) return NULL;
    }
    return p;
}

enum { K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS };

static inline int record_key(const uint8_t *k, size_t n) {
    switch (n) {
    case 2:
        if (k[0] == 'p' && k[1] == 'h') return K_PH;
        if (k[0] == 't' && k[1] == 's') return K_TS;
        return -1;
    case 3:
        if (memcmp(k, "cat", 3) == 0) return K_CAT;
        if (memcmp(k, "pid", 3) == 0) return K_PID;
        if (memcmp(k, "tid", 3) == 0) return K_TID;
        if (memcmp(k, "dur", 3) == 0) return K_DUR;
        return -1;
    case 4:
        if (memcmp(k, "name", 4) == 0) return K_NAME;
        if (memcmp(k, "args", 4) == 0) return K_ARGS;
        return -1;
    default: return -1;
    }
}

/* phases the typed decoder knows, B and E (declined) aside */
static inline int known_phase(uint8_t c) {
    switch (c) {
    case 'X': case 'M': case 'i': case 's': case 'f': case 't': case 'I': case 'C': case 'b': case 'n': case 'e':
    case 'P': case 'O': case 'N': case 'D': case 'V': case 'v': case 'R': case 'c': case '(': case ')':
        return 1;
    default:
        return 0;
    }
}

static const uint8_t *record(Scan *s, const uint8_t *p) {
    const uint8_t *e = s->end;
    const uint8_t *start = p;
    Rec r;
    memset(&r.k, 0, sizeof r.k);
    p = ws(p + 1, e);
    if (p < e && *p == '}') DECLINE(s, "record without ph");
    for (int more = 1; more;) {
        const uint8_t *k;
        size_t klen;
        int esc = 0;
        p = member_key(s, p, &k, &klen, &esc);
        if (p == NULL) return NULL;
        if (esc) DECLINE(s, "escaped key in a record");
        int key = record_key(k, klen);
        if (key >= 0) {
            if (r.k.seen & (1u << key)) DECLINE(s, "duplicate key in a record");
            r.k.seen |= 1u << key;
        }
        switch (key) {
        case K_PH: {
            if (*p != '"') DECLINE(s, "ph not a string");
            const uint8_t *v = p + 1;
            p = str_scan(s, v, &esc);
            if (p == NULL) return NULL;
            if (esc || p - 1 - v != 1) DECLINE(s, "unknown ph");
            r.k.ph = v[0];
            if (r.k.ph == 'B' || r.k.ph == 'E') DECLINE(s, "B/E event");
            if (!known_phase(v[0])) DECLINE(s, "unknown ph");
            break;
        }
        case K_CAT:
            p = str_member(s, p, 2, &r.k.cat_t, &r.cat);
            break;
        case K_NAME:
            p = str_member(s, p, 2, &r.k.name_t, &r.name);
            break;
        case K_PID:
            p = int_member(s, p, 2, &r.k.pid_t, &r.pid);
            break;
        case K_TID:
            p = int_member(s, p, 2, &r.k.tid_t, &r.tid);
            break;
        case K_TS:
            if (*p == '-' || is_digit(*p)) {
                Num n;
                p = num_scan(s, p, &n);
                if (p == NULL) return NULL;
                if (num_ts(&n, &r.ts_ns)) {
                    r.k.ts_t = T_OK;
                    r.k.ts_dot = n.frac_p != NULL;
                } else {
                    r.k.ts_t = T_BAD;
                }
            } else if (is_null(p, e)) {
                r.k.ts_t = T_NULL;
                p += 4;
            } else {
                r.k.ts_t = T_BAD;
                p = skip_value(s, p, 2);
            }
            break;
        case K_DUR:
            if (*p == '-' || is_digit(*p)) {
                Num n;
                p = num_scan(s, p, &n);
                if (p == NULL) return NULL;
                r.k.dur_t = num_dur(&n, &r.dur) && fabs(r.dur) < 8589934592.0 ? T_OK : T_BAD;
            } else if (is_null(p, e)) {
                r.k.dur_t = T_NULL;
                p += 4;
            } else {
                r.k.dur_t = T_BAD;
                p = skip_value(s, p, 2);
            }
            break;
        case K_ARGS:
            if (*p == '{') {
                p = args_object(s, p, 3, &r);
            } else {
                r.k.x_bad = 1;
                p = skip_value(s, p, 2);
            }
            break;
        default:
            p = skip_value(s, p, 2);
        }
        if (p == NULL) return NULL;
        p = member_next(s, p, &more);
        if (p == NULL) return NULL;
    }
    if (r.k.ph == 0) DECLINE(s, "record without ph");
    if (r.k.ph == 'X') {
        if (r.k.x_bad || r.k.cat_t == T_BAD || r.k.name_t == T_BAD || r.k.pid_t == T_BAD || r.k.tid_t == T_BAD ||
            r.k.ts_t == T_BAD || r.k.dur_t == T_BAD)
            DECLINE(s, "X event with a value of another type");
        if ((r.k.pid_t == T_OK && r.pid < 0) || (r.k.tid_t == T_OK && r.tid < 0)) s->flags |= F_NEGATIVE;
        if (!grow((void **)&s->rows, &s->cap_rows, s->n_rows + 1, sizeof(Row))) DECLINE(s, "out of memory");
        Row *row = &s->rows[s->n_rows];
        for (int i = 0; i < N_INT; i++)
            row->v[i] = 0;
        for (int i = 0; i < N_VALID; i++)
            row->ok[i] = 0;
        row->code[0] = r.k.cat_t == T_OK ? intern(s, &s->cats, &r.cat) : -1;
        row->code[1] = r.k.name_t == T_OK ? intern(s, &s->names, &r.name) : -1;
        if ((r.k.cat_t == T_OK && row->code[0] < 0) || (r.k.name_t == T_OK && row->code[1] < 0))
            DECLINE(s, "out of memory");
        if (r.k.ts_t == T_OK) {
            const __int128 lim = (__int128)1 << 62;
            if (r.ts_ns <= lim && r.ts_ns >= -lim) {
                row->v[C_START] = (int64_t)r.ts_ns;
                row->ok[V_TS] = 1;
                if (row->v[C_START] % 1000 != 0) s->flags |= F_FRACTION;
            }
            if (r.k.ts_dot) s->flags |= F_DOT;
        }
        if (r.k.dur_t == T_OK) row->v[C_DUR] = (int64_t)rint(r.dur * 1000.0);
        if (r.k.pid_t == T_OK) {
            row->v[C_PID] = r.pid;
            row->ok[V_PID] = 1;
        }
        if (r.k.tid_t == T_OK) {
            row->v[C_TID] = r.tid;
            row->ok[V_TID] = 1;
        }
        for (int i = 0; i < N_IDS; i++) {
            if (r.k.id_t[i] == T_OK) {
                row->v[C_EXT + i] = r.id[i];
                row->ok[V_EXT + i] = 1;
            }
        }
        row->v[C_REC_START] = start - s->base;
        row->v[C_REC_END] = p - s->base;
        s->n_rows++;
    } else if (r.k.ph == 'M') {
        if (!grow((void **)&s->meta, &s->cap_meta, s->n_meta + 2, sizeof(int64_t))) DECLINE(s, "out of memory");
        s->meta[s->n_meta++] = start - s->base;
        s->meta[s->n_meta++] = p - s->base;
    } else if (r.k.ph == 'i') {
        if (r.k.name_t == T_BAD || (r.k.name_t == T_OK && r.name.esc)) DECLINE(s, "instant with an unusual name");
        if (r.k.name_t == T_OK && r.name.len == 17 && memcmp(r.name.p, "Record Window End", 17) == 0)
            s->flags |= F_WINDOW_END;
    }
    return p;
}

static int scan_all(Scan *s) {
    const uint8_t *e = s->end;
    const uint8_t *p = ws(s->base, e);
    if (p >= e || *p != '[') {
        s->reason = "not an array";
        return 0;
    }
    p = ws(p + 1, e);
    if (p < e && *p == ']') {
        p++;
    } else {
        for (;;) {
            if (p >= e || *p != '{') {
                s->reason = "element not an object";
                return 0;
            }
            p = record(s, p);
            if (p == NULL) return 0;
            p = ws(p, e);
            if (p >= e) {
                s->reason = "array not closed";
                return 0;
            }
            if (*p == ',') {
                p = ws(p + 1, e);
                continue;
            }
            if (*p == ']') {
                p++;
                break;
            }
            s->reason = "bad array";
            return 0;
        }
    }
    p = ws(p, e);
    if (p != e) {
        s->reason = "trailing characters";
        return 0;
    }
    return 1;
}

static void dict_free(Dict *d) {
    free(d->arena);
    free(d->off);
    free(d->len);
    free(d->hash);
    free(d->table);
}

static void scan_free(Scan *s) {
    free(s->rows);
    free(s->meta);
    free(s->scratch);
    for (int c = 0; c < N_COLS; c++)
        free(s->col[c]);
    dict_free(&s->cats);
    dict_free(&s->names);
}

static PyObject *dict_list(const Dict *d) {
    PyObject *list = PyList_New(d->n);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < d->n; i++) {
        PyObject *u = PyUnicode_DecodeUTF8((const char *)d->arena + d->off[i], (Py_ssize_t)d->len[i], "strict");
        if (u == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, u);
    }
    return list;
}

/* The rows turned into the result's columns without the GIL (the rows are freed), each column its own allocation:
 * what the caller keeps (Arrow arrays on a column) and what it reads once (the records' byte ranges, the codes) are
 * freed each when its last reader is done, as separate bytes objects were. 0 where memory ran out. */
static int layout(Scan *s) {
    Py_ssize_t n = s->n_rows;
    for (int c = 0; c < N_INT; c++)
        s->col_len[c] = n * (Py_ssize_t)sizeof(int64_t);
    s->col_len[COL_VALID + V_TS] = n;
    for (int c = 1; c < N_VALID; c++) {
        Py_ssize_t nulls = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            nulls += !s->rows[i].ok[c];
        s->nulls[c] = nulls;
        s->col_len[COL_VALID + c] = nulls ? (n + 7) / 8 : -1;
    }
    s->col_len[COL_CODE] = s->col_len[COL_CODE + 1] = n * (Py_ssize_t)sizeof(int32_t);
    s->col_len[COL_META] = s->n_meta * (Py_ssize_t)sizeof(int64_t);
    for (int c = 0; c < N_COLS; c++) {
        if (s->col_len[c] < 0) continue;
        s->col[c] = malloc(s->col_len[c] ? (size_t)s->col_len[c] : 1);
        if (s->col[c] == NULL) return 0;
    }
    for (int c = 0; c < N_INT; c++) {
        int64_t *out = (int64_t *)s->col[c];
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = s->rows[i].v[c];
    }
    for (Py_ssize_t i = 0; i < n; i++)
        s->col[COL_VALID + V_TS][i] = s->rows[i].ok[V_TS];
    for (int c = 1; c < N_VALID; c++) {
        uint8_t *out = s->col[COL_VALID + c];
        if (out == NULL) continue;
        memset(out, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t i = 0; i < n; i++)
            out[i >> 3] |= (uint8_t)(s->rows[i].ok[c] << (i & 7));
    }
    for (int c = 0; c < 2; c++) {
        int32_t *out = (int32_t *)s->col[COL_CODE + c];
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = s->rows[i].code[c];
    }
    if (s->n_meta) memcpy(s->col[COL_META], s->meta, (size_t)s->col_len[COL_META]);
    free(s->rows);
    s->rows = NULL; /* n_rows stays: the columns hold the rows now */
    s->cap_rows = 0;
    return 1;
}

/* --- Column: a column of one scan, lent to Python as read-only bytes -------------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t len;
} Column;

static int Column_getbuffer(Column *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 1, flags);
}

static void Column_dealloc(Column *self) {
    PyTypeObject *tp = Py_TYPE(self);
    free(self->data);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyType_Slot Column_slots[] = {
    {Py_bf_getbuffer, Column_getbuffer},
    {Py_tp_dealloc, Column_dealloc},
    {Py_tp_doc, "A column of one scanned batch, as the scanner laid it out (read-only bytes; scan() hands out a view)."},
    {0, NULL},
};

static PyType_Spec Column_spec = {
    "tracekit.parsers.kineto.scan.Column", sizeof(Column), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    Column_slots,
};

typedef struct {
    PyTypeObject *column_type;
} ModuleState;

/* column c of the scan as a read-only memoryview that owns it (taken out of the scan: no copy) */
static PyObject *view_of(PyTypeObject *type, Scan *s, int c) {
    Column *col = PyObject_New(Column, type);
    if (col == NULL) return NULL;
    col->data = s->col[c];
    col->len = s->col_len[c];
    s->col[c] = NULL;
    PyObject *view = PyMemoryView_FromObject((PyObject *)col);
    Py_DECREF(col);
    return view;
}

/* scan()'s result from a laid-out scan: views of its columns, no copy */
static PyObject *result(PyObject *module, Scan *s) {
    PyTypeObject *type = ((ModuleState *)PyModule_GetState(module))->column_type;
    Py_ssize_t n = s->n_rows;
    PyObject *ints = NULL, *valid = NULL, *codes = NULL, *cats = NULL, *names = NULL, *meta = NULL;
    ints = PyTuple_New(N_INT);
    valid = PyTuple_New(N_VALID);
    codes = PyTuple_New(2);
    if (ints == NULL || valid == NULL || codes == NULL) goto fail;
    for (int c = 0; c < N_INT; c++) {
        PyObject *v = view_of(type, s, c);
        if (v == NULL) goto fail;
        PyTuple_SET_ITEM(ints, c, v);
    }
    {
        PyObject *v = view_of(type, s, COL_VALID + V_TS);
        if (v == NULL) goto fail;
        PyTuple_SET_ITEM(valid, V_TS, v);
    }
    /* the other columns' validity as Arrow wants it: a bitmap (least significant bit first) and the null count, or
       None where nothing is null */
    for (int c = 1; c < N_VALID; c++) {
        if (s->col[COL_VALID + c] == NULL) {
            PyTuple_SET_ITEM(valid, c, Py_NewRef(Py_None));
            continue;
        }
        PyObject *v = view_of(type, s, COL_VALID + c);
        if (v == NULL) goto fail;
        PyObject *pair = Py_BuildValue("(Nn)", v, s->nulls[c]);
        if (pair == NULL) goto fail;
        PyTuple_SET_ITEM(valid, c, pair);
    }
    for (int c = 0; c < 2; c++) {
        PyObject *v = view_of(type, s, COL_CODE + c);
        if (v == NULL) goto fail;
        PyTuple_SET_ITEM(codes, c, v);
    }
    cats = dict_list(&s->cats);
    if (cats == NULL) goto fail;
    names = dict_list(&s->names);
    if (names == NULL) goto fail;
    meta = view_of(type, s, COL_META);
    if (meta == NULL) goto fail;
    return Py_BuildValue("(nNNNNNNi)", n, ints, valid, codes, cats, names, meta, s->flags);
fail:
    Py_XDECREF(ints);
    Py_XDECREF(valid);
    Py_XDECREF(codes);
    Py_XDECREF(cats);
    Py_XDECREF(names);
    Py_XDECREF(meta);
    return NULL;
}

/* scan the buffer and lay out its columns with the GIL released; returns the result, Py_None (declined; *reason says
   why) or NULL */
static PyObject *run(PyObject *module, PyObject *data, const char **reason) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    Scan s;
    memset(&s, 0, sizeof s);
    s.base = (const uint8_t *)view.buf;
    s.end = s.base + view.len;
    int ok, laid = 1;
    Py_BEGIN_ALLOW_THREADS
    ok = scan_all(&s);
    if (ok) laid = layout(&s);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *out;
    if (!laid) {
        out = PyErr_NoMemory();
    } else if (ok) {
        out = result(module, &s);
        if (out == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            /* cannot happen for validated UTF-8; declining is the safe answer anyway */
            PyErr_Clear();
            s.reason = "string not decodable";
            out = Py_NewRef(Py_None);
        }
    } else {
        out = Py_NewRef(Py_None);
    }
    *reason = s.reason;
    scan_free(&s);
    return out;
}

PyDoc_STRVAR(scan_doc,
"scan(data) -> None | tuple\n\n"
"The records of one batch (a JSON array of objects, any bytes-like object) with the GIL released. None when the\n"
"batch needs the typed msgspec path or another; else (n, ints, valid, codes, cats, names, meta, flags) for its\n"
"n complete (X) events, in order (each column a read-only memoryview of the scanner's own buffer, no copy):\n"
"  ints: 14 columns of n int64 each: start_ns, dur_ns (not clamped), pid, tid, External id, external id,\n"
"        correlation, device, stream, bytes, wait_on_stream, wait_on_cuda_event_record_corr_id, and the byte\n"
"        range of each event's record in data (start, stop); 0 where the value is null;\n"
"  valid: ts readable within +-2^62 ns (n bools), then for pid, tid and the 8 ids None where none is\n"
"    null, else (bitmap, null count): Arrow's validity bitmap (bit i, least significant first, set where not null);\n"
"  codes: 2 columns of n int32: cat and name as codes into cats and names (-1: null);\n"
"  cats, names: the distinct strings of the batch, in order of first appearance;\n"
"  meta: int64 (start, stop) byte ranges of the metadata (M) records;\n"
"  flags: 1 a valid timestamp is not a whole microsecond, 2 a timestamp's text has a '.', 4 an instant named\n"
"         'Record Window End' was seen, 8 a pid or tid is negative.");

static PyObject *scan(PyObject *module, PyObject *data) {
    const char *reason = NULL;
    return run(module, data, &reason);
}

PyDoc_STRVAR(why_doc, "why(data) -> str | None\n\nWhy scan(data) declines, or None when it takes the batch.");

static PyObject *why(PyObject *module, PyObject *data) {
    const char *reason = NULL;
    PyObject *out = run(module, data, &reason);
    if (out == NULL) return NULL;
    if (out == Py_None) {
        Py_DECREF(out);
        return PyUnicode_FromString(reason ? reason : "declined");
    }
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O, scan_doc},
    {"why", why, METH_O, why_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    ModuleState *st = PyModule_GetState(module);
    st->column_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Column_spec, NULL);
    return st->column_type == NULL ? -1 : 0;
}

static int traverse_module(PyObject *module, visitproc visit, void *arg) {
    ModuleState *st = PyModule_GetState(module);
    Py_VISIT(st->column_type);
    return 0;
}

static int clear_module(PyObject *module) {
    ModuleState *st = PyModule_GetState(module);
    Py_CLEAR(st->column_type);
    return 0;
}

static void free_module(void *module) { clear_module((PyObject *)module); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "scan",
    "The Kineto parser's batch scanner in C (see scan).",
    sizeof(ModuleState), methods, slots, traverse_module, clear_module, free_module,
};

PyMODINIT_FUNC PyInit_scan(void) { return PyModuleDef_Init(&module); }
