"""The streaming state of the Horovod timeline parser (:class:`_Parser`, steps 3 to 6 of
:mod:`tracekit.parsers.horovod`): each batch decoded into columns, its B/E records paired per tensor
(vectorised; open ``B`` s carried to the next batch), op instances assigned, rank ticks collected, and the
paired events kept as output chunks while their extents are folded into per-instance arrays
(:class:`_Instances`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tracekit.model.diagnostics import Diagnostic

from ..json_stream import Batch, invalid_utf8
from .phases import _TRANSFER_PREFIXES
from .records import (
    _DAMAGE,
    _FAST,
    _GET_ARGS,
    _GET_DTYPE,
    _GET_DUR,
    _GET_NAME,
    _GET_PH,
    _GET_PID,
    _GET_SHAPE,
    _GET_TS,
    _LOOSE,
    _LOOSE_ONE,
    _MAX_TS_US,
    _NO_PID,
    _NO_TS,
    _PH_CODES,
    _PH_LOOKUP,
    _PID_TABLE_MAX,
    PH_B,
    PH_E,
    PH_I,
    PH_M,
    PH_OTHER,
    PH_X,
    _Args,
    _Codes,
    _Columns,
    _loose_args,
    _loose_int,
    _loose_ts_ns,
    _LooseRec,
    _Rec,
)

# ---------------------------------------------------------------------------------------------------
# Parser state


_MAX_I64 = np.iinfo(np.int64).max


#: an epoch header beyond this (µs, the year 2116) is damage: in ns, plus the trace's own times, it would overflow int64
MAX_EPOCH_US = (1 << 62) // 1000


class _Instances:
    """Per op instance, filled while streaming by vectorised scatters (grown by doubling)."""

    FIELDS: ClassVar[dict[str, tuple[Any, Any]]] = {
        "pid": (np.int32, -1),  # pid code
        "seq": (np.int64, -1),
        "neg_start": (np.int64, _NO_TS),
        "neg_end": (np.int64, _NO_TS),
        "op_name": (np.int32, -1),
        "op_start": (np.int64, _NO_TS),
        "op_end": (np.int64, _NO_TS),
        "op_argref": (np.int64, -1),
        "trunc": (np.bool_, False),
        "tr_start": (np.int64, _MAX_I64),
        "tr_end": (np.int64, _NO_TS),
        "n_ticks": (np.int64, 0),
        "first_tick": (np.int64, _MAX_I64),
        "last_tick": (np.int64, _NO_TS),
        "straggler": (np.int32, -1),
    }

    def __init__(self) -> None:
        self.n = 0
        self.a: dict[str, np.ndarray] = {k: np.full(1024, fill, dt) for k, (dt, fill) in self.FIELDS.items()}

    def grow(self, n: int) -> None:
        self.n = n
        cap = next(iter(self.a.values())).size
        if n <= cap:
            return
        cap = max(n, cap + cap // 2)  # x1.5: less slack than doubling, still amortised O(1)
        for k, (dt, fill) in self.FIELDS.items():
            new = np.full(cap, fill, dt)
            new[: self.a[k].size] = self.a[k]
            self.a[k] = new

    def __getitem__(self, key: str) -> np.ndarray:
        return self.a[key]

    def final(self, key: str) -> np.ndarray:
        """The filled part of a field as its own array; the field's capacity is freed right away."""
        return self.a.pop(key)[: self.n].copy()


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _grow(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    if a.size >= n:
        return a
    out = np.full(max(n, 2 * a.size), fill, dtype=a.dtype)
    out[: a.size] = a
    return out


def _group_starts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``keys``: the index of each row's group start, and the starts themselves."""
    n = keys.size
    is_start = np.ones(n, dtype=bool)
    if n:
        is_start[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(is_start)
    gidx = np.cumsum(is_start) - 1
    return starts[gidx] if n else np.empty(0, np.int64), starts


def _ffill_index(valid: np.ndarray, group_start: np.ndarray) -> np.ndarray:
    """Index of the last ``valid`` row at or before each row within its group, or -1."""
    idx = np.where(valid, np.arange(valid.size), -1)
    idx = np.maximum.accumulate(idx) if idx.size else idx
    return np.where(idx >= group_start, idx, -1)


class _Parser:
    """Streaming state: dictionaries, per-pid state, open ``B`` stacks and the accumulated output."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.names: dict[str, int] = _Codes()
        self.pids: dict[int, int] = {}  # Horovod pid -> dense code
        self.tensor: dict[int, str] = {}  # Horovod pid -> tensor name
        self.dtypes: dict[str | None, int] = _Codes()
        self.shapes: dict[str | None, int] = _Codes()
        self.arg_dtype: list[np.ndarray] = []
        self.arg_shape: list[np.ndarray] = []
        self.n_args = 0
        self.epoch_us: int | None = None
        self.order_base = 0
        self.records = 0
        self.cycles: list[np.ndarray] = []
        self.max_ts = _NO_TS
        self.diagnostics: list[Diagnostic] = []
        self.counts: dict[str, int] = {
            "e_without_b": 0, "x_without_b": 0, "no_pid": 0, "no_ts": 0, "unknown_ph": 0,
            "unknown_instants": 0, "skipped_records": 0, "bogus_dur": 0, "pair_anomalies": 0,
            "name_conflicts": 0, "header_conflicts": 0, "bad_epoch": 0, "bad_rank": 0, "repaired_utf8": 0,
        }
        self.pid_table = np.full(1024, -1, np.int64)  # Horovod pid -> code, for small pids
        # per-pid state (indexed by pid code)
        self.last0_neg = np.zeros(16, dtype=bool)
        self.cur_inst = np.full(16, -1, dtype=np.int64)
        self.seq_next = np.zeros(16, dtype=np.int64)
        # instances, and the output as chunks (one per batch) of nearly final columns
        self.inst = _Instances()
        self.n_inst = 0
        self.chunks: list[dict[str, Any]] = []
        self.tick_chunks: list[dict[str, np.ndarray]] = []
        self.comm_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.first_start = _MAX_I64
        self.last_end = _NO_TS
        self.max_rank = -1
        self._lookups: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._scratch = np.full(1024, -1, np.int64)
        # open B records carried between batches, in (pid, file order) order
        self.carry = {
            "pid": np.empty(0, np.int64), "order": np.empty(0, np.int64), "ts": np.empty(0, np.int64),
            "name": np.empty(0, np.int32), "inst": np.empty(0, np.int64),
        }

    # -- names ----------------------------------------------------------------------------------------

    def name_code(self, s: str) -> int:
        return self.names.setdefault(s, len(self.names))

    def _name_table(self) -> list[str]:
        out = [""] * len(self.names)
        for k, v in self.names.items():
            out[v] = k
        return out

    def lookups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per name code: is NEGOTIATE_*, is a transfer (comm) phase, the rank of a tick (-1: none)."""
        if self._lookups is None or self._lookups[0] != len(self.names):
            table = self._name_table()
            neg = np.fromiter((t.startswith("NEGOTIATE_") for t in table), bool, len(table))
            comm = np.fromiter((t.startswith(_TRANSFER_PREFIXES) for t in table), bool, len(table))
            rank = np.fromiter((int(t) if t.strip().isdigit() and len(t) < 10 else -1 for t in table),
                               np.int32, len(table))
            self._lookups = (len(table), neg, comm, rank)
        return self._lookups[1], self._lookups[2], self._lookups[3]

    # -- decoding -------------------------------------------------------------------------------------

    def decode(self, batch: Batch, to_input: Any) -> _Columns:
        """Columns of one batch: the typed decoder, else the lenient one, else record by record."""
        try:
            return self._columns_fast(_FAST.decode(batch.data))
        # damage (bad JSON, wrong types, invalid UTF-8, nesting deeper than the decoder's stack, integers
        # beyond int64) sends the batch the lenient way
        except (*_DAMAGE, OverflowError):
            pass
        try:
            loose = _LOOSE.decode(batch.data)
        except _DAMAGE:
            loose = []
            for i in range(len(batch)):  # only for a damaged batch: record by record
                raw = batch.element(i)
                try:
                    try:
                        loose.append(_LOOSE_ONE.decode(raw))
                    except _DAMAGE as exc:
                        if not invalid_utf8(exc):
                            raise
                        fixed = raw.decode("utf-8", "replace").encode()
                        loose.append(_LOOSE_ONE.decode(fixed))
                        self.counts["repaired_utf8"] += 1
                except _DAMAGE:
                    text = raw.strip()
                    if not text:
                        continue
                    self.counts["skipped_records"] += 1
                    if self.counts["skipped_records"] <= 5:
                        at = batch.element_offset(i) + len(raw) - len(raw.lstrip())
                        self.diagnostics.append(Diagnostic(
                            self.path, f"skipped a record that is not a JSON object: {text[:80]!r}",
                            offset=to_input(at)))
        return self._columns_loose(loose)

    def _columns_fast(self, recs: list[_Rec]) -> _Columns:
        n = len(recs)
        # C-level iteration (map, attrgetter, dict lookups that rarely miss): no Python frame per record
        ph = np.fromiter(map(_PH_LOOKUP.__getitem__, map(_GET_PH, recs)), dtype=np.int8, count=n)
        name = np.fromiter(map(self.names.__getitem__, map(_GET_NAME, recs)), dtype=np.int32, count=n)
        ts = np.fromiter(map(_GET_TS, recs), dtype=np.int64, count=n)
        pid = np.fromiter(map(_GET_PID, recs), dtype=np.int64, count=n)
        dur = np.fromiter(map(bool, map(_GET_DUR, recs)), dtype=bool, count=n)
        has_args = np.fromiter(map(bool, map(_GET_ARGS, recs)), dtype=bool, count=n)
        ai = np.flatnonzero(has_args)
        meta = {i: recs[i].args for i in ai[ph[ai] == PH_M].tolist()}
        end_idx = ai[ph[ai] == PH_E]
        ends = list(map(_GET_ARGS, map(recs.__getitem__, end_idx.tolist())))
        end_dtype = np.fromiter(map(self.dtypes.__getitem__, map(_GET_DTYPE, ends)), np.int64, len(ends))
        end_shape = np.fromiter(map(self.shapes.__getitem__, map(_GET_SHAPE, ends)), np.int64, len(ends))
        ok = ts != _NO_TS
        big = ok & (np.abs(np.where(ok, ts, 0)) > _MAX_TS_US)
        ts = np.where(ok & ~big, ts * 1000, _NO_TS)
        return _Columns(ph, name, ts, pid, dur, meta, end_idx, end_dtype, end_shape)  # type: ignore[arg-type]

    def _columns_loose(self, recs: list[_LooseRec]) -> _Columns:
        n = len(recs)
        ph = np.empty(n, np.int8)
        name = np.empty(n, np.int32)
        ts = np.empty(n, np.int64)
        pid = np.empty(n, np.int64)
        dur = np.zeros(n, bool)
        meta: dict[int, _Args] = {}
        end_idx: list[int] = []
        end_dtype: list[int] = []
        end_shape: list[int] = []
        for i, r in enumerate(recs):
            ph[i] = _PH_CODES.get(r.ph, PH_OTHER) if isinstance(r.ph, str) else PH_OTHER
            name[i] = self.name_code("" if r.name is None else str(r.name))
            ts[i] = _loose_ts_ns(r.ts)
            p = _loose_int(r.pid)
            pid[i] = _NO_PID if p is None or not -(1 << 62) < p < (1 << 62) else p
            d = r.dur
            dur[i] = d is not None and d != 0 and d != 0.0
            a = _loose_args(r.args)
            if a is None:
                continue
            if ph[i] == PH_M:
                meta[i] = a
            elif ph[i] == PH_E:
                end_idx.append(i)
                end_dtype.append(self.dtypes.setdefault(a.dtype, len(self.dtypes)))
                end_shape.append(self.shapes.setdefault(a.shape, len(self.shapes)))
        return _Columns(ph, name, ts, pid, dur, meta, np.asarray(end_idx, np.int64),
                        np.asarray(end_dtype, np.int64), np.asarray(end_shape, np.int64))

    # -- one batch ------------------------------------------------------------------------------------

    def feed(self, c: _Columns) -> None:
        n = c.ph.size
        order = self.order_base + np.arange(n, dtype=np.int64)
        self.order_base += n
        self.records += n
        self._metadata(c)
        argref = self._end_args(c)

        ph = c.ph
        cyc_code = self.names.get("CYCLE_START")
        inst_mask = ph == PH_I
        if inst_mask.any():
            is_cycle = inst_mask & (c.name == cyc_code) & (c.ts != _NO_TS)
            self.cycles.append(c.ts[is_cycle])
            self.counts["unknown_instants"] += int((inst_mask & ~is_cycle).sum())
        self.counts["unknown_ph"] += int((ph == PH_OTHER).sum())

        bex = ph <= PH_X
        no_ts = bex & (c.ts == _NO_TS)
        no_pid = bex & ~no_ts & (c.pid == _NO_PID)
        self.counts["no_ts"] += int(no_ts.sum())
        self.counts["no_pid"] += int(no_pid.sum())
        keep = np.flatnonzero(bex & ~no_ts & ~no_pid)
        if keep.size:
            ts = c.ts[keep]
            self.max_ts = max(self.max_ts, int(ts.max()))
            self._pair(self._pid_codes(c.pid[keep]), order[keep], ts, ph[keep], c.name[keep],
                       argref[keep], c.dur_nonzero[keep])

    def _metadata(self, c: _Columns) -> None:
        """Tensor names and the epoch header from ``M`` records (one per tensor: a Python loop is fine)."""
        for i, a in c.meta.items():
            if a.start_time_since_epoch_in_micros is not None:
                if not 0 <= a.start_time_since_epoch_in_micros < MAX_EPOCH_US:  # damaged: ns overflow int64
                    self.counts["bad_epoch"] += 1
                elif self.epoch_us is None:
                    self.epoch_us = a.start_time_since_epoch_in_micros
                elif self.epoch_us != a.start_time_since_epoch_in_micros:
                    self.counts["header_conflicts"] += 1
                continue
            pid = int(c.pid[i])
            if a.name is None or pid == _NO_PID:
                continue
            old = self.tensor.get(pid)
            if old is None:
                self.tensor[pid] = a.name
            elif old != a.name:
                self.counts["name_conflicts"] += 1

    def _end_args(self, c: _Columns) -> np.ndarray:
        """Per record: index into (arg_dtype, arg_shape) for an ``E`` carrying dtype/shape, else -1."""
        ref = np.full(c.ph.size, -1, dtype=np.int64)
        ref[c.end_idx] = self.n_args + np.arange(c.end_idx.size)
        self.n_args += c.end_idx.size
        self.arg_dtype.append(c.end_dtype)
        self.arg_shape.append(c.end_shape)
        return ref

    def _pid_codes(self, pids: np.ndarray) -> np.ndarray:
        """Dense codes of Horovod pids (small integers: a lookup array; anything else: np.unique)."""
        lo, hi = (int(pids.min()), int(pids.max())) if pids.size else (0, 0)
        if lo >= 0 and hi < _PID_TABLE_MAX:
            if hi >= self.pid_table.size:
                self.pid_table = _grow(self.pid_table, hi + 1, -1)
            codes = self.pid_table[pids]
            missing = codes < 0
            if missing.any():
                for q in np.unique(pids[missing]).tolist():
                    self.pid_table[q] = self.pids.setdefault(q, len(self.pids))
                codes = self.pid_table[pids]
        else:
            uniq, inv = np.unique(pids, return_inverse=True)
            codes = np.fromiter((self.pids.setdefault(int(q), len(self.pids)) for q in uniq), dtype=np.int64,
                                count=uniq.size)[inv]
        p = len(self.pids)
        self.last0_neg = _grow(self.last0_neg, p, False)
        self.cur_inst = _grow(self.cur_inst, p, -1)
        self.seq_next = _grow(self.seq_next, p, 0)
        return codes

    def _pair(self, pidc: np.ndarray, order: np.ndarray, ts: np.ndarray, ph: np.ndarray, name: np.ndarray,
              argref: np.ndarray, dur: np.ndarray) -> None:
        """Pair B/E per pid (vectorised), assign op instances, collect ticks; carry open Bs."""
        cr = self.carry
        k = cr["pid"].size
        pidc = np.concatenate([cr["pid"], pidc])
        order = np.concatenate([cr["order"], order])
        ts = np.concatenate([cr["ts"], ts])
        ph = np.concatenate([np.full(k, PH_B, np.int8), ph])
        name = np.concatenate([cr["name"], name])
        argref = np.concatenate([np.full(k, -1, np.int64), argref])
        dur = np.concatenate([np.zeros(k, bool), dur])
        carried_inst = np.concatenate([cr["inst"], np.full(pidc.size - k, -1, np.int64)])

        # group by pid, keeping file order (carried Bs come first in each pid: they are older)
        perm = np.argsort(pidc, kind="stable")
        pidc, order, ts, ph, name = pidc[perm], order[perm], ts[perm], ph[perm], name[perm]
        argref, dur, carried_inst = argref[perm], dur[perm], carried_inst[perm]
        carried = carried_inst >= 0
        n = pidc.size
        gstart, starts = _group_starts(pidc)
        gidx = np.cumsum(np.r_[True, pidc[1:] != pidc[:-1]]) - 1 if n else np.empty(0, np.int64)

        is_b, is_e, is_x = ph == PH_B, ph == PH_E, ph == PH_X
        step = is_b.astype(np.int64) - is_e.astype(np.int64)
        s = np.cumsum(step)
        s_g = s - (s[gstart] - step[gstart])  # depth walk per pid, from 0
        big = 2 * n + 2
        runmin = np.minimum.accumulate(s_g - gidx * big) + gidx * big
        depth = s_g - np.minimum(runmin, 0)  # reflected at 0: E without B leaves depth at 0
        before = np.empty(n, np.int64)
        if n:
            before[1:] = depth[:-1]
            before[starts] = 0
        e_ok = is_e & (before > 0)
        self.counts["e_without_b"] += int((is_e & ~e_ok).sum())
        level = np.where(is_e, before - 1, before)

        # match each E with the previous B at the same (pid, level)
        cand = np.flatnonzero(is_b | e_ok)
        lev = level[cand]
        k2 = gidx[cand] * (int(lev.max()) + 1 if lev.size else 1) + lev
        cperm = cand[np.argsort(k2, kind="stable")]
        k2s = np.sort(k2, kind="stable")
        pos_e = np.flatnonzero(e_ok[cperm])
        good = pos_e > 0
        good[good] = (k2s[pos_e[good] - 1] == k2s[pos_e[good]]) & is_b[cperm[pos_e[good] - 1]]
        self.counts["pair_anomalies"] += int((~good).sum())
        e_rows = cperm[pos_e[good]]
        b_rows = cperm[pos_e[good] - 1]
        closed = np.zeros(n, bool)
        closed[b_rows] = True
        open_b = is_b & ~closed

        # op instances: walk the level-0 Bs of each pid (new ones only; state covers carried ones)
        neg_mask, _, _ = self.lookups()
        l0_all = is_b & (level == 0)
        l0 = np.flatnonzero(l0_all & ~carried)
        inst = carried_inst.copy()
        if l0.size:
            p0 = pidc[l0]
            first = np.r_[True, p0[1:] != p0[:-1]]
            is_neg = neg_mask[name[l0]]
            prev_neg = np.empty(l0.size, bool)
            prev_neg[1:] = is_neg[:-1]
            prev_neg[first] = self.last0_neg[p0[first]]
            new = is_neg | ~prev_neg
            # instance ids in file order of their first record
            new_rows = l0[new]
            ranks = np.empty(new_rows.size, np.int64)
            ranks[np.argsort(order[new_rows], kind="stable")] = np.arange(new_rows.size)
            vals = np.full(l0.size, -1, np.int64)
            vals[new] = self.n_inst + ranks
            seed = first & ~new
            vals[seed] = self.cur_inst[p0[seed]]
            fi = np.maximum.accumulate(np.where(vals >= 0, np.arange(l0.size), 0))
            inst[l0] = vals[fi]
            # per-pid repetition index of each new instance
            cnew = np.cumsum(new)
            gfirst = np.flatnonzero(first)
            before_group = np.repeat(cnew[gfirst] - new[gfirst], np.diff(np.r_[gfirst, l0.size]))
            seq = self.seq_next[p0] + (cnew - before_group) - 1
            gids = self.n_inst + ranks
            self.n_inst += new_rows.size
            self.inst.grow(self.n_inst)
            self.inst["pid"][gids] = p0[new]
            self.inst["seq"][gids] = seq[new]
            last = np.r_[gfirst[1:] - 1, l0.size - 1]
            lp = p0[last]
            self.last0_neg[lp] = is_neg[last]
            self.cur_inst[lp] = inst[l0[last]]
            self.seq_next[lp] += cnew[last] - before_group[last]
        # every other row takes the instance of its enclosing level-0 B
        enc = _ffill_index(l0_all, gstart)
        enc_inst = np.where(enc >= 0, inst[np.maximum(enc, 0)], -1)
        enc_neg = np.where(enc >= 0, neg_mask[name[np.maximum(enc, 0)]], False)
        b_inst = np.where(l0_all, inst, enc_inst)

        self._emit(pidc[b_rows], name[b_rows], level[b_rows] == 0, ts[b_rows], ts[e_rows], b_inst[b_rows],
                   argref[e_rows], truncated=False)
        x = np.flatnonzero(is_x)
        if x.size:
            inside = (before[x] >= 1) & enc_neg[x]
            self.counts["x_without_b"] += int((~inside).sum())
            self.counts["bogus_dur"] += int(dur[x].sum())
            self._emit_ticks(pidc[x], np.where(inside, enc_inst[x], -1), name[x], ts[x], dur[x])

        ob = np.flatnonzero(open_b)
        self.carry = {"pid": pidc[ob], "order": order[ob], "ts": ts[ob], "name": name[ob],
                      "inst": b_inst[ob]}

    def close_dangling(self) -> int:
        """Close the Bs still open at the end at the last event ts, flagged truncated."""
        cr = self.carry
        n = cr["pid"].size
        if not n:
            return 0
        _, starts = _group_starts(cr["pid"])
        level = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        self._emit(cr["pid"], cr["name"], level == 0, cr["ts"], np.full(n, self.max_ts, np.int64),
                   cr["inst"], np.full(n, -1, np.int64), truncated=True)
        return n

    def _emit(self, pidc: np.ndarray, name: np.ndarray, level0: np.ndarray, start: np.ndarray,
              end: np.ndarray, inst: np.ndarray, argref: np.ndarray, *, truncated: bool) -> None:
        """Keep a batch of paired events as an output chunk and fold them into their instances."""
        if not pidc.size:
            return
        neg_mask, comm_mask, _ = self.lookups()
        st = self.inst
        ok = inst >= 0
        is_neg = neg_mask[name]
        neg0 = level0 & is_neg & ok
        top = level0 & ~is_neg
        topi = top & ok
        st["neg_start"][inst[neg0]] = start[neg0]
        st["neg_end"][inst[neg0]] = end[neg0]
        st["op_name"][inst[topi]] = name[topi]
        st["op_start"][inst[topi]] = start[topi]
        st["op_end"][inst[topi]] = end[topi]
        st["op_argref"][inst[topi]] = argref[topi]
        comm = comm_mask[name] & ok
        if comm.any():
            np.minimum.at(st["tr_start"], inst[comm], start[comm])
            np.maximum.at(st["tr_end"], inst[comm], end[comm])
            self.comm_parts.append((inst[comm].astype(np.int64), start[comm], end[comm]))
        if truncated:
            st["trunc"][inst[ok]] = True
        self.first_start = min(self.first_start, int(start.min()))
        self.last_end = max(self.last_end, int(end.max()))
        o = np.argsort(start, kind="stable")  # each chunk in time order
        self.chunks.append({"pid": pidc[o].astype(np.int32), "name": name[o], "start": start[o],
                            "dur": (end - start)[o], "inst": inst[o].astype(np.int32), "top": top[o],
                            "truncated": truncated})

    def _emit_ticks(self, pidc: np.ndarray, inst: np.ndarray, name: np.ndarray, ts: np.ndarray,
                    dur: np.ndarray) -> None:
        """Keep a batch of rank ticks (those named by a rank) and fold them into their instances."""
        _, _, rank_tab = self.lookups()
        rank = rank_tab[name]
        valid = rank >= 0
        self.counts["bad_rank"] += int(valid.size - np.count_nonzero(valid))
        if not valid.all():
            pidc, inst, rank, ts, dur = pidc[valid], inst[valid], rank[valid], ts[valid], dur[valid]
        if not rank.size:
            return
        self.max_rank = max(self.max_rank, int(rank.max()))
        self.tick_chunks.append({"pid": pidc.astype(np.int32), "inst": inst.astype(np.int64), "rank": rank,
                                 "ts": ts, "dur": dur})
        inside = inst >= 0
        if not inside.any():
            return
        st = self.inst
        gi, t, r = inst[inside], ts[inside], rank[inside]
        np.add.at(st["n_ticks"], gi, 1)
        np.minimum.at(st["first_tick"], gi, t)
        np.maximum.at(st["last_tick"], gi, t)
        # the straggler ticked last; on equal ts the later record wins (ticks of one pid are in file order
        # here, and this batch comes after the earlier ones, so the largest index among the ties)
        cand = np.flatnonzero(t == st["last_tick"][gi])
        best = self.scratch(st.n)
        best[gi[cand]] = -1
        np.maximum.at(best, gi[cand], cand)
        win = cand[best[gi[cand]] == cand]
        st["straggler"][gi[win]] = r[win]

    def scratch(self, n: int) -> np.ndarray:
        """A reusable int64 array of at least ``n`` entries (callers reset what they use)."""
        if self._scratch.size < n:
            self._scratch = np.full(max(n, 2 * self._scratch.size), -1, np.int64)
        return self._scratch
