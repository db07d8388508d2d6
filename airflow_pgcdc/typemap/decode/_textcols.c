/*
 * airflow_pgcdc.typemap.decode._textcols: pgoutput TupleData of a batch of messages, cut into
 * Arrow string columns in one pass over the bytes.
 *
 * The drain keeps a plain transaction's Inserts (and its Updates that carry only their
 * new row) as received and decodes a chunk of them at once
 * (airflow_pgcdc.typemap.decode.tuples.TupleDecoder.decode_raw_inserts). The pure-Python path
 * joins the messages and gathers every value's bytes with numpy fancy indexing: one
 * int64 index per byte, the largest cost of a wide row. This does the same work with
 * one memcpy per value.
 *
 *     split(messages, ncols) -> [(offsets, data, validity, null_count), ...] | None
 *
 * messages: a list of bytes, each 'I' or 'U', Int32 relation OID, 'N', Int16 column
 * count, then per column 'n' (NULL) or 't' Int32 length + that many bytes (PostgreSQL's
 * protocol "Logical Replication Message Formats", TupleData). Per column: ``offsets``
 * (n + 1 little-endian int32), ``data`` (the values' bytes end to end), ``validity``
 * (an Arrow bitmap, least significant bit first, 1 = not null; None when no value is
 * null) and the number of nulls: the buffers of an Arrow string array.
 *
 * None, and nothing else, when a message is not that simple: shorter than its header,
 * another tag, a column count other than ``ncols``, a kind other than 't' or 'n'
 * (binary values, unchanged TOAST), a length past the message's end, bytes after the
 * last column or a column over 2 GiB. The caller then decodes the messages one by one,
 * which says what is wrong. An item that is not bytes is a TypeError (the caller's
 * numpy path takes any buffer). UTF-8 is not checked here.
 *
 * No libpq, no Python objects per value; the GIL is held (the work is a memcpy per
 * value and ends in milliseconds for a chunk).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER 8 /* tag, OID (4), 'N', column count (2) */

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Walk one message's columns, adding each value's length to sizes[column] and each NULL
 * to nulls[column]. 0 when the message has exactly that shape, -1 otherwise. */
static int check_message(const unsigned char *m, Py_ssize_t len, Py_ssize_t ncols,
                         int64_t *sizes, Py_ssize_t *nulls) {
    if (len < HEADER || (m[0] != 'I' && m[0] != 'U') || m[5] != 'N')
        return -1;
    if ((Py_ssize_t)(((unsigned)m[6] << 8) | m[7]) != ncols)
        return -1;
    Py_ssize_t pos = HEADER;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        if (pos >= len)
            return -1;
        unsigned char kind = m[pos];
        if (kind == 'n') {
            nulls[c]++;
            pos += 1;
        } else if (kind == 't') {
            if (len - pos < 5)
                return -1;
            uint32_t vlen = be32(m + pos + 1);
            if (vlen > (uint32_t)INT32_MAX || (Py_ssize_t)vlen > len - pos - 5)
                return -1;
            sizes[c] += vlen;
            pos += 5 + (Py_ssize_t)vlen;
        } else {
            return -1;
        }
    }
    return pos == len ? 0 : -1;
}

static PyObject *split(PyObject *self, PyObject *args) {
    PyObject *messages;
    Py_ssize_t ncols;
    if (!PyArg_ParseTuple(args, "O!n:split", &PyList_Type, &messages, &ncols))
        return NULL;
    if (ncols < 0 || ncols > 65535) {
        PyErr_SetString(PyExc_ValueError, "ncols must be 0..65535");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(messages);
    if (n > (Py_ssize_t)INT32_MAX) {
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    int64_t *sizes = PyMem_Calloc(ncols ? ncols : 1, sizeof(int64_t));
    Py_ssize_t *nulls = PyMem_Calloc(ncols ? ncols : 1, sizeof(Py_ssize_t));
    PyObject **offsets = PyMem_Calloc(ncols ? ncols : 1, sizeof(PyObject *));
    PyObject **datas = PyMem_Calloc(ncols ? ncols : 1, sizeof(PyObject *));
    PyObject **bitmaps = PyMem_Calloc(ncols ? ncols : 1, sizeof(PyObject *));
    int32_t *at = PyMem_Calloc(ncols ? ncols : 1, sizeof(int32_t)); /* bytes written per column */
    if (!sizes || !nulls || !offsets || !datas || !bitmaps || !at) {
        PyErr_NoMemory();
        goto done;
    }
    /* pass 1: the shape of every message, each column's size and nulls */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(messages, i);
        if (!PyBytes_CheckExact(item)) {
            PyErr_Format(PyExc_TypeError, "message %zd is %.100s, not bytes", i, Py_TYPE(item)->tp_name);
            goto done;
        }
        if (check_message((const unsigned char *)PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item), ncols,
                          sizes, nulls) != 0)
            goto decline;
    }
    for (Py_ssize_t c = 0; c < ncols; c++)
        if (sizes[c] > (int64_t)INT32_MAX)
            goto decline;
    Py_ssize_t bitmap_bytes = (n + 7) / 8;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        offsets[c] = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
        datas[c] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizes[c]);
        if (!offsets[c] || !datas[c])
            goto done;
        ((int32_t *)PyBytes_AS_STRING(offsets[c]))[0] = 0;
        if (nulls[c]) {
            bitmaps[c] = PyBytes_FromStringAndSize(NULL, bitmap_bytes);
            if (!bitmaps[c])
                goto done;
            memset(PyBytes_AS_STRING(bitmaps[c]), 0, bitmap_bytes);
        }
    }
    /* pass 2: copy (the shapes were checked above) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(messages, i);
        const unsigned char *m = (const unsigned char *)PyBytes_AS_STRING(item);
        Py_ssize_t pos = HEADER;
        for (Py_ssize_t c = 0; c < ncols; c++) {
            int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets[c]);
            if (m[pos] == 't') {
                uint32_t vlen = be32(m + pos + 1);
                memcpy(PyBytes_AS_STRING(datas[c]) + at[c], m + pos + 5, vlen);
                at[c] += (int32_t)vlen;
                pos += 5 + (Py_ssize_t)vlen;
                if (bitmaps[c])
                    PyBytes_AS_STRING(bitmaps[c])[i >> 3] |= (char)(1u << (i & 7));
            } else {
                pos += 1;
            }
            off[i + 1] = at[c];
        }
    }
    result = PyList_New(ncols);
    if (!result)
        goto done;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *t = Py_BuildValue("(OOOn)", offsets[c], datas[c], bitmaps[c] ? bitmaps[c] : Py_None,
                                    nulls[c]);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, c, t);
    }
    goto done;
decline:
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t c = 0; c < ncols && offsets && datas && bitmaps; c++) {
        Py_XDECREF(offsets[c]);
        Py_XDECREF(datas[c]);
        Py_XDECREF(bitmaps[c]);
    }
    PyMem_Free(sizes);
    PyMem_Free(nulls);
    PyMem_Free(offsets);
    PyMem_Free(datas);
    PyMem_Free(bitmaps);
    PyMem_Free(at);
    return result;
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS,
     "split(messages, ncols) -> [(offsets, data, validity, null_count)] per column, or None "
     "when a message is not a simple text-format Insert/new-row Update of ncols columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "airflow_pgcdc.typemap.decode._textcols",
    "pgoutput TupleData of a batch of messages cut into Arrow string column buffers", -1, methods,
};

PyMODINIT_FUNC PyInit__textcols(void) { return PyModule_Create(&module); }
