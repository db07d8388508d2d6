/*
 * airflow_pgcdc.pg._copyrun: take a run of like CopyData messages from a logical
 * replication stream straight from libpq, without a Python object per frame.
 *
 * The drain's hottest path is a plain transaction's Inserts of one table, one CopyData
 * message each: in Python every one costs a PQgetCopyData call, a frame object, a slice
 * and half a dozen checks and appends (about 3 us, most of the receive loop). Once the
 * drain has taken one such message the ordinary way, it asks this module for the ones
 * that follow:
 *
 *     take(pgconn, fns, oid, images, ops, insert, update, rows_left, bytes_left, overhead)
 *       -> (status, count, nbytes, payload, data_start, wal_end)
 *
 * pgconn: the PGconn* (psycopg's ``PGconn.pgconn_ptr``); fns: the addresses of libpq's
 * PQgetCopyData, PQfreemem and PQconsumeInput, resolved in the very library that made
 * the connection (airflow_pgcdc.pg.copyrun finds it). A message is taken when it is an
 * XLogData frame ('w', 24 bytes of header) whose pgoutput message is an Insert ('I') or
 * an Update ('U') of relation ``oid`` (4 bytes, network order) followed by 'N': the
 * pgoutput message (the frame without its header) is appended to ``images`` as bytes and
 * ``insert`` or ``update`` to ``ops``. It stops:
 *
 *   status 1: at the first other message, returned whole in ``payload`` (bytes: the
 *             caller parses it as any frame, nothing is lost);
 *   status 2: when ``count`` reaches ``rows_left`` or the taken messages' bytes plus
 *             ``overhead`` each reach ``bytes_left`` (the caller's chunk is full);
 *   status 0: when libpq has no whole message buffered, even after reading what the
 *             socket holds (PQconsumeInput, which never blocks here);
 *   status -1: PQgetCopyData said the copy ended; status -2: it failed (the caller
 *             collects the result and the error, as for its own reads).
 *
 * ``nbytes`` is the taken messages' bytes (their pgoutput messages), ``data_start`` and
 * ``wal_end`` those of the last taken frame (0 when none). The GIL is held throughout:
 * nothing here waits (PQgetCopyData is called in async mode).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*getcopydata_fn)(void *conn, char **buffer, int async);
typedef void (*freemem_fn)(void *ptr);
typedef int (*consumeinput_fn)(void *conn);

#define XLOG_HEADER 25 /* 'w', data start (8), WAL end (8), send time (8) */

static inline uint64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static PyObject *take(PyObject *self, PyObject *args) {
    unsigned long long conn_addr, get_addr, free_addr, consume_addr;
    Py_buffer oid;
    PyObject *images, *ops, *insert, *update;
    Py_ssize_t rows_left, bytes_left, overhead;
    if (!PyArg_ParseTuple(args, "K(KKK)y*O!O!OOnnn:take", &conn_addr, &get_addr, &free_addr, &consume_addr,
                          &oid, &PyList_Type, &images, &PyList_Type, &ops, &insert, &update, &rows_left,
                          &bytes_left, &overhead))
        return NULL;
    if (oid.len != 4 || !conn_addr || !get_addr || !free_addr || !consume_addr) {
        PyBuffer_Release(&oid);
        PyErr_SetString(PyExc_ValueError, "take: a 4-byte relation OID and non-null libpq addresses");
        return NULL;
    }
    void *conn = (void *)(uintptr_t)conn_addr;
    getcopydata_fn get = (getcopydata_fn)(uintptr_t)get_addr;
    freemem_fn pqfree = (freemem_fn)(uintptr_t)free_addr;
    consumeinput_fn consume = (consumeinput_fn)(uintptr_t)consume_addr;
    const unsigned char *want = (const unsigned char *)oid.buf;

    Py_ssize_t count = 0, nbytes = 0, budget = 0;
    unsigned long long data_start = 0, wal_end = 0;
    PyObject *payload = Py_None;
    int status = 0, consumed = 0;
    Py_INCREF(payload);
    if (rows_left <= 0 || bytes_left <= 0) {
        status = 2;
        goto out;
    }
    for (;;) {
        char *buf = NULL;
        int n = get(conn, &buf, 1);
        if (n == 0) {
            if (consumed || !consume(conn)) { /* nothing new, or a failed read: the caller's read says why */
                status = 0;
                break;
            }
            consumed = 1;
            continue;
        }
        if (n < 0) {
            status = n == -1 ? -1 : -2;
            break;
        }
        consumed = 0;
        const unsigned char *m = (const unsigned char *)buf;
        if (n >= XLOG_HEADER + 8 && m[0] == 'w' && (m[XLOG_HEADER] == 'I' || m[XLOG_HEADER] == 'U') &&
            memcmp(m + XLOG_HEADER + 1, want, 4) == 0 && m[XLOG_HEADER + 5] == 'N') {
            PyObject *image = PyBytes_FromStringAndSize(buf + XLOG_HEADER, n - XLOG_HEADER);
            int failed = image == NULL || PyList_Append(images, image) < 0 ||
                         PyList_Append(ops, m[XLOG_HEADER] == 'I' ? insert : update) < 0;
            Py_XDECREF(image);
            if (failed) {
                /* the message is lost to the caller: the error fails the window (nothing
                 * acknowledged, the server sends it again to the next drain) */
                pqfree(buf);
                Py_DECREF(payload);
                PyBuffer_Release(&oid);
                return NULL;
            }
            data_start = be64(m + 1);
            wal_end = be64(m + 9);
            count++;
            nbytes += n - XLOG_HEADER;
            budget += n - XLOG_HEADER + overhead;
            pqfree(buf);
            if (count >= rows_left || budget >= bytes_left) {
                status = 2;
                break;
            }
            continue;
        }
        Py_DECREF(payload);
        payload = PyBytes_FromStringAndSize(buf, n);
        pqfree(buf);
        if (payload == NULL) {
            PyBuffer_Release(&oid);
            return NULL;
        }
        status = 1;
        break;
    }
out:
    PyBuffer_Release(&oid);
    PyObject *result = Py_BuildValue("(innOKK)", status, count, nbytes, payload, data_start, wal_end);
    Py_DECREF(payload);
    return result;
}

static PyMethodDef methods[] = {
    {"take", take, METH_VARARGS,
     "take(pgconn, (PQgetCopyData, PQfreemem, PQconsumeInput), oid, images, ops, insert, update, rows_left, "
     "bytes_left, overhead) -> (status, count, nbytes, payload, data_start, wal_end)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "airflow_pgcdc.pg._copyrun",
    "a run of like CopyData messages of a logical replication stream, taken straight from libpq", -1, methods,
};

PyMODINIT_FUNC PyInit__copyrun(void) { return PyModule_Create(&module); }
