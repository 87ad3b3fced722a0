/* RecordBuilder's layout and the C entry point other extensions use to append to one.
 *
 * _records.c defines the type; client/_append.c (the producer's fast path) appends records
 * without a Python call per record. It gets the entry point from the capsule
 * oncelog.protocol._records.CAPI, the usual way CPython extensions share C functions.
 */
#ifndef ONCELOG_RECORD_BUILDER_H
#define ONCELOG_RECORD_BUILDER_H

#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    unsigned char *data;    /* room for the batch header, then the records */
    Py_ssize_t size, capacity;
    int ready;              /* __init__ ran */
    Py_ssize_t count;
    long long base_ts, max_ts;  /* long long: what T_LONGLONG members read */
    int64_t *timestamps;    /* each record's, for the metadata its future reports */
    Py_ssize_t allocated;
    /* The producer's bookkeeping for the batch being filled, here so that its fast path
     * reads and writes it without attribute lookups: */
    char closed;            /* takes no more records */
    Py_ssize_t accounted;   /* bytes buffer.memory counts for the batch */
} RecordBuilder;

#define RECORD_BUILDER_CAPI_NAME "oncelog.protocol._records.CAPI"

typedef struct {
    PyTypeObject *builder_type;
    /* Append a record without headers (timestamp: None for now, or an int; key and value:
     * bytes or None); its index, or -1 with an error set. */
    Py_ssize_t (*append)(RecordBuilder *builder, PyObject *timestamp, PyObject *key,
                         PyObject *value);
    /* The same with the key and value as pointer and length (a length of -1: null). */
    Py_ssize_t (*append_raw)(RecordBuilder *builder, PyObject *timestamp, const char *key,
                             Py_ssize_t key_len, const char *value, Py_ssize_t value_len);
} RecordBuilderCAPI;

#endif
