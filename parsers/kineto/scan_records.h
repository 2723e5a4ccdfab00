/* A batch's records for scan.c (included by it once, after scan_json.h): the per-batch dictionaries of cats and
 * names (intern), the members of an X event's args, one record, and the whole batch (scan_all).
 */

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
            if (r.k.ts_dot) s->flags |= s->n_rows < DOT_HEAD_ROWS ? F_DOT | F_DOT_HEAD : F_DOT;
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
