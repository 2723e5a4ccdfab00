/* The dependency-graph engine's loops in C (tracekit.engine._kernels): arrays in, arrays out.

   Every function takes C-contiguous buffers (numpy arrays) of the element sizes its docstring names — the Python
   modules beside this file make them so and allocate the outputs — and runs its loop with the GIL released, so
   that replays on several threads share the cores. Times and weights are int64 ns; nodes, positions and edge
   indices of a plan are int32 (the face refuses graphs beyond 2^31 - 1 nodes or edges). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------- buffer checks */

#define MAX_ARGS 16

typedef struct {
    Py_buffer v[MAX_ARGS];
    int n;
} Args;

static void release(Args *a) {
    for (int i = 0; i < a->n; i++) PyBuffer_Release(&a->v[i]);
    a->n = 0;
}

/* the buffer of `o` (writable if asked) with elements of `size` bytes, signed integers, into *buf and *count; -1
   with an exception */
static int get(Args *a, PyObject *o, Py_ssize_t size, int writable, void **buf, Py_ssize_t *count) {
    Py_buffer *v = &a->v[a->n];
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, v, flags) < 0) return -1;
    a->n++;
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (v->itemsize != size || strchr("bhilqn", *f) == NULL || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "expected a contiguous array of %zd-byte signed integers", size);
        return -1;
    }
    *buf = v->buf;
    *count = v->len / size;
    return 0;
}

#define I64(obj, name, w)                                                                                             \
    Py_ssize_t n_##name;                                                                                              \
    int64_t *name;                                                                                                    \
    if (get(&args, obj, 8, w, (void **)&name, &n_##name) < 0) goto fail;
#define I32(obj, name, w)                                                                                             \
    Py_ssize_t n_##name;                                                                                              \
    int32_t *name;                                                                                                    \
    if (get(&args, obj, 4, w, (void **)&name, &n_##name) < 0) goto fail;

static PyObject *too_short(const char *what) {
    PyErr_Format(PyExc_ValueError, "%s: arrays of the wrong length", what);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ binding edges */

PyDoc_STRVAR(bind_doc,
"bind(src, dst, lag, times, binding, slack, best)\n\n"
"Per node its binding edge (the last edge attaining max(times[src] + lag) into it; -1 without one) into binding\n"
"(n int64) and the slack left on it into slack (m int64: times[node] - that max where positive, else 0); best is\n"
"scratch (n int64). src, dst, lag: m int64; times: n int64.");

static PyObject *k_bind(PyObject *self, PyObject *a) {
    PyObject *o[7];
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6])) return NULL;
    I64(o[0], src, 0) I64(o[1], dst, 0) I64(o[2], lag, 0) I64(o[3], times, 0) I64(o[4], binding, 1)
    I64(o[5], slack, 1) I64(o[6], best, 1)
    Py_ssize_t m = n_src, n = n_times;
    if (n_dst != m || n_lag != m || n_slack != m || n_binding != n || n_best != n) {
        release(&args);
        return too_short("bind");
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t v = 0; v < n; v++) binding[v] = -1;
    for (Py_ssize_t e = 0; e < m && !bad; e++) {
        int64_t s = src[e], d = dst[e];
        if (s < 0 || s >= n || d < 0 || d >= n) {
            bad = 1;
            break;
        }
        int64_t val = (int64_t)((uint64_t)times[s] + (uint64_t)lag[e]); /* wraps as numpy does */
        if (binding[d] < 0 || val >= best[d]) {
            best[d] = val;
            binding[d] = e;
        }
    }
    if (!bad) {
        memset(slack, 0, (size_t)m * sizeof(int64_t));
        for (Py_ssize_t v = 0; v < n; v++) {
            int64_t e = binding[v];
            if (e >= 0) {
                int64_t gap = times[v] - best[v];
                if (gap > 0) slack[e] = gap;
            }
        }
    }
    Py_END_ALLOW_THREADS
    release(&args);
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "bind: an edge's node is out of range");
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    release(&args);
    return NULL;
}

PyDoc_STRVAR(chase_doc,
"chase(binding, src, times, sink, s0, nodes, edges) -> int\n\n"
"The nodes back from sink along binding edges while their time is after s0, and each one's binding edge (-1 where\n"
"none: the chain stops there), into nodes and edges (int64 each); returns how many, or -1 where they do not fit.");

static PyObject *k_chase(PyObject *self, PyObject *a) {
    PyObject *o[7];
    long long sink, s0;
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOLLOO", &o[0], &o[1], &o[2], &sink, &s0, &o[5], &o[6])) return NULL;
    I64(o[0], binding, 0) I64(o[1], src, 0) I64(o[2], times, 0) I64(o[5], nodes, 1) I64(o[6], edges, 1)
    Py_ssize_t n = n_times, cap = n_nodes < n_edges ? n_nodes : n_edges;
    if (n_binding != n || sink < 0 || sink >= n) {
        release(&args);
        return too_short("chase");
    }
    Py_ssize_t k = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t node = sink;
    while (times[node] > s0) {
        if (k == cap) {
            k = -1;
            break;
        }
        int64_t e = binding[node];
        nodes[k] = node;
        edges[k] = e;
        k++;
        if (e < 0) break;
        if (e >= n_src || src[e] < 0 || src[e] >= n) {
            bad = 1;
            break;
        }
        node = src[e];
    }
    Py_END_ALLOW_THREADS
    release(&args);
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "chase: an edge is out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(k);
fail:
    release(&args);
    return NULL;
}

PyDoc_STRVAR(walk_doc,
"walk(nodes, edges, src, etype, lag, gap, times, act_label, lag_label, slack_label, s0, codes, start, end, label,\n"
"     owner, edge) -> int\n\n"
"The segments of a critical path from its chain (chase's nodes and edges, latest first), latest first: per step the\n"
"slack beyond the binding edge's bound (slack_label[etype]), the untraced gaps inside a merged run's lag (idle, on\n"
"program order) and the lag itself (its activity's act_label on an own edge, else lag_label[etype]; owned by the\n"
"source activity on a launch or enqueue edge), each cut at s0; then, where the chain ends at a node nothing binds,\n"
"idle from s0 (edge 'source'). Only segments that last are kept. codes: int64 (own, launch, enqueue edge types;\n"
"the idle label; the program and source edge codes). src, lag, gap (empty: none), times, nodes, edges, start, end,\n"
"owner: int64; etype, act_label, lag_label, slack_label, label, edge: int8. Returns how many segments.");

static PyObject *k_walk(PyObject *self, PyObject *a) {
    PyObject *o[17];
    long long s0;
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOOOOOLOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &s0, &o[11], &o[12], &o[13], &o[14], &o[15], &o[16]))
        return NULL;
    I64(o[0], nodes, 0) I64(o[1], edges, 0) I64(o[2], src, 0) I64(o[4], lag, 0) I64(o[5], gap, 0)
    I64(o[6], times, 0) I64(o[11], codes, 0) I64(o[12], start, 1) I64(o[13], end, 1) I64(o[15], owner, 1)
    int8_t *etype, *act_label, *lag_label, *slack_label, *label, *edge;
    Py_ssize_t n_etype, n_act_label, n_lag_label, n_slack_label, n_label, n_edge;
    if (get(&args, o[3], 1, 0, (void **)&etype, &n_etype) < 0 ||
        get(&args, o[7], 1, 0, (void **)&act_label, &n_act_label) < 0 ||
        get(&args, o[8], 1, 0, (void **)&lag_label, &n_lag_label) < 0 ||
        get(&args, o[9], 1, 0, (void **)&slack_label, &n_slack_label) < 0 ||
        get(&args, o[14], 1, 1, (void **)&label, &n_label) < 0 || get(&args, o[16], 1, 1, (void **)&edge, &n_edge) < 0)
        goto fail;
    Py_ssize_t k = n_nodes, cap = 3 * k + 1, m = n_src, n = n_times;
    if (n_edges != k || n_codes < 6 || n_start < cap || n_end < cap || n_owner < cap || n_label < cap ||
        n_edge < cap || n_etype != m || n_lag != m || (n_gap != 0 && n_gap != m)) {
        release(&args);
        return too_short("walk");
    }
    int64_t own = codes[0], launch = codes[1], enqueue = codes[2], idle = codes[3], program = codes[4],
            source = codes[5];
    Py_ssize_t out = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
#define EMIT(s_, e_, l_, o_, g_)                                                                                      \
    do {                                                                                                              \
        int64_t s__ = (s_), e__ = (e_);                                                                               \
        if (e__ > s__) {                                                                                              \
            start[out] = s__;                                                                                         \
            end[out] = e__;                                                                                           \
            label[out] = (int8_t)(l_);                                                                                \
            owner[out] = (o_);                                                                                        \
            edge[out] = (int8_t)(g_);                                                                                 \
            out++;                                                                                                    \
        }                                                                                                             \
    } while (0)
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t nd = nodes[i], e = edges[i];
        if (nd < 0 || nd >= n) {
            bad = 1;
            break;
        }
        if (e < 0) { /* the chain ends at a node nothing binds: idle from the iteration's start */
            EMIT(s0, times[nd], idle, nd / 2, source);
            break;
        }
        if (e >= m || src[e] < 0 || src[e] >= n || etype[e] < 0 || etype[e] >= n_lag_label ||
            etype[e] >= n_slack_label) {
            bad = 1;
            break;
        }
        int64_t p = src[e], et = etype[e], lg = lag[e], g = n_gap ? gap[e] : 0;
        int64_t t_node = times[nd], t_struct = times[p] + lg, t_work = t_struct - g;
        int64_t a_dst = nd / 2, a_src = p / 2;
        if (a_dst >= n_act_label) {
            bad = 1;
            break;
        }
        if (t_node > t_struct) /* slack: from the structural bound to the node */
            EMIT(t_struct > s0 ? t_struct : s0, t_node, slack_label[et], a_dst, et);
        if (g > 0 && t_struct > s0) /* a merged run's untraced gaps: idle on program order, at the end of its lag */
            EMIT(t_work > s0 ? t_work : s0, t_struct < t_node ? t_struct : t_node, idle, a_dst, program);
        if (lg - g > 0 && t_work > s0) { /* the structural lag: the activity's own work, or the edge's */
            int is_own = et == own;
            EMIT(times[p] > s0 ? times[p] : s0, t_work < t_node ? t_work : t_node,
                 is_own ? act_label[a_dst] : lag_label[et],
                 (!is_own && (et == launch || et == enqueue)) ? a_src : a_dst, et);
        }
    }
#undef EMIT
    Py_END_ALLOW_THREADS
    release(&args);
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "walk: a node, edge or edge type is out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(out);
fail:
    release(&args);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ plans and sweeps */

PyDoc_STRVAR(kahn_doc,
"kahn(src0, dst0, src1, dst1, order, in_ptr, in_src, in_edge) -> int\n\n"
"Kahn's algorithm on the edges src0 -> dst0 followed by src1 -> dst1 (int64 each) of n nodes (n = len(order)): a\n"
"topological order into order (n int32; a last-in first-out queue, so that the order follows a lane's chain\n"
"while it can, the lowest-numbered source first), and every node v's incoming edges as the slots\n"
"in_ptr[v]:in_ptr[v+1] (in_ptr: n + 1 int32) with their sources as positions in the order (in_src, m int32) and\n"
"their indices in the edge list (in_edge, m int32). Returns how many nodes were settled: fewer than n where the\n"
"edges close a cycle. n and m must be below 2^31 - 1.");

static PyObject *k_kahn(PyObject *self, PyObject *a) {
    PyObject *o[8];
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    I64(o[0], src0, 0) I64(o[1], dst0, 0) I64(o[2], src1, 0) I64(o[3], dst1, 0) I32(o[4], order, 1)
    I32(o[5], in_ptr, 1) I32(o[6], in_src, 1) I32(o[7], in_edge, 1)
    Py_ssize_t n = n_order, m0 = n_src0, m = n_src0 + n_src1;
    if (n_dst0 != m0 || n_dst1 != n_src1 || n_in_ptr != n + 1 || n_in_src != m || n_in_edge != m ||
        n >= INT32_MAX || m >= INT32_MAX) {
        release(&args);
        return too_short("kahn");
    }
    Py_ssize_t settled = 0;
    int bad = 0, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    /* per node, where its next incoming edge goes and where its incoming edges end (one cache line, not two arrays);
       per outgoing slot, the edge and its destination (the loop below then reads no edge list at random). The
       queue of ready nodes grows down from the end of `order` while the order grows up from its start: a node is
       in one of the two at most, so they never meet. Every index fits int32: half the memory to fault in. */
    typedef struct {
        int32_t fill, end;
    } Slots;
    typedef struct {
        int32_t edge, dst;
    } Out;
    int32_t *out_ptr = calloc((size_t)n + 1, sizeof(int32_t));
    Slots *node = malloc(((size_t)n + 1) * sizeof(Slots));
    Out *out = malloc(((size_t)m + 1) * sizeof(Out));
    if (!out_ptr || !node || !out) {
        nomem = 1;
        goto done;
    }
    memset(in_ptr, 0, ((size_t)n + 1) * sizeof(int32_t));
    for (Py_ssize_t e = 0; e < m0; e++) {
        int64_t s = src0[e], d = dst0[e];
        if (s < 0 || s >= n || d < 0 || d >= n) {
            bad = 1;
            goto done;
        }
        in_ptr[d + 1]++;
        out_ptr[s + 1]++;
    }
    for (Py_ssize_t e = 0; e < m - m0; e++) {
        int64_t s = src1[e], d = dst1[e];
        if (s < 0 || s >= n || d < 0 || d >= n) {
            bad = 1;
            goto done;
        }
        in_ptr[d + 1]++;
        out_ptr[s + 1]++;
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        out_ptr[v + 1] += out_ptr[v];
        in_ptr[v + 1] += in_ptr[v];
        node[v].fill = out_ptr[v];
    }
    for (Py_ssize_t e = 0; e < m0; e++) {
        Out *x = &out[node[src0[e]].fill++];
        x->edge = (int32_t)e;
        x->dst = (int32_t)dst0[e];
    }
    for (Py_ssize_t e = 0; e < m - m0; e++) {
        Out *x = &out[node[src1[e]].fill++];
        x->edge = (int32_t)(m0 + e);
        x->dst = (int32_t)dst1[e];
    }
    int32_t *queue = order + n; /* queue[-1], queue[-2], ...: the ready nodes, the last pushed on top */
    Py_ssize_t top = 0;
    for (Py_ssize_t v = n - 1; v >= 0; v--) {
        node[v].fill = in_ptr[v];
        node[v].end = in_ptr[v + 1];
        if (in_ptr[v] == in_ptr[v + 1]) queue[-(++top)] = (int32_t)v;
    }
    while (top > 0) {
        int32_t u = queue[-(top--)];
        order[settled] = u;
        for (int32_t k = out_ptr[u + 1] - 1; k >= out_ptr[u]; k--) {
            Slots *sv = &node[out[k].dst];
            int32_t f = sv->fill++;
            in_src[f] = (int32_t)settled;
            in_edge[f] = out[k].edge;
            if (sv->fill == sv->end) queue[-(++top)] = out[k].dst;
        }
        settled++;
    }
done:
    free(out_ptr);
    free(node);
    free(out);
    Py_END_ALLOW_THREADS
    release(&args);
    if (nomem) return PyErr_NoMemory();
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "kahn: an edge's node is out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(settled);
fail:
    release(&args);
    return NULL;
}

PyDoc_STRVAR(asap_doc,
"asap(order, in_ptr, in_src, in_edge, weight, more, start, out)\n\n"
"Node times of the ASAP schedule of a plan (kahn's outputs) into out (n int64): every node at the max over its\n"
"incoming edges of (predecessor's time + weight); edge e weighs weight[e], or more[e - len(weight)] beyond (int64\n"
"each); an edge beyond both is not there. A node without incoming edges keeps start (n int64).");

static PyObject *k_asap(PyObject *self, PyObject *a) {
    PyObject *o[8];
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    I32(o[0], order, 0) I32(o[1], in_ptr, 0) I32(o[2], in_src, 0) I32(o[3], in_edge, 0) I64(o[4], weight, 0)
    I64(o[5], more, 0) I64(o[6], start, 0) I64(o[7], out, 1)
    Py_ssize_t n = n_order, m = n_weight, k_more = n_more;
    if (n_in_ptr != n + 1 || n_start != n || n_out != n || n_in_src != n_in_edge ||
        (n && in_ptr[n] > n_in_src)) {
        release(&args);
        return too_short("asap");
    }
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t *t = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (t == NULL) {
        nomem = 1;
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t v = order[i];
            int64_t best = 0;
            int seen = 0;
            for (int32_t k = in_ptr[v]; k < in_ptr[v + 1]; k++) {
                int64_t e = in_edge[k], c;
                if (e < m)
                    c = t[in_src[k]] + weight[e];
                else if (e - m < k_more)
                    c = t[in_src[k]] + more[e - m];
                else
                    continue;
                if (!seen || c > best) {
                    best = c;
                    seen = 1;
                }
            }
            if (!seen) best = start[v];
            t[i] = best;
            out[v] = best;
        }
        free(t);
    }
    Py_END_ALLOW_THREADS
    release(&args);
    if (nomem) return PyErr_NoMemory();
    Py_RETURN_NONE;
fail:
    release(&args);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ grids of scenarios */

PyDoc_STRVAR(layout_doc,
"layout(order, in_ptr, in_src, in_edge, weight, start, ptr, src, slot, base, first, pos)\n\n"
"A plan (kahn's outputs) laid out for sweeps by position: its incoming edges in the order's positions (ptr: n + 1\n"
"int32, src: their sources as positions, m int32), each edge's slot there (slot, m int64), the weights by slot\n"
"(base: weight[edge] of each slot, m int64), each position's start (first: start[order[i]], n int64) and each\n"
"node's position (pos, n int64). A sweep then reads every array front to back but the times it wrote.");

static PyObject *k_layout(PyObject *self, PyObject *a) {
    PyObject *o[12];
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9],
                          &o[10], &o[11]))
        return NULL;
    I32(o[0], order, 0) I32(o[1], in_ptr, 0) I32(o[2], in_src, 0) I32(o[3], in_edge, 0) I64(o[4], weight, 0)
    I64(o[5], start, 0) I32(o[6], ptr, 1) I32(o[7], src, 1) I64(o[8], slot, 1) I64(o[9], base, 1)
    I64(o[10], first, 1) I64(o[11], pos, 1)
    Py_ssize_t n = n_order, m = n_in_edge;
    if (n_in_ptr != n + 1 || n_ptr != n + 1 || n_in_src != m || n_src != m || n_slot != m || n_base != m ||
        n_weight != m || n_start != n || n_first != n || n_pos != n || (n && in_ptr[n] != m)) {
        release(&args);
        return too_short("layout");
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    ptr[0] = 0;
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        int32_t v = order[i];
        int32_t k = ptr[i];
        for (int32_t j = in_ptr[v]; j < in_ptr[v + 1]; j++, k++) {
            int32_t e = in_edge[j];
            if (e < 0 || e >= m) {
                bad = 1;
                break;
            }
            src[k] = in_src[j];
            slot[e] = k;
            base[k] = weight[e];
        }
        ptr[i + 1] = k;
        first[i] = start[v];
        pos[v] = i;
    }
    Py_END_ALLOW_THREADS
    release(&args);
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "layout: an edge index is out of range");
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    release(&args);
    return NULL;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* as numpy's median of integers: the middle one, or the mean of the two middle ones, as a double; sorts v */
static double median(int64_t *v, Py_ssize_t k) {
    qsort(v, (size_t)k, sizeof(int64_t), cmp_i64);
    if (k % 2 == 1) return (double)v[k / 2];
    return ((double)v[k / 2 - 1] + (double)v[k / 2]) / 2.0;
}

/* the iteration time of times t (indexed as s_idx/e_idx index it): the median gap between consecutive iterations'
   first starts (gaps > 0 only), else the median iteration span; scratch: 3 * count int64. Truncated as int() does */
static int64_t period_of(const int64_t *t, const int32_t *s_idx, const int32_t *s_code, Py_ssize_t n_s,
                         const int32_t *e_idx, const int32_t *e_code, Py_ssize_t n_e, Py_ssize_t count,
                         int64_t *scratch) {
    int64_t *first = scratch, *last = scratch + count, *vals = scratch + 2 * count;
    for (Py_ssize_t g = 0; g < count; g++) first[g] = INT64_MAX;
    for (Py_ssize_t i = 0; i < n_s; i++) {
        int64_t s = t[s_idx[i]];
        if (s < first[s_code[i]]) first[s_code[i]] = s;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t g = 1; g < count; g++) {
        int64_t d = first[g] - first[g - 1];
        if (d > 0) vals[k++] = d; /* ranks from unrelated runs can put iteration k+1 no later than k: not a period */
    }
    if (k == 0) {
        for (Py_ssize_t g = 0; g < count; g++) last[g] = INT64_MIN;
        for (Py_ssize_t i = 0; i < n_e; i++) {
            int64_t e = t[e_idx[i]];
            if (e > last[e_code[i]]) last[e_code[i]] = e;
        }
        for (Py_ssize_t g = 0; g < count; g++) vals[g] = last[g] - first[g];
        k = count;
    }
    return (int64_t)median(vals, k);
}

PyDoc_STRVAR(period_doc,
"period(t, s_idx, s_code, e_idx, e_code, count) -> int\n\n"
"The iteration time of the schedule t (int64): each of count iterations starts at the earliest t[s_idx[i]] of its\n"
"code s_code[i] and ends at the latest t[e_idx[i]] of e_code[i] (int32 each); the median time between consecutive\n"
"starts (only where later), else the median span; truncated toward zero as numpy's median turned int.");

static PyObject *k_period(PyObject *self, PyObject *a) {
    PyObject *o[5];
    Py_ssize_t count;
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOn", &o[0], &o[1], &o[2], &o[3], &o[4], &count)) return NULL;
    I64(o[0], t, 0) I32(o[1], s_idx, 0) I32(o[2], s_code, 0) I32(o[3], e_idx, 0) I32(o[4], e_code, 0)
    if (n_s_code != n_s_idx || n_e_code != n_e_idx || count < 1) {
        release(&args);
        return too_short("period");
    }
    int64_t out = 0;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t *scratch = malloc((size_t)count * 3 * sizeof(int64_t));
    if (scratch == NULL)
        nomem = 1;
    else
        out = period_of(t, s_idx, s_code, n_s_idx, e_idx, e_code, n_e_idx, count, scratch);
    free(scratch);
    Py_END_ALLOW_THREADS
    release(&args);
    if (nomem) return PyErr_NoMemory();
    return PyLong_FromLongLong(out);
fail:
    release(&args);
    return NULL;
}

PyDoc_STRVAR(run_doc,
"run(ptr, src, base, first, ch_ptr, ch_slot, ch_w, lo, hi, s_idx, s_code, e_idx, e_code, count, out)\n\n"
"Scenarios lo:hi of a plan laid out by position (layout: ptr, src, int32; base: the weights by slot, int64; first:\n"
"each position's time where no edge comes in, int64): scenario s writes ch_w[ch_ptr[s]:ch_ptr[s+1]] over the\n"
"slots ch_slot[...] (int64 each), sweeps, and puts its iteration time (period; without iterations, the schedule's\n"
"span) into out[s] (int64); the slots are restored after each, so the weights are copied once per call.");

static PyObject *k_run(PyObject *self, PyObject *a) {
    PyObject *o[15];
    Py_ssize_t lo, hi, count;
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOOnnOOOOnO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &lo, &hi, &o[9],
                          &o[10], &o[11], &o[12], &count, &o[14]))
        return NULL;
    I32(o[0], ptr, 0) I32(o[1], src, 0) I64(o[2], base, 0) I64(o[3], first, 0) I64(o[4], ch_ptr, 0)
    I64(o[5], ch_slot, 0) I64(o[6], ch_w, 0) I32(o[9], s_idx, 0) I32(o[10], s_code, 0) I32(o[11], e_idx, 0)
    I32(o[12], e_code, 0) I64(o[14], out, 1)
    Py_ssize_t n = n_first, m = n_base;
    if (n_ptr != n + 1 || n_src != m || (n && ptr[n] > m) || lo < 0 || hi > n_out || hi + 1 > n_ch_ptr ||
        n_ch_w != n_ch_slot || n_s_code != n_s_idx || n_e_code != n_e_idx || count < 0) {
        release(&args);
        return too_short("run");
    }
    int nomem = 0, bad = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t *w = malloc(((size_t)m + 1) * sizeof(int64_t));
    int64_t *t = malloc(((size_t)n + 1) * sizeof(int64_t));
    int64_t *scratch = malloc(((size_t)count * 3 + 1) * sizeof(int64_t));
    if (!w || !t || !scratch) {
        nomem = 1;
    } else {
        memcpy(w, base, (size_t)m * sizeof(int64_t));
        for (Py_ssize_t s = lo; s < hi && !bad; s++) {
            for (int64_t k = ch_ptr[s]; k < ch_ptr[s + 1]; k++) {
                if (k < 0 || k >= n_ch_slot || ch_slot[k] < 0 || ch_slot[k] >= m) {
                    bad = 1;
                    break;
                }
                w[ch_slot[k]] = ch_w[k];
            }
            if (bad) break;
            for (Py_ssize_t i = 0; i < n; i++) {
                int32_t b = ptr[i], e = ptr[i + 1];
                if (b == e) {
                    t[i] = first[i];
                    continue;
                }
                int64_t best = t[src[b]] + w[b];
                for (int32_t k = b + 1; k < e; k++) {
                    int64_t c = t[src[k]] + w[k];
                    if (c > best) best = c;
                }
                t[i] = best;
            }
            if (count) {
                out[s] = period_of(t, s_idx, s_code, n_s_idx, e_idx, e_code, n_e_idx, count, scratch);
            } else if (n) {
                int64_t lo_t = t[0], hi_t = t[0];
                for (Py_ssize_t i = 1; i < n; i++) {
                    if (t[i] < lo_t) lo_t = t[i];
                    if (t[i] > hi_t) hi_t = t[i];
                }
                out[s] = hi_t - lo_t;
            }
            for (int64_t k = ch_ptr[s]; k < ch_ptr[s + 1]; k++) w[ch_slot[k]] = base[ch_slot[k]];
        }
    }
    free(w);
    free(t);
    free(scratch);
    Py_END_ALLOW_THREADS
    release(&args);
    if (nomem) return PyErr_NoMemory();
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "run: a changed slot is out of range");
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    release(&args);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ parts of a graph */

PyDoc_STRVAR(advance_doc,
"advance(out_ptr, out_dst, w_out, left, acc, stack, top, tgt_ptr, tgt_dst, w_tgt, mem_ptr, mem_hub, rel_hub,\n"
"        rel_time, arr_hub, arr_time) -> int\n\n"
"One part of a graph whose parts meet only at hubs, replayed for S scenarios at once, as far as what is known\n"
"allows (Kahn's algorithm, resumed by each call). The part's edges by source (out_ptr: n + 1, out_dst: int32) weigh\n"
"w_out[slot * S + s]; left (n int32) counts each node's inputs not settled yet, acc (n * S int64) holds the max\n"
"over its settled inputs (a node's time once left is 0), stack (n int32) and top (1 int64) the settled nodes whose\n"
"edges are not followed yet. First the released hubs rel_hub (int32, local numbers) at rel_time (r * S int64) feed\n"
"the nodes they lead to (tgt_ptr: hubs + 1, tgt_dst: int32, weights w_tgt[slot * S + s]); then every node that\n"
"settles feeds its successors, and where it is a member of hubs (mem_ptr: n + 1, mem_hub: int32) its times are\n"
"written to arr_time (arr_hub the hub): returns how many. -1 where arr_hub is too short (the node whose arrivals\n"
"did not fit is left on the stack, unsettled: a call with room goes on from it).");

/* node v's inputs so far (acc[v * S ...]) against a settled source at t plus weights w, per scenario; v is pushed on
   the stack once it has no input left: returns the stack's new height */
static inline Py_ssize_t relax(int64_t *acc, int32_t *left, int32_t *stack, Py_ssize_t sp, int32_t v,
                               const int64_t *t, const int64_t *w, Py_ssize_t S) {
    int64_t *av = acc + (Py_ssize_t)v * S;
    for (Py_ssize_t s = 0; s < S; s++) {
        int64_t c = t[s] + w[s];
        if (c > av[s]) av[s] = c;
    }
    if (--left[v] == 0) stack[sp++] = v;
    return sp;
}

static PyObject *k_advance(PyObject *self, PyObject *a) {
    PyObject *o[16];
    Args args = {.n = 0};
    if (!PyArg_ParseTuple(a, "OOOOOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9],
                          &o[10], &o[11], &o[12], &o[13], &o[14], &o[15]))
        return NULL;
    I32(o[0], out_ptr, 0) I32(o[1], out_dst, 0) I64(o[2], w_out, 0) I32(o[3], left, 1) I64(o[4], acc, 1)
    I32(o[5], stack, 1) I64(o[6], top, 1) I32(o[7], tgt_ptr, 0) I32(o[8], tgt_dst, 0) I64(o[9], w_tgt, 0)
    I32(o[10], mem_ptr, 0) I32(o[11], mem_hub, 0) I32(o[12], rel_hub, 0) I64(o[13], rel_time, 0)
    I32(o[14], arr_hub, 1) I64(o[15], arr_time, 1)
    Py_ssize_t n = n_left, hubs = n_tgt_ptr - 1, r = n_rel_hub;
    Py_ssize_t S = n ? n_acc / n : 1;
    if (S < 1) S = 1;
    if (n_out_ptr != n + 1 || n_mem_ptr != n + 1 || n_acc != n * S || n_stack != n || n_top != 1 || hubs < 0 ||
        (n && (out_ptr[n] > n_out_dst || mem_ptr[n] > n_mem_hub)) || n_w_out < (Py_ssize_t)n_out_dst * S ||
        (hubs && tgt_ptr[hubs] > n_tgt_dst) || n_w_tgt < (Py_ssize_t)n_tgt_dst * S || n_rel_time != r * S ||
        n_arr_time != n_arr_hub * S || top[0] < 0 || top[0] > n) {
        release(&args);
        return too_short("advance");
    }
    Py_ssize_t got = 0;
    int bad = 0, full = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t sp = (Py_ssize_t)top[0];
    for (Py_ssize_t i = 0; i < r && !bad; i++) {
        int32_t k = rel_hub[i];
        if (k < 0 || k >= hubs) {
            bad = 1;
            break;
        }
        for (int32_t j = tgt_ptr[k]; j < tgt_ptr[k + 1]; j++)
            sp = relax(acc, left, stack, sp, tgt_dst[j], rel_time + i * S, w_tgt + (Py_ssize_t)j * S, S);
    }
    while (sp > 0 && !bad) {
        int32_t u = stack[sp - 1];
        if (got + (mem_ptr[u + 1] - mem_ptr[u]) > n_arr_hub) { /* no room for its arrivals: it waits on the stack */
            full = 1;
            break;
        }
        sp--;
        const int64_t *tu = acc + (Py_ssize_t)u * S;
        for (int32_t k = out_ptr[u]; k < out_ptr[u + 1]; k++)
            sp = relax(acc, left, stack, sp, out_dst[k], tu, w_out + (Py_ssize_t)k * S, S);
        for (int32_t j = mem_ptr[u]; j < mem_ptr[u + 1]; j++, got++) {
            arr_hub[got] = mem_hub[j];
            memcpy(arr_time + got * S, tu, (size_t)S * sizeof(int64_t));
        }
    }
    top[0] = sp;
    Py_END_ALLOW_THREADS
    release(&args);
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "advance: a released hub is out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(full ? -1 : got);
fail:
    release(&args);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ the module */

static PyMethodDef methods[] = {
    {"bind", k_bind, METH_VARARGS, bind_doc},
    {"chase", k_chase, METH_VARARGS, chase_doc},
    {"walk", k_walk, METH_VARARGS, walk_doc},
    {"kahn", k_kahn, METH_VARARGS, kahn_doc},
    {"asap", k_asap, METH_VARARGS, asap_doc},
    {"layout", k_layout, METH_VARARGS, layout_doc},
    {"period", k_period, METH_VARARGS, period_doc},
    {"run", k_run, METH_VARARGS, run_doc},
    {"advance", k_advance, METH_VARARGS, advance_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "The dependency-graph engine's loops in C (see tracekit.engine).", 0, methods,
    slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModuleDef_Init(&module); }
