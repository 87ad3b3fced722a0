/* The compiled core of protocol/records.py: the records inside a v2 batch.
 *
 * Optional: records.py carries the same rules in Python and uses this module only when it
 * was built. It exists because decoding a record and encoding one are the clients' per-record
 * work (a consumer decodes every record it returns, a producer encodes every record it is
 * given), where Python spends a microsecond or two a record and this a tenth of that.
 * tests/test_records_codec.py holds both implementations to the same answers.
 *
 * A record, as Kafka's RecordBatch v2 lays it out (every integer a zigzag varint):
 *   length, attributes (one byte), timestamp delta, offset delta,
 *   key length, key, value length, value, header count, headers (key length, key,
 *   value length, value). A negative length means null.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "record_builder.h"

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t end;
} Reader;

static PyObject *DecodeError;  /* ValueError, so callers treat both implementations alike */

static int
fail(const char *message)
{
    PyErr_SetString(DecodeError, message);
    return -1;
}

/* A zigzag varint of up to 64 bits into *out; -1 with an error set when it is cut short or
 * too long. */
static int
read_varint(Reader *r, int64_t *out)
{
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        if (r->pos >= r->end)
            return fail("record batch does not parse: a varint runs past the end");
        unsigned char b = r->buf[r->pos++];
        if (shift == 63 && b > 1)
            return fail("record batch does not parse: varint is too long");
        value |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
        shift += 7;
        if (shift >= 64)
            return fail("record batch does not parse: varint is too long");
    }
    *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
    return 0;
}

/* A length-prefixed field: NULL data with *len < 0 for null. */
static int
read_field(Reader *r, const unsigned char **data, int64_t *len)
{
    if (read_varint(r, len) < 0)
        return -1;
    if (*len < 0) {
        *data = NULL;
        return 0;
    }
    if (*len > r->end - r->pos)
        return fail("record batch does not parse: a record field runs past the end of the batch");
    *data = r->buf + r->pos;
    r->pos += (Py_ssize_t)*len;
    return 0;
}

static PyObject *
bytes_or_none(const unsigned char *data, int64_t len)
{
    if (data == NULL)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
}

static PyObject *EMPTY_TUPLE;

/* The headers of a record as a tuple of (str, bytes | None); a null key reads as "". */
static PyObject *
read_headers(Reader *r)
{
    int64_t count;
    if (read_varint(r, &count) < 0)
        return NULL;
    if (count <= 0) {
        Py_INCREF(EMPTY_TUPLE);
        return EMPTY_TUPLE;
    }
    if (count > r->end - r->pos) {
        fail("record batch does not parse: a record field runs past the end of the batch");
        return NULL;
    }
    PyObject *headers = PyTuple_New((Py_ssize_t)count);
    if (headers == NULL)
        return NULL;
    for (int64_t i = 0; i < count; i++) {
        const unsigned char *kdata, *vdata;
        int64_t klen, vlen;
        if (read_field(r, &kdata, &klen) < 0 || read_field(r, &vdata, &vlen) < 0)
            goto error;
        PyObject *name = kdata == NULL ? PyUnicode_FromStringAndSize("", 0)
            : PyUnicode_DecodeUTF8((const char *)kdata, (Py_ssize_t)klen, "replace");
        if (name == NULL)
            goto error;
        PyObject *value = bytes_or_none(vdata, vlen);
        if (value == NULL) {
            Py_DECREF(name);
            goto error;
        }
        PyObject *pair = PyTuple_Pack(2, name, value);
        Py_DECREF(name);
        Py_DECREF(value);
        if (pair == NULL)
            goto error;
        PyObject_GC_UnTrack(pair);
        PyTuple_SET_ITEM(headers, (Py_ssize_t)i, pair);
    }
    PyObject_GC_UnTrack(headers);  /* strings and bytes only: never part of a cycle */
    return headers;
error:
    Py_DECREF(headers);
    return NULL;
}

typedef struct {
    int64_t ts_delta, offset_delta;
    const unsigned char *key, *value;
    int64_t key_len, value_len;
    PyObject *headers;  /* a new reference */
} Fields;

/* One record at r->pos; on success the reader is past it. */
static int
read_record(Reader *r, Fields *f)
{
    int64_t length;
    if (read_varint(r, &length) < 0)
        return -1;
    if (length < 0 || length > r->end - r->pos)
        return fail("record batch does not parse: a record length does not match its fields");
    Py_ssize_t record_end = r->pos + (Py_ssize_t)length;
    if (r->pos >= r->end)
        return fail("record batch does not parse: a record runs past the end");
    r->pos++;  /* attributes: unused in v2 */
    if (read_varint(r, &f->ts_delta) < 0 || read_varint(r, &f->offset_delta) < 0
            || read_field(r, &f->key, &f->key_len) < 0
            || read_field(r, &f->value, &f->value_len) < 0)
        return -1;
    f->headers = read_headers(r);
    if (f->headers == NULL)
        return -1;
    if (r->pos != record_end) {
        Py_CLEAR(f->headers);
        return fail("record batch does not parse: a record length does not match its fields");
    }
    return 0;
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(payload, count) -> list of (offset delta, timestamp delta, key, value, headers)\n"
"\n"
"The first ``count`` records of a batch's (uncompressed) payload; ValueError when they do\n"
"not parse.");

static PyObject *
decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_records(payload, count)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {view.buf, 0, view.len};
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        Fields f;
        if (read_record(&r, &f) < 0)
            goto error;
        PyObject *item = PyTuple_New(5);
        if (item == NULL) {
            Py_DECREF(f.headers);
            goto error;
        }
        PyTuple_SET_ITEM(item, 4, f.headers);
        PyObject *fields[4] = {
            PyLong_FromLongLong(f.offset_delta), PyLong_FromLongLong(f.ts_delta),
            bytes_or_none(f.key, f.key_len), bytes_or_none(f.value, f.value_len),
        };
        int complete = 1;
        for (int k = 0; k < 4; k++) {
            if (fields[k] == NULL)
                complete = 0;
            else
                PyTuple_SET_ITEM(item, k, fields[k]);
        }
        if (!complete) {
            Py_DECREF(item);
            goto error;
        }
        PyObject_GC_UnTrack(item);  /* as in consumer_records: it cannot be in a cycle */
        int appended = PyList_Append(out, item);
        Py_DECREF(item);
        if (appended < 0)
            goto error;
    }
    goto done;
error:
    Py_CLEAR(out);
done:
    PyBuffer_Release(&view);
    return out;
}

PyDoc_STRVAR(consumer_records_doc,
"consumer_records(out, cls, payload, count, min_offset, topic, partition, base_offset,\n"
"                 base_timestamp, log_append_time, max_timestamp, timestamp_type,\n"
"                 producer_id, producer_epoch, base_sequence, transactional) -> int\n"
"\n"
"Append to ``out`` one ``cls`` per record of the payload whose offset is at least\n"
"``min_offset``; returns how many. ``cls`` is a tuple subclass with no fields of its own\n"
"(a NamedTuple) of the 12 fields of client.consumer.ConsumerRecord, in its order: topic,\n"
"partition, offset, timestamp, timestamp type, key, value, headers, producer id, epoch,\n"
"sequence (-1 when base_sequence is), transactional. Every record is checked, also those\n"
"skipped; ValueError when one does not parse.");

#define CONSUMER_FIELDS 12

static PyObject *
consumer_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "consumer_records takes 16 arguments");
        return NULL;
    }
    PyObject *out = args[0];
    PyObject *cls = args[1];
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)
            || ((PyTypeObject *)cls)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "cls must be a NamedTuple class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    long long min_offset = PyLong_AsLongLong(args[4]);
    long long base_offset = PyLong_AsLongLong(args[7]);
    long long base_ts = PyLong_AsLongLong(args[8]);
    int log_append = PyObject_IsTrue(args[9]);
    long long max_ts = PyLong_AsLongLong(args[10]);
    long long base_sequence = PyLong_AsLongLong(args[14]);
    if (PyErr_Occurred() || log_append < 0)
        return NULL;
    PyObject *topic = args[5], *partition = args[6], *kind = args[11];
    PyObject *pid = args[12], *epoch = args[13], *transactional = args[15];
    PyObject *fixed_ts = NULL, *no_sequence = NULL;
    if (log_append && (fixed_ts = PyLong_FromLongLong(max_ts)) == NULL)
        return NULL;
    if (base_sequence < 0 && (no_sequence = PyLong_FromLong(-1)) == NULL) {
        Py_XDECREF(fixed_ts);
        return NULL;
    }

    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0) {
        Py_XDECREF(fixed_ts);
        Py_XDECREF(no_sequence);
        return NULL;
    }
    Reader r = {view.buf, 0, view.len};
    Py_ssize_t appended = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Fields f;
        if (read_record(&r, &f) < 0) {
            failed = 1;
            break;
        }
        long long offset, ts = 0;
        if (__builtin_add_overflow(base_offset, f.offset_delta, &offset)
                || (!log_append && __builtin_add_overflow(base_ts, f.ts_delta, &ts))) {
            Py_DECREF(f.headers);
            fail("record batch does not parse: an offset or timestamp out of range");
            failed = 1;
            break;
        }
        if (offset < min_offset) {
            Py_DECREF(f.headers);
            continue;
        }
        PyObject *record = type->tp_alloc(type, CONSUMER_FIELDS);
        if (record == NULL) {
            Py_DECREF(f.headers);
            failed = 1;
            break;
        }
        /* Items not yet set are NULL, which a tuple's dealloc and traverse skip. */
        Py_INCREF(topic);
        PyTuple_SET_ITEM(record, 0, topic);
        Py_INCREF(partition);
        PyTuple_SET_ITEM(record, 1, partition);
        PyTuple_SET_ITEM(record, 7, f.headers);
        Py_INCREF(kind);
        PyTuple_SET_ITEM(record, 4, kind);
        Py_INCREF(pid);
        PyTuple_SET_ITEM(record, 8, pid);
        Py_INCREF(epoch);
        PyTuple_SET_ITEM(record, 9, epoch);
        Py_INCREF(transactional);
        PyTuple_SET_ITEM(record, 11, transactional);
        PyObject *timestamp;
        if (fixed_ts) {
            Py_INCREF(fixed_ts);
            timestamp = fixed_ts;
        } else {
            timestamp = PyLong_FromLongLong(ts);
        }
        PyObject *sequence;
        if (no_sequence) {
            Py_INCREF(no_sequence);
            sequence = no_sequence;
        } else {
            /* Sequences wrap at 2^31 - 1, as Kafka's do. */
            sequence = PyLong_FromLongLong(
                (long long)(((uint64_t)base_sequence + (uint64_t)f.offset_delta) & 0x7FFFFFFF));
        }
        PyObject *offset_obj = PyLong_FromLongLong(offset);
        PyObject *key = bytes_or_none(f.key, f.key_len);
        PyObject *value = bytes_or_none(f.value, f.value_len);
        if (timestamp) PyTuple_SET_ITEM(record, 3, timestamp);
        if (sequence) PyTuple_SET_ITEM(record, 10, sequence);
        if (offset_obj) PyTuple_SET_ITEM(record, 2, offset_obj);
        if (key) PyTuple_SET_ITEM(record, 5, key);
        if (value) PyTuple_SET_ITEM(record, 6, value);
        if (!timestamp || !sequence || !offset_obj || !key || !value) {
            Py_DECREF(record);
            failed = 1;
            break;
        }
        /* Nothing in a record can lead back to it (strings, numbers, bytes and a tuple of
         * them), so the collector need never look at it: consumers hold thousands of
         * records at a time, and traversing them cost as much as building them. */
        PyObject_GC_UnTrack(record);
        int rc = PyList_Append(out, record);
        Py_DECREF(record);
        if (rc < 0) {
            failed = 1;
            break;
        }
        appended++;
    }
    PyBuffer_Release(&view);
    Py_XDECREF(fixed_ts);
    Py_XDECREF(no_sequence);
    if (failed)
        return NULL;
    return PyLong_FromSsize_t(appended);
}

/* --- encoding ------------------------------------------------------------------------- */

static int
zigzag_size(int64_t value)
{
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int size = 1;
    while (v >= 0x80) {
        v >>= 7;
        size++;
    }
    return size;
}

static unsigned char *
write_varint(unsigned char *p, int64_t value)
{
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (v >= 0x80) {
        *p++ = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

/* The bytes of a record without headers, length prefix included; its body's length (what
 * the prefix says) into *body_out. */
static Py_ssize_t
record_size(int64_t offset_delta, int64_t ts_delta, int64_t key_len, int64_t value_len,
            int64_t *body_out)
{
    int64_t body = 1 + zigzag_size(ts_delta) + zigzag_size(offset_delta)
        + zigzag_size(key_len) + (key_len > 0 ? key_len : 0)
        + zigzag_size(value_len) + (value_len > 0 ? value_len : 0) + 1;
    *body_out = body;
    return (Py_ssize_t)(zigzag_size(body) + body);
}

/* Write that record at p, which has room for it (key and value: key_len and value_len
 * bytes; a length of -1 is null). */
static void
write_record(unsigned char *p, int64_t body, int64_t offset_delta, int64_t ts_delta,
             const char *key, int64_t key_len, const char *value, int64_t value_len)
{
    p = write_varint(p, body);
    *p++ = 0;  /* attributes */
    p = write_varint(p, ts_delta);
    p = write_varint(p, offset_delta);
    p = write_varint(p, key_len);
    if (key_len > 0) {
        memcpy(p, key, (size_t)key_len);
        p += key_len;
    }
    p = write_varint(p, value_len);
    if (value_len > 0) {
        memcpy(p, value, (size_t)value_len);
        p += value_len;
    }
    *p = 0;  /* no headers */
}

static int
check_key_value(PyObject *key, PyObject *value)
{
    if ((key != Py_None && !PyBytes_Check(key)) || (value != Py_None && !PyBytes_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "key and value must be bytes or None");
        return -1;
    }
    return 0;
}

/* --- validation: the broker's walk over a produced batch's records ------------------ */

/* protocol/validation.py calls this once per batch on the produce path (its Python twin,
 * _check_records there, gives the same answers: tests/test_validation.py). It decodes no
 * field into a Python object: lengths and deltas are checked, timestamps compared, and only
 * records that break a per-record rule are named.
 *
 * Integers are read as Kafka types them: timestamp deltas as 64-bit varints, every other
 * field as a 32-bit one (at most 5 bytes, the fifth holding only the top 4 bits). Encodings
 * longer than needed but within those bounds are accepted, as Kafka's readers do. */

enum { V_OK = 0, V_CUT, V_LONG };

static int
varint32(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int32_t *out)
{
    uint32_t raw = 0;
    for (int shift = 0;; shift += 7) {
        if (*pos >= end)
            return V_CUT;
        unsigned char b = buf[(*pos)++];
        if (shift == 28 && b > 0x0F)
            return V_LONG;
        raw |= (uint32_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
    }
    *out = (int32_t)((raw >> 1) ^ (0u - (raw & 1)));
    return V_OK;
}

static int
varint64(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    uint64_t raw = 0;
    for (int shift = 0;; shift += 7) {
        if (*pos >= end)
            return V_CUT;
        unsigned char b = buf[(*pos)++];
        if (shift == 63 && b > 1)
            return V_LONG;
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
    }
    *out = (int64_t)((raw >> 1) ^ (0u - (raw & 1)));
    return V_OK;
}

static const char *VARINT_PROBLEM[] = {"", "a varint is cut short", "a varint is too long"};
#define FIELD_PAST_END "a field runs past the end of the record"

/* The problem with record ``index``, as ValueError("record <index>: <problem>"). */
static PyObject *
record_problem(Py_ssize_t index, const char *format, ...)
{
    char problem[160];
    va_list args;
    va_start(args, format);
    PyOS_vsnprintf(problem, sizeof problem, format, args);
    va_end(args);
    PyErr_Format(PyExc_ValueError, "record %zd: %s", index, problem);
    return NULL;
}

/* One length-prefixed field (key, value, header key or value) of the record ending at end;
 * its length (negative for null) into *len. NULL on success, else the problem. */
static const char *
skip_field(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int32_t *len)
{
    int rc = varint32(buf, pos, end, len);
    if (rc != V_OK)
        return VARINT_PROBLEM[rc];
    if (*len > end - *pos)
        return FIELD_PAST_END;
    if (*len > 0)
        *pos += *len;
    return NULL;
}

enum { RECORD_NO_KEY = 0, RECORD_TIMESTAMP = 1 };

PyDoc_STRVAR(check_records_doc,
"check_records(payload, count, base_timestamp, need_key, low, high)\n"
"    -> (max timestamp, None or [(index, kind, timestamp)])\n"
"\n"
"Walk the ``count`` records of a batch's uncompressed payload as Kafka's LogValidator\n"
"does. ValueError (its message names the record and the problem) when the records do not\n"
"fill the payload exactly, a length or varint is out of bounds, or the offset deltas are not\n"
"0, 1, 2, ... Otherwise the largest record timestamp (-1 when none is larger) and the\n"
"records breaking a per-record rule: kind 0, no key while ``need_key``; kind 1, a timestamp\n"
"other than -1 outside [low, high].");

static PyObject *
check_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "check_records(payload, count, base_timestamp, need_key, low, high)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    long long base_ts = PyLong_AsLongLong(args[2]);
    int need_key = PyObject_IsTrue(args[3]);
    long long low = PyLong_AsLongLong(args[4]);
    long long high = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred() || need_key < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t pos = 0, end = view.len;
    long long max_ts = -1;
    PyObject *bad = NULL, *result = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos == end) {
            PyErr_Format(PyExc_ValueError, "batch says %zd records but holds %zd", count, i);
            goto done;
        }
        int32_t length, offset_delta, key_len, value_len, header_count, len;
        int64_t ts_delta;
        int rc = varint32(buf, &pos, end, &length);
        if (rc != V_OK) {
            record_problem(i, "%s", VARINT_PROBLEM[rc]);
            goto done;
        }
        if (length < 0 || length > end - pos) {
            record_problem(i, length < 0 ? "negative length %d"
                                         : "length %d runs past the end of the batch", length);
            goto done;
        }
        Py_ssize_t record_end = pos + length;
        if (pos >= record_end) {
            record_problem(i, FIELD_PAST_END);
            goto done;
        }
        pos++;  /* attributes: unused in v2 */
        if ((rc = varint64(buf, &pos, record_end, &ts_delta)) != V_OK
                || (rc = varint32(buf, &pos, record_end, &offset_delta)) != V_OK) {
            record_problem(i, "%s", VARINT_PROBLEM[rc]);
            goto done;
        }
        if (offset_delta != i) {
            record_problem(i, "offset delta %d, expected %zd", offset_delta, i);
            goto done;
        }
        const char *problem = skip_field(buf, &pos, record_end, &key_len);
        if (problem == NULL)
            problem = skip_field(buf, &pos, record_end, &value_len);
        if (problem == NULL && (rc = varint32(buf, &pos, record_end, &header_count)) != V_OK)
            problem = VARINT_PROBLEM[rc];
        if (problem != NULL) {
            record_problem(i, "%s", problem);
            goto done;
        }
        if (header_count < 0) {
            record_problem(i, "negative header count %d", header_count);
            goto done;
        }
        /* Each header takes at least two bytes or fails: the loop ends within the record. */
        for (int32_t h = 0; h < header_count; h++) {
            problem = skip_field(buf, &pos, record_end, &len);
            if (problem == NULL && len < 0)
                problem = "a header key is null";
            if (problem == NULL)
                problem = skip_field(buf, &pos, record_end, &len);
            if (problem != NULL) {
                record_problem(i, "%s", problem);
                goto done;
            }
        }
        if (pos != record_end) {
            record_problem(i, "length %d does not match its fields (%zd bytes)", length,
                           (Py_ssize_t)(pos - (record_end - length)));
            goto done;
        }
        long long ts;
        if (__builtin_add_overflow(base_ts, (long long)ts_delta, &ts)) {
            record_problem(i, "timestamp delta %lld overflows", (long long)ts_delta);
            goto done;
        }
        if (ts > max_ts)
            max_ts = ts;
        int kind = -1;
        if (need_key && key_len < 0)
            kind = RECORD_NO_KEY;
        else if (ts != -1 && (ts < low || ts > high))
            kind = RECORD_TIMESTAMP;
        if (kind >= 0) {
            if (bad == NULL && (bad = PyList_New(0)) == NULL)
                goto done;
            PyObject *item = Py_BuildValue("(niL)", i, kind, ts);
            if (item == NULL || PyList_Append(bad, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "batch says %zd records but more bytes follow them",
                     count);
        goto done;
    }
    result = Py_BuildValue("(LO)", max_ts, bad == NULL ? Py_None : bad);
done:
    Py_XDECREF(bad);
    PyBuffer_Release(&view);
    return result;
}

/* --- RecordBuilder: the records of a batch a producer fills -------------------------- */

/* The struct is in record_builder.h, which client/_append.c shares. */

static int
builder_init(RecordBuilder *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t header_size;
    static char *names[] = {"header_size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &header_size))
        return -1;
    if (header_size < 0) {
        PyErr_SetString(PyExc_ValueError, "header_size must not be negative");
        return -1;
    }
    /* Its own buffer, doubled as it fills: a bytearray grows by an eighth at a time, which
     * with kilobyte records meant copying the batch every other record. */
    Py_ssize_t capacity = header_size > 4096 ? header_size : 4096;
    unsigned char *data = PyMem_Realloc(self->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(data, 0, (size_t)header_size);
    self->data = data;
    self->capacity = capacity;
    self->size = header_size;
    self->ready = 1;
    self->count = 0;
    self->base_ts = self->max_ts = 0;
    self->closed = 0;
    self->accounted = 0;
    return 0;
}

static void
builder_dealloc(RecordBuilder *self)
{
    PyMem_Free(self->data);
    PyMem_Free(self->timestamps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Room for n more bytes; a pointer to it, NULL with an error set. */
static unsigned char *
builder_grow(RecordBuilder *self, Py_ssize_t n)
{
    if (n > PY_SSIZE_T_MAX / 2 - self->size) {
        PyErr_SetString(PyExc_OverflowError, "record too large");
        return NULL;
    }
    if (self->size + n > self->capacity) {
        Py_ssize_t capacity = self->capacity ? self->capacity : 4096;
        while (capacity < self->size + n)
            capacity *= 2;
        unsigned char *data = PyMem_Realloc(self->data, (size_t)capacity);
        if (data == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->data = data;
        self->capacity = capacity;
    }
    unsigned char *p = self->data + self->size;
    self->size += n;
    return p;
}

/* Bookkeeping for a record about to be appended: its timestamp delta into *ts_delta. */
static int
builder_next(RecordBuilder *self, PyObject *timestamp_obj, int64_t *timestamp, int64_t *ts_delta)
{
    long long ts;
    if (timestamp_obj == Py_None) {
        /* Now, in milliseconds since the epoch, as Kafka's CreateTime: here rather than in
         * the caller, where it was a tenth of a produce() call. */
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        ts = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    } else {
        ts = PyLong_AsLongLong(timestamp_obj);
        if (ts == -1 && PyErr_Occurred())
            return -1;
    }
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "RecordBuilder.__init__ was not called");
        return -1;
    }
    if (self->data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the builder's buffer was taken: no more records");
        return -1;
    }
    if (self->count == self->allocated) {
        Py_ssize_t allocated = self->allocated ? self->allocated * 2 : 64;
        int64_t *grown = PyMem_Realloc(self->timestamps, (size_t)allocated * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->timestamps = grown;
        self->allocated = allocated;
    }
    *timestamp = ts;
    *ts_delta = self->count == 0 ? 0 : (int64_t)((uint64_t)ts - (uint64_t)self->base_ts);
    return 0;
}

static Py_ssize_t
builder_appended(RecordBuilder *self, int64_t timestamp)
{
    if (self->count == 0)
        self->base_ts = self->max_ts = timestamp;
    else if (timestamp > self->max_ts)
        self->max_ts = timestamp;
    self->timestamps[self->count] = timestamp;
    return self->count++;
}

/* Append a record whose key and value are key_len and value_len bytes (-1: null); its
 * index, or -1 with an error set. The CAPI's append_raw (the producer's bulk path). */
static Py_ssize_t
builder_add_raw(RecordBuilder *self, PyObject *timestamp_obj, const char *key,
                Py_ssize_t key_len, const char *value, Py_ssize_t value_len)
{
    int64_t timestamp, ts_delta;
    if (builder_next(self, timestamp_obj, &timestamp, &ts_delta) < 0)
        return -1;
    int64_t body;
    Py_ssize_t total = record_size(self->count, ts_delta, key_len, value_len, &body);
    unsigned char *p = builder_grow(self, total);
    if (p == NULL)
        return -1;
    write_record(p, body, self->count, ts_delta, key, key_len, value, value_len);
    return builder_appended(self, timestamp);
}

/* The record's index, or -1 with an error set: RecordBuilder.append, and the CAPI's. */
static Py_ssize_t
builder_add(RecordBuilder *self, PyObject *timestamp_obj, PyObject *key, PyObject *value)
{
    if (check_key_value(key, value) < 0)
        return -1;
    return builder_add_raw(self, timestamp_obj,
                           key == Py_None ? NULL : PyBytes_AS_STRING(key),
                           key == Py_None ? -1 : PyBytes_GET_SIZE(key),
                           value == Py_None ? NULL : PyBytes_AS_STRING(value),
                           value == Py_None ? -1 : PyBytes_GET_SIZE(value));
}

static PyObject *
builder_append(RecordBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append(timestamp, key, value)");
        return NULL;
    }
    Py_ssize_t index = builder_add(self, args[0], args[1], args[2]);
    return index < 0 ? NULL : PyLong_FromSsize_t(index);
}

static PyObject *
builder_append_encoded(RecordBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "append_encoded(timestamp, record: bytes)");
        return NULL;
    }
    int64_t timestamp, ts_delta;
    if (builder_next(self, args[0], &timestamp, &ts_delta) < 0)
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(args[1]);
    unsigned char *p = builder_grow(self, n);
    if (p == NULL)
        return NULL;
    memcpy(p, PyBytes_AS_STRING(args[1]), (size_t)n);
    return PyLong_FromSsize_t(builder_appended(self, timestamp));
}

static PyObject *
builder_delta(RecordBuilder *self, PyObject *timestamp_obj)
{
    long long ts = PyLong_AsLongLong(timestamp_obj);
    if (ts == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(self->count == 0 ? 0
                               : (long long)((uint64_t)ts - (uint64_t)self->base_ts));
}

static PyObject *
builder_timestamp(RecordBuilder *self, PyObject *index_obj)
{
    Py_ssize_t index = PyLong_AsSsize_t(index_obj);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0 || index >= self->count) {
        PyErr_SetString(PyExc_IndexError, "no record at that index");
        return NULL;
    }
    return PyLong_FromLongLong(self->timestamps[index]);
}

static PyObject *
builder_take_buffer(RecordBuilder *self, PyObject *unused)
{
    (void)unused;
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "RecordBuilder.__init__ was not called");
        return NULL;
    }
    if (self->data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the builder's buffer was taken already");
        return NULL;
    }
    PyObject *taken = PyByteArray_FromStringAndSize((const char *)self->data, self->size);
    if (taken == NULL)
        return NULL;
    PyMem_Free(self->data);
    self->data = NULL;
    self->size = self->capacity = 0;
    self->closed = 1;
    return taken;
}

static PyMethodDef builder_methods[] = {
    {"append", (PyCFunction)(void (*)(void))builder_append, METH_FASTCALL,
     "append(timestamp, key, value) -> index: a record without headers; a timestamp of None\n"
     "is now (milliseconds since the epoch)."},
    {"append_encoded", (PyCFunction)(void (*)(void))builder_append_encoded, METH_FASTCALL,
     "append_encoded(timestamp, record) -> index: a record encoded by the caller, with\n"
     "offset delta ``count`` and timestamp delta ``delta(timestamp)``."},
    {"delta", (PyCFunction)builder_delta, METH_O,
     "delta(timestamp) -> the timestamp delta the next record would have."},
    {"timestamp", (PyCFunction)builder_timestamp, METH_O,
     "timestamp(index) -> the timestamp of the record at ``index``."},
    {"take_buffer", (PyCFunction)builder_take_buffer, METH_NOARGS,
     "take_buffer() -> a bytearray of the buffer (header room, then the records); the\n"
     "builder keeps its count and timestamps, is closed, and takes no more records."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef builder_members[] = {
    {"count", T_PYSSIZET, offsetof(RecordBuilder, count), READONLY, "records appended"},
    {"base_ts", T_LONGLONG, offsetof(RecordBuilder, base_ts), READONLY,
     "the first record's timestamp"},
    {"max_ts", T_LONGLONG, offsetof(RecordBuilder, max_ts), READONLY, "the largest timestamp"},
    {"size", T_PYSSIZET, offsetof(RecordBuilder, size), READONLY,
     "bytes in the buffer, header room included"},
    {"closed", T_BOOL, offsetof(RecordBuilder, closed), 0,
     "the batch takes no more records (set by the producer)"},
    {"accounted", T_PYSSIZET, offsetof(RecordBuilder, accounted), 0,
     "bytes buffer.memory counts for the batch (kept by the producer)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecordBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "oncelog.protocol._records.RecordBuilder",
    .tp_doc = PyDoc_STR("RecordBuilder(header_size): the records of one batch, encoded as they\n"
                        "are appended, after ``header_size`` bytes of room for the header."),
    .tp_basicsize = sizeof(RecordBuilder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)builder_init,
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_methods = builder_methods,
    .tp_members = builder_members,
};

/* --- ArrowColumns: records straight into Arrow buffers (the Spark source's) ----------- */

/* The Spark source hands Spark Arrow record batches. Building them from Python lists cost
 * more than the fetch: a Python object per key, value, offset and timestamp, then Arrow
 * copying them all again. Here a record's key and value are copied once, from the batch's
 * bytes into the column's data buffer, and offsets, timestamps and sequences are arithmetic
 * on the batch header and the record's deltas. Each buffer comes from the ``allocate``
 * callable given (spark/columns.py gives pyarrow.allocate_buffer: Arrow's memory pool hands
 * a task the pages of the chunks Spark is done with, where fresh bytearrays page-faulted
 * every byte in again, half the worker's time) and is handed to pyarrow.Array.from_buffers
 * without a copy; a buffer never moves or shrinks: it grows by moving to a larger one.
 * tests/test_spark_read_columns.py holds it to the Python twin, spark/columns.py's
 * PyRecordColumns. */

typedef struct {
    PyObject *obj;         /* what allocate() returned: a writable buffer of ``capacity`` */
    unsigned char *data;   /* its memory, fixed while ``obj`` lives (never resized) */
    Py_ssize_t size;       /* bytes used of it */
    Py_ssize_t capacity;
    PyObject *allocate;    /* borrowed from the ArrowColumns */
} Buf;

enum {
    KEY_VALID, KEY_OFFSETS, KEY_DATA, VALUE_VALID, VALUE_OFFSETS, VALUE_DATA,
    OFFSETS, TIMESTAMPS, TYPES, PIDS, EPOCHS, SEQUENCES,
    HEADER_OFFSETS, HKEY_OFFSETS, HKEY_DATA, HVALUE_VALID, HVALUE_OFFSETS, HVALUE_DATA,
    N_BUFS
};

typedef struct {
    PyObject_HEAD
    Buf bufs[N_BUFS];
    PyObject *allocate;
    int include_headers;
    Py_ssize_t rows, key_nulls, value_nulls, headers, hvalue_nulls;
    Py_ssize_t data_bytes;  /* keys' and values' */
} ArrowColumns;

/* A new buffer of ``capacity`` bytes from allocate(), holding what ``b`` held. */
static int
buf_move(Buf *b, Py_ssize_t capacity)
{
    PyObject *obj = PyObject_CallFunction(b->allocate, "n", capacity);
    if (obj == NULL)
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(obj);
        return -1;
    }
    unsigned char *data = view.buf;
    Py_ssize_t got = view.len;
    PyBuffer_Release(&view);
    if (got < capacity) {
        Py_DECREF(obj);
        PyErr_Format(PyExc_ValueError, "allocate(%zd) gave %zd bytes", capacity, got);
        return -1;
    }
    if (b->size > 0)
        memcpy(data, b->data, (size_t)b->size);
    Py_XSETREF(b->obj, obj);
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int
buf_reserve(Buf *b, Py_ssize_t more)
{
    Py_ssize_t need = b->size + more;
    if (need <= b->capacity)
        return 0;
    Py_ssize_t grown = b->capacity * 2 > need ? b->capacity * 2 : need;
    return buf_move(b, grown < 256 ? 256 : grown);
}

static int
buf_put(Buf *b, const void *data, Py_ssize_t len)
{
    if (buf_reserve(b, len) < 0)
        return -1;
    if (len > 0)
        memcpy(b->data + b->size, data, (size_t)len);
    b->size += len;
    return 0;
}

/* Validity bit ``index`` of a bitmap (LSB first, as Arrow numbers them). */
static int
bit_put(Buf *b, Py_ssize_t index, int valid)
{
    if ((index & 7) == 0) {
        if (buf_reserve(b, 1) < 0)
            return -1;
        b->data[b->size++] = 0;
    }
    if (valid)
        b->data[index >> 3] |= (unsigned char)(1 << (index & 7));
    return 0;
}

static int
offset_put(Buf *b, Py_ssize_t end)
{
    if (end > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "an Arrow column of more than 2 GiB");
        return -1;
    }
    int32_t value = (int32_t)end;
    return buf_put(b, &value, sizeof value);
}

static Py_ssize_t
data_end(ArrowColumns *self, int data)
{
    return self->bufs[data].size;
}

/* A binary (or string) value: null when data is NULL. */
static int
binary_put(ArrowColumns *self, int valid, int offsets, int data, Py_ssize_t index,
           const unsigned char *bytes, int64_t len, Py_ssize_t *nulls)
{
    if (valid >= 0 && bit_put(&self->bufs[valid], index, bytes != NULL) < 0)
        return -1;
    if (bytes == NULL)
        ++*nulls;
    else if (buf_put(&self->bufs[data], bytes, (Py_ssize_t)len) < 0)
        return -1;
    return offset_put(&self->bufs[offsets], data_end(self, data));
}

/* Empty buffers for the next chunk, as large as the last chunk's (chunks are alike). */
static int
columns_reset(ArrowColumns *self, const Py_ssize_t *capacities)
{
    for (int i = 0; i < N_BUFS; i++) {
        Buf *b = &self->bufs[i];
        b->allocate = self->allocate;
        b->size = 0;
        if (buf_move(b, capacities && capacities[i] > 0 ? capacities[i] : 256) < 0)
            return -1;
    }
    self->rows = self->key_nulls = self->value_nulls = self->headers = self->hvalue_nulls = 0;
    self->data_bytes = 0;
    static const int starts[] = {KEY_OFFSETS, VALUE_OFFSETS, HEADER_OFFSETS, HKEY_OFFSETS,
                                 HVALUE_OFFSETS};
    for (size_t i = 0; i < sizeof starts / sizeof *starts; i++)
        if (offset_put(&self->bufs[starts[i]], 0) < 0)
            return -1;
    return 0;
}

static int
columns_init(ArrowColumns *self, PyObject *args, PyObject *kwargs)
{
    int include_headers;
    PyObject *allocate;
    static char *names[] = {"include_headers", "allocate", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "pO", names, &include_headers, &allocate))
        return -1;
    if (!PyCallable_Check(allocate)) {
        PyErr_SetString(PyExc_TypeError, "allocate must be callable");
        return -1;
    }
    self->include_headers = include_headers;
    Py_INCREF(allocate);
    Py_XSETREF(self->allocate, allocate);
    return columns_reset(self, NULL);
}

static void
columns_dealloc(ArrowColumns *self)
{
    for (int i = 0; i < N_BUFS; i++)
        Py_CLEAR(self->bufs[i].obj);
    Py_CLEAR(self->allocate);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The headers of the record at r->pos into the headers column when ``keep`` (else only
 * checked and skipped). */
static int
columns_headers(ArrowColumns *self, Reader *r, int keep)
{
    int64_t count;
    if (read_varint(r, &count) < 0)
        return -1;
    if (count > r->end - r->pos)
        return fail("record batch does not parse: a record field runs past the end of the batch");
    for (int64_t i = 0; i < count; i++) {
        const unsigned char *kdata, *vdata;
        int64_t klen, vlen;
        if (read_field(r, &kdata, &klen) < 0 || read_field(r, &vdata, &vlen) < 0)
            return -1;
        if (!keep)
            continue;
        /* A null header key reads as "", as decode_records has it. */
        if (kdata != NULL && buf_put(&self->bufs[HKEY_DATA], kdata, (Py_ssize_t)klen) < 0)
            return -1;
        if (offset_put(&self->bufs[HKEY_OFFSETS], data_end(self, HKEY_DATA)) < 0
                || binary_put(self, HVALUE_VALID, HVALUE_OFFSETS, HVALUE_DATA, self->headers,
                              vdata, vlen, &self->hvalue_nulls) < 0)
            return -1;
        self->headers++;
    }
    if (keep && offset_put(&self->bufs[HEADER_OFFSETS], self->headers) < 0)
        return -1;
    return 0;
}

PyDoc_STRVAR(columns_add_doc,
"add(payload, count, first, end, base_offset, base_timestamp, log_append_time,\n"
"    max_timestamp, producer_id, producer_epoch, base_sequence) -> int\n"
"\n"
"The records of a batch's uncompressed payload with offsets in [first, end), appended to\n"
"the columns; returns how many. Every record is checked, also those skipped; ValueError\n"
"when one does not parse (the columns then hold part of the batch: drop them).");

static PyObject *
columns_add(ArrowColumns *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "add takes 11 arguments");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    long long first = PyLong_AsLongLong(args[2]);
    long long end = PyLong_AsLongLong(args[3]);
    long long base_offset = PyLong_AsLongLong(args[4]);
    long long base_ts = PyLong_AsLongLong(args[5]);
    int log_append = PyObject_IsTrue(args[6]);
    long long max_ts = PyLong_AsLongLong(args[7]);
    long long pid = PyLong_AsLongLong(args[8]);
    long epoch = PyLong_AsLong(args[9]);
    long long base_sequence = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred() || log_append < 0)
        return NULL;
    int16_t epoch16 = (int16_t)epoch;
    int32_t type = log_append ? 1 : 0;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {view.buf, 0, view.len};
    Py_ssize_t added = 0;
    int failed = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, delta, key_len, value_len;
        const unsigned char *key, *value;
        if (read_varint(&r, &length) < 0)
            goto done;
        if (length < 0 || length > r.end - r.pos) {
            fail("record batch does not parse: a record length does not match its fields");
            goto done;
        }
        Py_ssize_t record_end = r.pos + (Py_ssize_t)length;
        if (r.pos >= r.end) {
            fail("record batch does not parse: a record runs past the end");
            goto done;
        }
        r.pos++;  /* attributes: unused in v2 */
        if (read_varint(&r, &ts_delta) < 0 || read_varint(&r, &delta) < 0
                || read_field(&r, &key, &key_len) < 0 || read_field(&r, &value, &value_len) < 0)
            goto done;
        long long offset, ts, ts_us;
        if (__builtin_add_overflow(base_offset, delta, &offset)
                || (!log_append && __builtin_add_overflow(base_ts, ts_delta, &ts))
                || __builtin_mul_overflow(log_append ? max_ts : ts, 1000LL, &ts_us)) {
            fail("record batch does not parse: an offset or timestamp out of range");
            goto done;
        }
        int wanted = offset >= first && offset < end;
        if (!wanted) {  /* checked all the same */
            if (columns_headers(self, &r, 0) < 0)
                goto done;
        } else {
            Py_ssize_t row = self->rows;
            int32_t sequence = base_sequence < 0 ? -1
                : (int32_t)(((uint64_t)base_sequence + (uint64_t)delta) & 0x7FFFFFFF);
            if (binary_put(self, KEY_VALID, KEY_OFFSETS, KEY_DATA, row, key, key_len,
                           &self->key_nulls) < 0
                    || binary_put(self, VALUE_VALID, VALUE_OFFSETS, VALUE_DATA, row, value,
                                  value_len, &self->value_nulls) < 0
                    || buf_put(&self->bufs[OFFSETS], &offset, sizeof offset) < 0
                    || buf_put(&self->bufs[TIMESTAMPS], &ts_us, sizeof ts_us) < 0
                    || buf_put(&self->bufs[TYPES], &type, sizeof type) < 0
                    || buf_put(&self->bufs[PIDS], &pid, sizeof pid) < 0
                    || buf_put(&self->bufs[EPOCHS], &epoch16, sizeof epoch16) < 0
                    || buf_put(&self->bufs[SEQUENCES], &sequence, sizeof sequence) < 0
                    || columns_headers(self, &r, self->include_headers) < 0)
                goto done;
            self->rows++;
            self->data_bytes += (key ? key_len : 0) + (value ? value_len : 0);
            added++;
        }
        if (r.pos != record_end) {
            fail("record batch does not parse: a record length does not match its fields");
            goto done;
        }
    }
    failed = 0;
done:
    PyBuffer_Release(&view);
    return failed ? NULL : PyLong_FromSsize_t(added);
}

PyDoc_STRVAR(columns_take_doc,
"take() -> (rows, buffers, sizes, null counts)\n"
"\n"
"The columns so far, and empty columns for the next rows. ``buffers``: what allocate gave\n"
"(each holding ``sizes[i]`` bytes at its start, the rest unused), in order\n"
"key validity, offsets, data; value validity, offsets, data; offset; timestamp (us);\n"
"timestamp type; producer id; producer epoch; sequence; then the headers: list offsets,\n"
"key offsets, key data, value validity, value offsets, value data. ``null counts``: keys,\n"
"values, header values, and the number of headers. Validity bitmaps and the little-endian\n"
"numbers are as Arrow lays them out.");

static PyObject *
columns_take(ArrowColumns *self, PyObject *unused)
{
    Py_ssize_t capacities[N_BUFS];
    PyObject *buffers = PyTuple_New(N_BUFS), *sizes = PyTuple_New(N_BUFS);
    if (buffers == NULL || sizes == NULL) {
        Py_XDECREF(buffers);
        Py_XDECREF(sizes);
        return NULL;
    }
    for (int i = 0; i < N_BUFS; i++) {
        Buf *b = &self->bufs[i];
        capacities[i] = b->size;
        PyObject *size = PyLong_FromSsize_t(b->size);
        if (size == NULL) {
            Py_DECREF(buffers);
            Py_DECREF(sizes);
            return NULL;
        }
        PyTuple_SET_ITEM(sizes, i, size);
        Py_INCREF(b->obj);
        PyTuple_SET_ITEM(buffers, i, b->obj);
    }
    PyObject *result = Py_BuildValue("(nNN(nnnn))", self->rows, buffers, sizes,
                                     self->key_nulls, self->value_nulls, self->hvalue_nulls,
                                     self->headers);
    if (result == NULL || columns_reset(self, capacities) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *
columns_len(ArrowColumns *self, void *closure)
{
    return PyLong_FromSsize_t(self->rows);
}

static PyObject *
columns_bytes(ArrowColumns *self, void *closure)
{
    return PyLong_FromSsize_t(self->data_bytes);
}

static PyMethodDef columns_methods[] = {
    {"add", (PyCFunction)(void (*)(void))columns_add, METH_FASTCALL, columns_add_doc},
    {"take", (PyCFunction)columns_take, METH_NOARGS, columns_take_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef columns_getset[] = {
    {"rows", (getter)columns_len, NULL, "rows held", NULL},
    {"bytes", (getter)columns_bytes, NULL, "bytes of keys and values held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ArrowColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "oncelog.protocol._records.ArrowColumns",
    .tp_doc = PyDoc_STR("ArrowColumns(include_headers, allocate): records of batches into the\n"
                        "buffers of Arrow columns, each from allocate(size), a writable buffer\n"
                        "(spark/columns.py builds the arrays)."),
    .tp_basicsize = sizeof(ArrowColumns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)columns_init,
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_methods = columns_methods,
    .tp_getset = columns_getset,
};

static PyMethodDef methods[] = {
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL,
     decode_records_doc},
    {"consumer_records", (PyCFunction)(void (*)(void))consumer_records, METH_FASTCALL,
     consumer_records_doc},
    {"check_records", (PyCFunction)(void (*)(void))check_records, METH_FASTCALL,
     check_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "oncelog.protocol._records",
    "The compiled core of oncelog.protocol.records (optional; see _records.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    EMPTY_TUPLE = PyTuple_New(0);
    if (EMPTY_TUPLE == NULL)
        return NULL;
    DecodeError = PyExc_ValueError;
    if (PyType_Ready(&RecordBuilderType) < 0 || PyType_Ready(&ArrowColumnsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&RecordBuilderType);
    if (PyModule_AddObject(module, "RecordBuilder", (PyObject *)&RecordBuilderType) < 0) {
        Py_DECREF(&RecordBuilderType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&ArrowColumnsType);
    if (PyModule_AddObject(module, "ArrowColumns", (PyObject *)&ArrowColumnsType) < 0) {
        Py_DECREF(&ArrowColumnsType);
        Py_DECREF(module);
        return NULL;
    }
    static RecordBuilderCAPI capi = {&RecordBuilderType, builder_add, builder_add_raw};
    PyObject *capsule = PyCapsule_New(&capi, RECORD_BUILDER_CAPI_NAME, NULL);
    if (capsule == NULL || PyModule_AddObject(module, "CAPI", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
