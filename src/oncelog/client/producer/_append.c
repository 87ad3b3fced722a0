/* The producer's fast path: produce() appending a record to its partition's open batch in
 * one C call, without the accumulator's lock.
 *
 * Optional, as _records.c: accumulator.py works without it (PyOpenBatches, whose append
 * always answers "take the slow path"), and tests/test_append_fastpath.py holds a producer
 * with it to the same batches, partitions and accounting as one without.
 *
 * Why it is safe without the lock: under the GIL a C function runs whole, no other Python
 * thread runs until it returns, as long as it runs no Python code and does not release the
 * GIL. OpenBatches.append allocates what the garbage collector tracks (the future, the
 * callback's entry) first, since a collection can run finalisers, which are Python code;
 * then it checks and changes everything it touches (the builder's records, its closed flag
 * and accounted bytes, the buffered total, the sticky partition's byte count, the batch's
 * callbacks) without running any. Everything else that changes those does so in one C call
 * too (set, reserve, release, a member store such as builder.closed = True, a list append),
 * and the accumulator's Python path closes the batch to this one while it works on it.
 *
 * It appends only in the common case and answers None for everything else, which the
 * Python path (accumulator.py, producer.py) then does under the lock: a batch to close or
 * create, a full buffer, headers, keys or values that are not bytes, a sticky partition due
 * to move on, a topic whose partitions are not known yet, deterministic batching, a closed
 * producer. The rules stay in Python; this only repeats the "fits, append" case of them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "record_builder.h"

/* Estimated bytes a record adds beyond key and value (accumulator.py's _RECORD_OVERHEAD). */
#define RECORD_OVERHEAD 12

static RecordBuilderCAPI *builders;

/* --- murmur2, as Java's Utils.murmur2 (partitioner.py has the Python twin) ---------------- */

static int32_t
murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5BD1E995;
    uint32_t h = 0x9747B28CU ^ (uint32_t)length;
    Py_ssize_t end = length - length % 4;
    for (Py_ssize_t i = 0; i < end; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8
            | (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)data[end + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[end + 1] << 8;
        /* fall through */
    case 1:
        h ^= data[end];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

static PyObject *
py_murmur2(PyObject *module, PyObject *data)
{
    (void)module;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "murmur2(data: bytes)");
        return NULL;
    }
    return PyLong_FromLong(murmur2((const unsigned char *)PyBytes_AS_STRING(data),
                                   PyBytes_GET_SIZE(data)));
}

/* --- FutureBase: what a RecordFuture holds, so that C can make one ------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *batch;
    Py_ssize_t index;
} FutureBase;

static PyObject *
future_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *batch;
    Py_ssize_t index;
    static char *names[] = {"batch", "index", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On", names, &batch, &index))
        return NULL;
    FutureBase *self = (FutureBase *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(batch);
    self->batch = batch;
    self->index = index;
    return (PyObject *)self;
}

static int
future_traverse(FutureBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch);
    return 0;
}

static int
future_clear(FutureBase *self)
{
    Py_CLEAR(self->batch);
    return 0;
}

/* RecordFuture, a Python subclass, is what gets made; its own dealloc drops the reference to
 * its type after calling this one. */
static void
future_dealloc(FutureBase *self)
{
    PyObject_GC_UnTrack(self);
    future_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef future_members[] = {
    {"_batch", T_OBJECT_EX, offsetof(FutureBase, batch), READONLY, "the record's batch"},
    {"_index", T_PYSSIZET, offsetof(FutureBase, index), READONLY,
     "the record's index in its batch"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FutureBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "oncelog.client.producer._append.FutureBase",
    .tp_doc = PyDoc_STR("FutureBase(batch, index): RecordFuture's fields."),
    .tp_basicsize = sizeof(FutureBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = future_new,
    .tp_traverse = (traverseproc)future_traverse,
    .tp_clear = (inquiry)future_clear,
    .tp_dealloc = (destructor)future_dealloc,
    .tp_members = future_members,
};

/* --- OpenBatches ------------------------------------------------------------------------ */

enum { PARTITION_BY_PYTHON, PARTITION_MURMUR2_RANDOM, PARTITION_MURMUR2 };

/* An open batch's entry: the batch, its RecordBuilder, and its list of (index, callback). */
enum { ENTRY_BATCH, ENTRY_BUILDER, ENTRY_CALLBACKS };

typedef struct {
    PyObject_HEAD
    PyObject *open;             /* {topic: [entry or None per partition]} */
    PyObject *partition_counts; /* {topic: partitions}, the sender's, kept current by it */
    PyObject *sticky;           /* {topic: [partition, bytes]}, the producer's */
    PyTypeObject *future_type;  /* RecordFuture, a FutureBase without fields of its own */
    Py_ssize_t buffered, buffer_memory, batch_size, batch_records, record_limit;
    int partitioner;
    char enabled;
} OpenBatches;

static int
open_init(OpenBatches *self, PyObject *args, PyObject *kwargs)
{
    PyObject *partition_counts, *sticky;
    PyTypeObject *future_type;
    static char *names[] = {"partition_counts", "sticky", "future_type", "batch_size",
                            "batch_records", "buffer_memory", "record_limit", "partitioner",
                            NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!nnnni", names,
                                     &PyDict_Type, &partition_counts, &PyDict_Type, &sticky,
                                     &PyType_Type, &future_type,
                                     &self->batch_size, &self->batch_records,
                                     &self->buffer_memory, &self->record_limit,
                                     &self->partitioner))
        return -1;
    if (!PyType_IsSubtype(future_type, &FutureBaseType)
            || future_type->tp_basicsize != FutureBaseType.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError,
                        "future_type must subclass FutureBase and add no fields (__slots__ = ())");
        return -1;
    }
    PyObject *open = PyDict_New();
    if (open == NULL)
        return -1;
    Py_XSETREF(self->open, open);
    Py_INCREF(partition_counts);
    Py_XSETREF(self->partition_counts, partition_counts);
    Py_INCREF(sticky);
    Py_XSETREF(self->sticky, sticky);
    Py_INCREF(future_type);
    Py_XSETREF(self->future_type, future_type);
    self->buffered = 0;
    self->enabled = 1;
    return 0;
}

static int
open_traverse(OpenBatches *self, visitproc visit, void *arg)
{
    Py_VISIT(self->open);
    Py_VISIT(self->partition_counts);
    Py_VISIT(self->sticky);
    Py_VISIT(self->future_type);
    return 0;
}

static int
open_clear(OpenBatches *self)
{
    Py_CLEAR(self->open);
    Py_CLEAR(self->partition_counts);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->future_type);
    return 0;
}

static void
open_dealloc(OpenBatches *self)
{
    PyObject_GC_UnTrack(self);
    open_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Python int that fits a Py_ssize_t, into *out; 0 for anything else (no error left). */
static int
small_int(PyObject *obj, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(obj))
        return 0;
    Py_ssize_t value = PyLong_AsSsize_t(obj);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = value;
    return 1;
}

/* The topic's partition count, when known (-1 otherwise: the Python path learns it). */
static int
topic_partitions(OpenBatches *self, PyObject *topic, Py_ssize_t *count)
{
    PyObject *count_obj = PyDict_GetItemWithError(self->partition_counts, topic);
    return count_obj != NULL && small_int(count_obj, count) && *count > 0 ? 0 : -1;
}

/* The partition of a record produce() names none for (key: key_len bytes, -1 for none), as
 * producer.py's choose_partition: murmur2 of the key, or a keyless record's sticky
 * partition while it has room. 0 with *partition set (and, for a keyless record, the
 * topic's [partition, bytes] list and its bytes); -1 when the Python path must choose. */
static int
choose_partition(OpenBatches *self, PyObject *topic, Py_ssize_t count, const char *key,
                 Py_ssize_t key_len, Py_ssize_t size, Py_ssize_t *partition,
                 PyObject **sticky_state, Py_ssize_t *sticky_bytes)
{
    if (self->partitioner == PARTITION_BY_PYTHON)
        return -1;
    if (key_len >= 0 || self->partitioner == PARTITION_MURMUR2) {
        *partition = (Py_ssize_t)((uint32_t)murmur2((const unsigned char *)(key ? key : ""),
                                                    key_len > 0 ? key_len : 0)
                                  & 0x7FFFFFFF) % count;
        return 0;
    }
    /* Keyless: stay on the sticky partition; moving on is the Python path's. */
    PyObject *state = PyDict_GetItemWithError(self->sticky, topic);
    if (state == NULL || !PyList_CheckExact(state) || PyList_GET_SIZE(state) != 2
            || !small_int(PyList_GET_ITEM(state, 0), partition)
            || !small_int(PyList_GET_ITEM(state, 1), sticky_bytes)
            || *partition < 0 || *partition >= count
            || *sticky_bytes + size >= self->batch_size)
        return -1;
    *sticky_state = state;
    return 0;
}

/* The (batch, builder, callbacks) entry of the partition's open batch when a record of
 * ``accounted`` bytes fits in it; NULL (maybe with an error set) for the Python path. */
static PyObject *
open_entry(OpenBatches *self, PyObject *topic, Py_ssize_t partition, Py_ssize_t accounted)
{
    PyObject *partitions = PyDict_GetItemWithError(self->open, topic), *entry;
    if (partitions == NULL || partition >= PyList_GET_SIZE(partitions)
            || (entry = PyList_GET_ITEM(partitions, partition)) == Py_None)
        return NULL;
    RecordBuilder *builder = (RecordBuilder *)PyTuple_GET_ITEM(entry, ENTRY_BUILDER);
    if (builder->closed || builder->count >= self->batch_records
            || builder->size + accounted > self->batch_size)
        return NULL;
    return entry;
}

/* append(topic, value, key, partition, headers, timestamp, on_delivery) -> RecordFuture, or
 * None when the Python path must do it. */
static PyObject *
open_append(OpenBatches *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append(topic, value, key, partition, headers, "
                        "timestamp, on_delivery)");
        return NULL;
    }
    PyObject *topic = args[0], *value = args[1], *key = args[2], *partition_obj = args[3];
    PyObject *timestamp = args[5], *on_delivery = args[6];
    if (!self->enabled || self->open == NULL || args[4] != Py_None
            || !PyUnicode_CheckExact(topic)
            || (key != Py_None && !PyBytes_CheckExact(key))
            || (value != Py_None && !PyBytes_CheckExact(value))
            || (timestamp != Py_None && !PyLong_CheckExact(timestamp)))
        Py_RETURN_NONE;
    Py_ssize_t size = (key == Py_None ? 0 : PyBytes_GET_SIZE(key))
        + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
    if (size > self->record_limit || self->buffered >= self->buffer_memory)
        Py_RETURN_NONE;
    /* What the garbage collector tracks, allocated before anything is read (see the top). */
    FutureBase *future = (FutureBase *)self->future_type->tp_alloc(self->future_type, 0);
    if (future == NULL)
        return NULL;
    PyObject *callback = NULL;
    if (on_delivery != Py_None) {
        if ((callback = PyTuple_New(2)) == NULL) {
            Py_DECREF(future);
            return NULL;
        }
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(callback, 0, Py_None);  /* the index, once known */
        Py_INCREF(on_delivery);
        PyTuple_SET_ITEM(callback, 1, on_delivery);
    }
    /* From here to the record being in, no Python code runs: the references below may be
     * borrowed, and nothing else changes what is read. (The dictionaries' keys are plain
     * str, producer.py's topic_name, whose comparisons run no Python code either.) */
    Py_ssize_t count, partition, sticky_bytes = 0;
    PyObject *sticky_state = NULL, *entry;
    if (topic_partitions(self, topic, &count) < 0)
        goto python_path;
    if (partition_obj != Py_None) {
        if (!small_int(partition_obj, &partition) || partition < 0 || partition >= count)
            goto python_path;
    } else if (choose_partition(self, topic, count,
                                key == Py_None ? NULL : PyBytes_AS_STRING(key),
                                key == Py_None ? -1 : PyBytes_GET_SIZE(key), size,
                                &partition, &sticky_state, &sticky_bytes) < 0) {
        goto python_path;
    }
    Py_ssize_t accounted = size + RECORD_OVERHEAD;
    if ((entry = open_entry(self, topic, partition, accounted)) == NULL)
        goto python_path;
    PyObject *batch = PyTuple_GET_ITEM(entry, ENTRY_BATCH);
    RecordBuilder *builder = (RecordBuilder *)PyTuple_GET_ITEM(entry, ENTRY_BUILDER);
    PyObject *callbacks = PyTuple_GET_ITEM(entry, ENTRY_CALLBACKS);
    PyObject *new_sticky_bytes = NULL, *index_obj = NULL;
    /* Neither is tracked by the collector; made before the record goes in, so that nothing
     * fails once it is. */
    if ((sticky_state != NULL
            && (new_sticky_bytes = PyLong_FromSsize_t(sticky_bytes + size)) == NULL)
            || (callback != NULL && (index_obj = PyLong_FromSsize_t(builder->count)) == NULL))
        goto error;
    if (callback != NULL && PyList_Append(callbacks, callback) < 0)
        goto error;
    Py_ssize_t index = builders->append(builder, timestamp, key, value);
    if (index < 0) {
        if (callback != NULL)  /* appended just above: take it back */
            PyList_SetSlice(callbacks, PyList_GET_SIZE(callbacks) - 1,
                            PyList_GET_SIZE(callbacks), NULL);
        goto error;
    }
    builder->accounted += accounted;
    self->buffered += accounted;
    if (sticky_state != NULL)
        PyList_SetItem(sticky_state, 1, new_sticky_bytes);  /* steals; an int, no finaliser */
    if (callback != NULL) {
        /* The batch is open, so not done: its callbacks run later, from the sender. */
        Py_SETREF(((PyTupleObject *)callback)->ob_item[0], index_obj);
        Py_DECREF(callback);
    }
    Py_INCREF(batch);
    future->batch = batch;
    future->index = index;
    return (PyObject *)future;

python_path:
    Py_DECREF(future);
    Py_XDECREF(callback);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
error:
    Py_XDECREF(new_sticky_bytes);
    Py_XDECREF(index_obj);
    Py_DECREF(future);
    Py_XDECREF(callback);
    return NULL;
}

/* --- append_many: rows of columns in Arrow's layout, without a Python call per row ------ */

/* A column as Arrow lays one out: a validity bitmap (None: no nulls), then for binary and
 * string columns 32-bit offsets and the data, for an int32 column the values; ``offset`` is
 * the column's first row in them (a slice's). */
typedef struct {
    Py_buffer validity, offsets, data;
    int has_validity, has_data;
    Py_ssize_t offset;
} Column;

static void
column_release(Column *c)
{
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    if (c->has_data)
        PyBuffer_Release(&c->data);
    if (c->offsets.obj != NULL)
        PyBuffer_Release(&c->offsets);
}

/* (validity or None, offsets, data, offset) for a binary column, (validity or None, values,
 * offset) for an int32 one (binary = 0), holding ``stop`` rows; 0, or -1 with an error set
 * (and nothing left to release). */
static int
column_open(PyObject *spec, int binary, Py_ssize_t stop, Column *c)
{
    memset(c, 0, sizeof(*c));
    Py_ssize_t n = binary ? 4 : 3;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != n
            || !small_int(PyTuple_GET_ITEM(spec, n - 1), &c->offset) || c->offset < 0) {
        PyErr_Format(PyExc_TypeError, "a column is (validity or None, %s, offset)",
                     binary ? "offsets, data" : "values");
        return -1;
    }
    PyObject *validity = PyTuple_GET_ITEM(spec, 0);
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0)
            return -1;
        c->has_validity = 1;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(spec, 1), &c->offsets, PyBUF_SIMPLE) < 0)
        goto fail;
    if (binary) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(spec, 2), &c->data, PyBUF_SIMPLE) < 0)
            goto fail;
        c->has_data = 1;
    }
    /* Every row up to ``stop`` must be in the buffers (offsets: one more than the rows). */
    Py_ssize_t rows = c->offset + stop;
    if ((c->has_validity && c->validity.len * 8 < rows)
            || c->offsets.len / 4 < rows + (binary ? 1 : 0)) {
        PyErr_SetString(PyExc_ValueError, "a column's buffers hold fewer rows than asked for");
        goto fail;
    }
    return 0;
fail:
    column_release(c);
    return -1;
}

static int
column_null(const Column *c, Py_ssize_t row)
{
    Py_ssize_t bit = c->offset + row;
    return c->has_validity
        && !(((const unsigned char *)c->validity.buf)[bit >> 3] & (1 << (bit & 7)));
}

/* A binary column's row as pointer and length (-1: null); -1 with an error set when its
 * offsets leave the data. */
static int
column_bytes(const Column *c, Py_ssize_t row, const char **ptr, Py_ssize_t *len)
{
    if (column_null(c, row)) {
        *ptr = NULL;
        *len = -1;
        return 0;
    }
    const int32_t *offsets = (const int32_t *)c->offsets.buf + c->offset + row;
    int32_t start = offsets[0], end = offsets[1];
    if (start < 0 || end < start || end > c->data.len) {
        PyErr_SetString(PyExc_ValueError, "a column's offsets point outside its data");
        return -1;
    }
    *ptr = (const char *)c->data.buf + start;
    *len = end - start;
    return 0;
}

/* append_many(topic, start, stop, values, keys, partitions) -> the first row not appended.
 * Rows start..stop-1 of binary columns ``values`` and ``keys`` (None: no keys) and of the
 * int32 column ``partitions`` (None, or null in a row: the partitioner's choice) go into
 * their partitions' open batches, as one append() each would, until one cannot (a batch to
 * close or open, a full buffer, a topic or partition not known, a sticky partition to move
 * on): the caller produces that row through the Python path, and calls again after it.
 * Records appended here have no future: a flush reports their delivery errors. */
static PyObject *
open_append_many(OpenBatches *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t start, stop;
    if (nargs != 6 || !PyUnicode_CheckExact(args[0]) || !small_int(args[1], &start)
            || !small_int(args[2], &stop) || start < 0 || stop < start) {
        PyErr_SetString(PyExc_TypeError, "append_many(topic: str, start, stop, values, keys, "
                        "partitions)");
        return NULL;
    }
    PyObject *topic = args[0];
    Column values, keys, partitions;
    int has_keys = args[4] != Py_None, has_partitions = args[5] != Py_None;
    if (column_open(args[3], 1, stop, &values) < 0)
        return NULL;
    if (has_keys && column_open(args[4], 1, stop, &keys) < 0) {
        column_release(&values);
        return NULL;
    }
    if (has_partitions && column_open(args[5], 0, stop, &partitions) < 0) {
        column_release(&values);
        if (has_keys)
            column_release(&keys);
        return NULL;
    }
    /* As in append: no Python code runs in this loop, so it is whole under the GIL. */
    Py_ssize_t row = start, count;
    if (!self->enabled || self->open == NULL || topic_partitions(self, topic, &count) < 0)
        goto done;
    for (; row < stop; row++) {
        const char *key = NULL, *value;
        Py_ssize_t key_len = -1, value_len, partition, sticky_bytes = 0;
        PyObject *sticky_state = NULL, *entry, *new_sticky_bytes = NULL;
        if (column_bytes(&values, row, &value, &value_len) < 0
                || (has_keys && column_bytes(&keys, row, &key, &key_len) < 0))
            goto done;
        Py_ssize_t size = (key_len > 0 ? key_len : 0) + (value_len > 0 ? value_len : 0);
        if (size > self->record_limit || self->buffered >= self->buffer_memory)
            break;
        if (has_partitions && !column_null(&partitions, row)) {
            partition = ((const int32_t *)partitions.offsets.buf)[partitions.offset + row];
            if (partition < 0 || partition >= count)
                break;  /* the Python path says what is wrong with it */
        } else if (choose_partition(self, topic, count, key, key_len, size, &partition,
                                    &sticky_state, &sticky_bytes) < 0) {
            break;
        }
        Py_ssize_t accounted = size + RECORD_OVERHEAD;
        if ((entry = open_entry(self, topic, partition, accounted)) == NULL)
            break;
        RecordBuilder *builder = (RecordBuilder *)PyTuple_GET_ITEM(entry, ENTRY_BUILDER);
        if (sticky_state != NULL
                && (new_sticky_bytes = PyLong_FromSsize_t(sticky_bytes + size)) == NULL)
            goto done;
        if (builders->append_raw(builder, Py_None, key, key_len, value, value_len) < 0) {
            Py_XDECREF(new_sticky_bytes);
            goto done;
        }
        builder->accounted += accounted;
        self->buffered += accounted;
        if (sticky_state != NULL)
            PyList_SetItem(sticky_state, 1, new_sticky_bytes);  /* steals; an int */
    }
done:
    column_release(&values);
    if (has_keys)
        column_release(&keys);
    if (has_partitions)
        column_release(&partitions);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(row);
}

/* set(topic, partition, batch): the batch now open on that partition (called under the
 * accumulator's lock, once the batch's first record is in). */
static PyObject *
open_set(OpenBatches *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t partition;
    /* An exact str: a subclass's __eq__ could run during append's lookups. */
    if (nargs != 3 || !PyUnicode_CheckExact(args[0]) || !small_int(args[1], &partition)
            || partition < 0) {
        PyErr_SetString(PyExc_TypeError, "set(topic: str, partition: int >= 0, batch)");
        return NULL;
    }
    if (self->open == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "OpenBatches.__init__ was not called");
        return NULL;
    }
    PyObject *batch = args[2];
    PyObject *builder = PyObject_GetAttrString(batch, "records");
    PyObject *callbacks = builder == NULL ? NULL : PyObject_GetAttrString(batch, "_callbacks");
    PyObject *entry = NULL;
    if (callbacks != NULL && !PyObject_TypeCheck(builder, builders->builder_type))
        PyErr_SetString(PyExc_TypeError, "batch.records must be the compiled RecordBuilder");
    else if (callbacks != NULL && !PyList_CheckExact(callbacks))
        PyErr_SetString(PyExc_TypeError, "batch._callbacks must be a list");
    else if (callbacks != NULL)
        entry = PyTuple_Pack(3, batch, builder, callbacks);
    Py_XDECREF(builder);
    Py_XDECREF(callbacks);
    if (entry == NULL)
        return NULL;
    PyObject *partitions = PyDict_GetItemWithError(self->open, args[0]);
    if (partitions == NULL) {
        if (PyErr_Occurred() || (partitions = PyList_New(0)) == NULL
                || PyDict_SetItem(self->open, args[0], partitions) < 0) {
            Py_XDECREF(partitions);
            Py_DECREF(entry);
            return NULL;
        }
        Py_DECREF(partitions);  /* the dict holds it */
    }
    while (PyList_GET_SIZE(partitions) <= partition) {
        if (PyList_Append(partitions, Py_None) < 0) {
            Py_DECREF(entry);
            return NULL;
        }
    }
    /* Done in one step, so a fast append sees the old entry or the new one. */
    PyList_SetItem(partitions, partition, entry);
    Py_RETURN_NONE;
}

/* reserve(builder, n): n more bytes buffered, counted for that batch (in one step, as a fast
 * append does it). */
static PyObject *
open_reserve(OpenBatches *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t n;
    if (nargs != 2 || !PyObject_TypeCheck(args[0], builders->builder_type)
            || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "reserve(builder: RecordBuilder, n: int)");
        return NULL;
    }
    if ((n = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    ((RecordBuilder *)args[0])->accounted += n;
    self->buffered += n;
    Py_RETURN_NONE;
}

static PyObject *
open_release(OpenBatches *self, PyObject *n_obj)
{
    Py_ssize_t n = PyLong_AsSsize_t(n_obj);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    self->buffered -= n;
    Py_RETURN_NONE;
}

static PyMethodDef open_methods[] = {
    {"append", (PyCFunction)(void (*)(void))open_append, METH_FASTCALL,
     "append(topic, value, key, partition, headers, timestamp, on_delivery) -> RecordFuture\n"
     "when the record went into its partition's open batch, None when the Python path must\n"
     "take it."},
    {"append_many", (PyCFunction)(void (*)(void))open_append_many, METH_FASTCALL,
     "append_many(topic, start, stop, values, keys, partitions) -> the first row not\n"
     "appended: rows of columns in Arrow's layout into their partitions' open batches."},
    {"set", (PyCFunction)(void (*)(void))open_set, METH_FASTCALL,
     "set(topic, partition, batch): the batch open on that partition."},
    {"reserve", (PyCFunction)(void (*)(void))open_reserve, METH_FASTCALL,
     "reserve(builder, n): n more bytes buffered, counted for that batch."},
    {"release", (PyCFunction)open_release, METH_O, "release(n): n bytes fewer buffered."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef open_members[] = {
    {"buffered", T_PYSSIZET, offsetof(OpenBatches, buffered), READONLY,
     "bytes of records not yet acknowledged or failed"},
    {"enabled", T_BOOL, offsetof(OpenBatches, enabled), 0,
     "False: append always answers None (a closed or failed producer)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject OpenBatchesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "oncelog.client.producer._append.OpenBatches",
    .tp_doc = PyDoc_STR("OpenBatches(partition_counts, sticky, future_type, batch_size,\n"
                        "batch_records, buffer_memory, record_limit, partitioner): each\n"
                        "partition's open batch, the buffered bytes, and produce()'s fast path."),
    .tp_basicsize = sizeof(OpenBatches),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)open_init,
    .tp_traverse = (traverseproc)open_traverse,
    .tp_clear = (inquiry)open_clear,
    .tp_dealloc = (destructor)open_dealloc,
    .tp_methods = open_methods,
    .tp_members = open_members,
};

static PyMethodDef methods[] = {
    {"murmur2", (PyCFunction)py_murmur2, METH_O,
     "murmur2(data) -> Java's Utils.murmur2 of the bytes, a signed 32-bit int."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "oncelog.client.producer._append",
    "produce()'s compiled fast path (optional; see _append.c).", -1, methods,
};

static int
add_type(PyObject *module, const char *name, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__append(void)
{
#ifdef Py_GIL_DISABLED
    /* Without the GIL a C call is no longer atomic: no fast path (ImportError -> Python). */
    PyErr_SetString(PyExc_ImportError, "the append fast path needs the GIL");
    return NULL;
#endif
    builders = PyCapsule_Import(RECORD_BUILDER_CAPI_NAME, 0);
    if (builders == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (add_type(module, "FutureBase", &FutureBaseType) < 0
            || add_type(module, "OpenBatches", &OpenBatchesType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
