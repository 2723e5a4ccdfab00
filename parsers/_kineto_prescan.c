/* Prescan: a plain Kineto trace read and scanned ahead of the parser, on a thread of its own that never takes the GIL,
 * so that a command can have the file scanned on one core while it still loads its libraries on the other.
 *
 * The parser (tracekit.parsers.kineto) streams the traceEvents array in batches cut by json_stream: blocks of
 * `block` bytes are read at offsets 0, block, 2 block, ... and, in the steady state, a batch runs from just after
 * the last batch's cut to the comma of the last "}, {" that lies wholly inside the block read last (Python's `\s`
 * as whitespace around the comma); where that block has none, to the last one in everything buffered. The prescan
 * cuts the file the same way and scans each batch with the scanner, keeping what it found by the batch's byte range
 * and a fingerprint of its bytes.
 *
 * Where the parser then asks for a batch (scan(offset, data)), the prescan's result is used only where its range is
 * the batch's and the fingerprint of the batch's bytes is the one the prescan computed: whatever the prescan guessed
 * (the start of the array is not known to it; a batch the parser cut otherwise, a file rewritten meanwhile), the
 * answer is the one scanning data would give, since the scan is a function of the bytes alone. The prescan waits
 * for nothing and needs nothing from the parser; the parser waits for the prescan only where it has not yet
 * decided the batches up to the one asked for.
 */

#include "_kineto_scan.h"

#if defined(__unix__) || defined(__APPLE__)
#define HAVE_PRESCAN 1
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#endif

#ifdef HAVE_PRESCAN

typedef struct {
    int64_t start, len; /* the batch's records: file bytes [start, start + len) */
    uint64_t fingerprint;
    Scan *scan; /* NULL once taken */
    int ok;
} Piece;

typedef struct {
    PyObject_HEAD
    PyObject *path; /* bytes (os.fsencode) */
    Py_ssize_t block;
    int64_t ahead;   /* at most this many bytes of the file scanned and not taken yet: the prescan waits beyond */
    int64_t held;    /* bytes of the file whose scans are held */
    int stalled;     /* the prescan waits for the parser to take scans (held would pass ahead) */
    Py_ssize_t first; /* pieces before this one were taken or forgotten */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Piece *pieces; /* in file order */
    Py_ssize_t n, cap;
    int64_t decided; /* every batch ending before this file offset that the prescan will have is in pieces */
    int state;       /* 0 not started, 1 running, 2 over */
    int cancel;
    Py_ssize_t hits, misses;
} Prescan;

enum { NOT_STARTED, RUNNING, OVER };

/* whitespace as Python's bytes pattern \s reads it */
static inline int is_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* the position of the comma of the last "}\s*,\s*{" lying wholly in p[0:n], or -1 */
static Py_ssize_t last_cut(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t end = n;
    while (end > 0) {
        Py_ssize_t brace = end - 1;
        while (brace >= 0 && p[brace] != '{')
            brace--;
        if (brace < 0) return -1;
        Py_ssize_t k = brace - 1;
        while (k >= 0 && is_space(p[k]))
            k--;
        if (k > 0 && p[k] == ',') {
            Py_ssize_t comma = k--;
            while (k >= 0 && is_space(p[k]))
                k--;
            if (k >= 0 && p[k] == '}') return comma;
        }
        end = brace;
    }
    return -1;
}

/* read up to n bytes (fewer only at the end of the file); -1 on error */
static Py_ssize_t read_full(int fd, uint8_t *buf, Py_ssize_t n) {
    Py_ssize_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, (size_t)(n - got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += r;
    }
    return got;
}

/* keep one batch's scan (under the lock); 0 where memory ran out */
static int add_piece(Prescan *self, int64_t start, int64_t len, uint64_t fp, Scan *scan, int ok, int64_t decided) {
    pthread_mutex_lock(&self->mu);
    while (self->held > 0 && self->held + len > self->ahead && !self->cancel) {
        self->stalled = 1; /* memory stays bounded however far behind the parser is */
        pthread_cond_broadcast(&self->cv);
        pthread_cond_wait(&self->cv, &self->mu);
    }
    self->stalled = 0;
    if (self->n == self->cap) {
        Py_ssize_t cap = self->cap ? 2 * self->cap : 512;
        Piece *p = realloc(self->pieces, (size_t)cap * sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&self->mu);
            return 0;
        }
        self->pieces = p;
        self->cap = cap;
    }
    self->pieces[self->n++] = (Piece){start, len, fp, scan, ok};
    self->held += len;
    self->decided = decided;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
    return 1;
}

static void set_decided(Prescan *self, int64_t decided) {
    pthread_mutex_lock(&self->mu);
    self->decided = decided;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
}

/* The prescan itself, without the GIL. buf holds '[' then the bytes from file offset `start` on: the tail of the
 * last block after the last cut (`tail` bytes), then the block just read. A batch is scanned in place, its comma
 * replaced by ']' for the scan. `synced`: whether the parser's batch most likely starts at `start` (after a cut in
 * the last block; not before the first such cut, nor after a cut the parser would not have made). */
static void prescan_file(Prescan *self, const char *path) {
    const Py_ssize_t B = self->block;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    uint8_t *buf = malloc((size_t)(2 * B + 2));
    if (buf == NULL) {
        close(fd);
        return;
    }
    buf[0] = '[';
    Py_ssize_t tail = 0;
    int64_t start = 0, offset = 0;
    int synced = 0;
    for (int64_t j = 0;; j++) {
        pthread_mutex_lock(&self->mu);
        int cancel = self->cancel;
        pthread_mutex_unlock(&self->mu);
        if (cancel) break;
        uint8_t *blk = buf + 1 + tail;
        Py_ssize_t n = read_full(fd, blk, B);
        if (n <= 0) break;
        offset += n;
        if (j == 0) {
            if (n >= 2 && blk[0] == 0x1f && blk[1] == 0x8b) break; /* gzip: the parser's offsets are not the file's */
            set_decided(self, offset);
            continue; /* the array starts somewhere in here: its first batch is the parser's to scan */
        }
        Py_ssize_t cut = last_cut(blk, n);
        Py_ssize_t comma = -1; /* in buf */
        if (cut >= 0) {
            comma = 1 + tail + cut;
        } else if (synced) {
            Py_ssize_t c = last_cut(buf + 1, tail + n);
            if (c >= 0) comma = 1 + c;
        }
        if (comma < 0 || !synced) {
            /* no batch the parser would cut here, or none whose start is known: start again after this cut */
            if (comma >= 0 && cut >= 0) {
                start = offset - n + cut + 1;
                tail = n - cut - 1;
                memmove(buf + 1, blk + cut + 1, (size_t)tail);
                synced = 1;
            } else {
                tail = 0;
                synced = 0;
            }
            set_decided(self, offset);
            if (n < B) break;
            continue;
        }
        Py_ssize_t len = comma - 1;
        buf[comma] = ']';
        int ok = 0;
        Scan *scan = scanner_run(buf, (size_t)comma + 1, &ok);
        buf[comma] = ',';
        if (scan == NULL) break;
        uint64_t fp = scanner_fingerprint(buf + 1, (size_t)len);
        if (!add_piece(self, start, len, fp, scan, ok, offset)) {
            scanner_free(scan);
            break;
        }
        start += len + 1;
        Py_ssize_t rest = tail + n - len - 1;
        /* a cut inside the tail leaves a block's worth or more buffered: the parser then looks for the next one
           without reading on, which only its exact path decides */
        synced = cut >= 0 || rest < B;
        tail = synced ? rest : 0;
        memmove(buf + 1, buf + comma + 1, (size_t)tail);
        if (n < B) break;
    }
    free(buf);
    close(fd);
}

static PyObject *Prescan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", "block", "ahead", NULL};
    PyObject *path = NULL;
    Py_ssize_t block;
    long long ahead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&nL", kwlist, PyUnicode_FSConverter, &path, &block, &ahead))
        return NULL;
    if (block < 64 || ahead < block) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_ValueError, "block must be at least 64 bytes, and ahead at least a block");
        return NULL;
    }
    Prescan *self = (Prescan *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    self->path = path;
    self->block = block;
    self->ahead = ahead;
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    return (PyObject *)self;
}

static void free_pieces(Prescan *self) {
    for (Py_ssize_t i = 0; i < self->n; i++)
        scanner_free(self->pieces[i].scan);
    free(self->pieces);
    self->pieces = NULL;
    self->n = self->cap = 0;
}

static void Prescan_dealloc(Prescan *self) {
    PyTypeObject *tp = Py_TYPE(self);
    free_pieces(self);
    pthread_cond_destroy(&self->cv);
    pthread_mutex_destroy(&self->mu);
    Py_XDECREF(self->path);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

PyDoc_STRVAR(run_doc, "run()\n\nRead and scan the file, without the GIL, until its end or cancel(); once only. Call it on "
                      "a thread of its own.");

static PyObject *Prescan_run(Prescan *self, PyObject *Py_UNUSED(ignored)) {
    pthread_mutex_lock(&self->mu);
    int state = self->state;
    if (state == NOT_STARTED) self->state = RUNNING;
    pthread_mutex_unlock(&self->mu);
    if (state != NOT_STARTED) {
        PyErr_SetString(PyExc_RuntimeError, "a prescan runs once");
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(self->path);
    Py_BEGIN_ALLOW_THREADS
    prescan_file(self, path);
    pthread_mutex_lock(&self->mu);
    self->state = OVER;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cancel_doc, "cancel()\n\nStop reading at the next block and forget what was scanned; what is asked after "
                         "is scanned on the spot. A prescan never run is over at once.");

static PyObject *Prescan_cancel(Prescan *self, PyObject *Py_UNUSED(ignored)) {
    Piece *pieces;
    Py_ssize_t n;
    pthread_mutex_lock(&self->mu);
    self->cancel = 1;
    if (self->state == NOT_STARTED) self->state = OVER;
    pieces = self->pieces;
    n = self->n;
    self->pieces = NULL;
    self->n = self->cap = self->first = 0;
    self->held = 0;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
    for (Py_ssize_t i = 0; i < n; i++)
        scanner_free(pieces[i].scan);
    free(pieces);
    Py_RETURN_NONE;
}

/* the piece whose range is [start, start + len), taken out of the prescan (scan NULL: none), after waiting for the
 * prescan to decide the batches up to its end where it is running and not stalled. Pieces ending `ahead` / 4 bytes or
 * more before `start` are forgotten: the parser asks for batches in file order but for a few read ahead, and a piece
 * it did not ask for by then (cut otherwise) would only hold the prescan up. */
static Piece take(Prescan *self, int64_t start, int64_t len) {
    Piece found = {0, 0, 0, NULL, 0};
    Scan *stale[64];
    int n_stale;
    pthread_mutex_lock(&self->mu);
    do {
        n_stale = 0;
        while (self->first < self->n && n_stale < 64 &&
               self->pieces[self->first].start + self->pieces[self->first].len < start - self->ahead / 4) {
            Piece *p = &self->pieces[self->first++];
            if (p->scan != NULL) {
                stale[n_stale++] = p->scan;
                p->scan = NULL;
                self->held -= p->len;
            }
        }
        if (n_stale) {
            pthread_cond_broadcast(&self->cv);
            pthread_mutex_unlock(&self->mu);
            for (int i = 0; i < n_stale; i++)
                scanner_free(stale[i]);
            pthread_mutex_lock(&self->mu);
        }
    } while (n_stale == 64);
    while (self->state == RUNNING && !self->stalled && self->decided <= start + len)
        pthread_cond_wait(&self->cv, &self->mu);
    Py_ssize_t lo = self->first, hi = self->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (self->pieces[mid].start < start) lo = mid + 1;
        else hi = mid;
    }
    if (lo < self->n && self->pieces[lo].start == start && self->pieces[lo].len == len && self->pieces[lo].scan) {
        found = self->pieces[lo];
        self->pieces[lo].scan = NULL;
        self->held -= len;
        pthread_cond_broadcast(&self->cv);
    }
    pthread_mutex_unlock(&self->mu);
    return found;
}

PyDoc_STRVAR(scan_doc,
"scan(offset, data) -> None | tuple\n\n"
"What the module's scan(data) returns for the batch data (\"[\" + the file's bytes from offset on + \"]\"): the\n"
"prescan's result where it scanned those very bytes, else scanned now. Waits, without the GIL, for the prescan to\n"
"reach the batch's end while it runs.");

static PyObject *Prescan_scan(Prescan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan(offset, data)");
        return NULL;
    }
    long long offset = PyLong_AsLongLong(args[0]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *data = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len;
    Piece piece = {0, 0, 0, NULL, 0};
    Scan *scan = NULL;
    int ok = 0, hit = 0;
    Py_BEGIN_ALLOW_THREADS
    if (n >= 2 && data[0] == '[' && data[n - 1] == ']') piece = take(self, offset, n - 2);
    if (piece.scan != NULL && scanner_fingerprint(data + 1, (size_t)(n - 2)) == piece.fingerprint) {
        scan = piece.scan;
        ok = piece.ok;
        hit = 1;
    } else {
        scanner_free(piece.scan);
        scan = scanner_run(data, (size_t)n, &ok);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (scan == NULL) return PyErr_NoMemory();
    pthread_mutex_lock(&self->mu);
    if (hit) self->hits++;
    else self->misses++;
    pthread_mutex_unlock(&self->mu);
    return scanner_result(PyType_GetModule(Py_TYPE(self)), scan, ok);
}

PyDoc_STRVAR(stats_doc, "stats() -> dict\n\nBatches answered from the prescan (hits) and scanned on the spot (misses), "
                        "batches it holds, bytes read, and whether it is over.");

static PyObject *Prescan_stats(Prescan *self, PyObject *Py_UNUSED(ignored)) {
    pthread_mutex_lock(&self->mu);
    Py_ssize_t hits = self->hits, misses = self->misses, held = 0;
    for (Py_ssize_t i = 0; i < self->n; i++)
        held += self->pieces[i].scan != NULL;
    long long read_bytes = self->decided;
    int over = self->state == OVER;
    pthread_mutex_unlock(&self->mu);
    return Py_BuildValue("{s:n,s:n,s:n,s:L,s:O}", "hits", hits, "misses", misses, "held", held, "read_bytes",
                         read_bytes, "over", over ? Py_True : Py_False);
}

static PyMethodDef Prescan_methods[] = {
    {"run", (PyCFunction)Prescan_run, METH_NOARGS, run_doc},
    {"cancel", (PyCFunction)Prescan_cancel, METH_NOARGS, cancel_doc},
    {"scan", (PyCFunction)(void (*)(void))Prescan_scan, METH_FASTCALL, scan_doc},
    {"stats", (PyCFunction)Prescan_stats, METH_NOARGS, stats_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Prescan_doc,
"Prescan(path, block, ahead)\n\n"
"A plain Kineto trace read in blocks of `block` bytes (the parser's) and scanned batch by batch the way the parser\n"
"will cut it, by run() on a thread of its own without the GIL, holding the scans of at most `ahead` bytes of the\n"
"file that were not asked for yet; scan(offset, data) answers the parser's batches.");

static PyType_Slot Prescan_slots[] = {
    {Py_tp_new, Prescan_new},
    {Py_tp_dealloc, Prescan_dealloc},
    {Py_tp_methods, Prescan_methods},
    {Py_tp_doc, (void *)Prescan_doc},
    {0, NULL},
};

static PyType_Spec Prescan_spec = {
    "tracekit.parsers._kineto_scan.Prescan", sizeof(Prescan), 0, Py_TPFLAGS_DEFAULT, Prescan_slots,
};

int prescan_add_type(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &Prescan_spec, NULL);
    if (type == NULL) return -1;
    int rc = PyModule_AddObjectRef(module, "Prescan", type);
    Py_DECREF(type);
    return rc;
}

#else

int prescan_add_type(PyObject *module) {
    (void)module;
    return 0; /* no threads of this kind here: the parser scans every batch itself */
}

#endif
