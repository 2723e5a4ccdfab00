/* What the Kineto batch scanner (_kineto_scan.c) offers the rest of its extension module: scanning a batch with no
 * Python object at hand and no GIL held, and turning the scan into scan()'s result later, with the GIL. */

#ifndef TRACEKIT_KINETO_SCAN_H
#define TRACEKIT_KINETO_SCAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

typedef struct Scan Scan;

/* Scan the batch data[0:len] ("[e0,e1,...]") and lay out what it found as the result's columns; needs no GIL. NULL
 * where memory ran out; else the scan, taken (*ok = 1) or declined (*ok = 0). */
Scan *scanner_run(const uint8_t *data, size_t len, int *ok);

/* With the GIL: what scan(data) returns for the batch scanned by scanner_run (ok as it set it), or NULL with an
 * exception set; module: the extension module. Frees s. */
PyObject *scanner_result(PyObject *module, Scan *s, int ok);

/* Free a scan without using it; needs no GIL. */
void scanner_free(Scan *s);

/* A 64-bit fingerprint of bytes (not cryptographic: it tells bytes read twice from a file apart where the file
 * changed in between). */
uint64_t scanner_fingerprint(const uint8_t *p, size_t n);

/* Add the Prescan type (_kineto_prescan.c) to the module; 0 on success, -1 with an exception set. */
int prescan_add_type(PyObject *module);

#endif
