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
#define F_DOT_HEAD 16   /* the text of a timestamp of one of the batch's first 64 X events has a '.' */
#define DOT_HEAD_ROWS 64

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

/* the rest of this one translation unit: strict JSON reading, then a batch's records */
#include "scan_json.h"
#include "scan_records.h"

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
"         'Record Window End' was seen, 8 a pid or tid is negative, 16 the timestamp's text of one of the first 64\n"
"         X events has a '.'.");

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
