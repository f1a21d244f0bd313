/* SPDX-License-Identifier: MIT */
/*
 * Model (kiln.Model, also known as kiln.Dir), the Python face of one kiln_model, and the Owner
 * that holds it.
 *
 * kiln.open() opens one kiln_model: a KLNT file, or the whole series when the path is a shard of
 * one (kiln_model_open() finds the siblings; the module parses no names). Model indexes are the
 * model's (shard 0's tensors first); a Tensor's shard is its view's file and its `index` the
 * descriptor index in that file.
 *
 * Lifetime: every open model belongs to one Owner object. The Model, every Tensor
 * view, every numpy array (as its base) and every DLPack capsule (through its manager context)
 * hold a reference on the Owner, and only the Owner's deallocation closes it. Model.close() drops
 * the Model's reference, so arrays made before it keep the mappings (or the owned blocks of the
 * read/uring sources) alive until the last of them is gone: no array can dangle.
 *
 * Files are mapped copy-on-write by default (KILN_OPEN_PRIVATE): torch has no read-only tensors,
 * so a tensor made through DLPack may be written, and the write must copy a page, not fault.
 */
#include "kiln_py.h"

/* ---------------------------------------------------------------------------------------------
 * Owner: the one reference-counted holder of a kiln_model
 * ------------------------------------------------------------------------------------------- */

static void owner_dealloc(OwnerObject *self)
{
	kiln_model_close(self->model);
	if (self->holding)
		PyBuffer_Release(&self->held);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject OwnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._kiln.Owner",
    .tp_basicsize = sizeof(OwnerObject),
    .tp_dealloc = (destructor)owner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Owns an open model, one file or a series (its mappings or owned blocks); closes "
	      "it when the last Model, Tensor, array or DLPack capsule using it is gone.",
};

/* ---------------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------------- */

static OwnerObject *model_owner(ModelObject *self)
{
	if (!self->owner)
		PyErr_SetString(PyExc_ValueError, "the directory is closed");
	return self->owner;
}

static void model_dealloc(ModelObject *self)
{
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static Py_ssize_t model_len(ModelObject *self)
{
	OwnerObject *o = model_owner(self);
	return o ? (Py_ssize_t)kiln_model_count(o->model) : -1;
}

static PyObject *model_item(ModelObject *self, Py_ssize_t i)
{
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	Py_ssize_t n = (Py_ssize_t)kiln_model_count(o->model);
	if (i < 0)
		i += n;
	if (i < 0 || i >= n) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return NULL;
	}
	return tensor_new(o, kiln_model_tensor(o->model, (uint64_t)i));
}

/* The tensor a str names, in any shard; NULL with KeyError when none. */
static const kiln_tensor *find_name(OwnerObject *o, PyObject *key)
{
	Py_ssize_t len;
	const char *s = PyUnicode_AsUTF8AndSize(key, &len);
	if (!s)
		return NULL;
	const kiln_tensor *t = kiln_model_find(o->model, s, (size_t)len);
	if (!t)
		PyErr_SetObject(PyExc_KeyError, key);
	return t;
}

static PyObject *model_subscript(ModelObject *self, PyObject *key)
{
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	if (PyUnicode_Check(key)) {
		const kiln_tensor *t = find_name(o, key);
		return t ? tensor_new(o, t) : NULL;
	}
	Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
	if (i == -1 && PyErr_Occurred())
		return NULL;
	return model_item(self, i);
}

static int model_contains(ModelObject *self, PyObject *key)
{
	OwnerObject *o = model_owner(self);
	if (!o)
		return -1;
	if (!PyUnicode_Check(key))
		return 0;
	Py_ssize_t len;
	const char *s = PyUnicode_AsUTF8AndSize(key, &len);
	if (!s)
		return -1;
	return kiln_model_find(o->model, s, (size_t)len) != NULL;
}

static PyObject *model_keys(ModelObject *self, PyObject *unused)
{
	(void)unused;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	uint64_t n = kiln_model_count(o->model);
	PyObject *list = PyList_New(0);
	for (uint64_t i = 0; list && i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(o->model, i);
		if (!t->name)
			continue;
		PyObject *name = name_of(t->name, t->name_len);
		if (!name || PyList_Append(list, name) < 0) {
			Py_XDECREF(name);
			Py_CLEAR(list);
			break;
		}
		Py_DECREF(name);
	}
	return list;
}

static PyObject *model_close(ModelObject *self, PyObject *unused)
{
	(void)unused;
	Py_CLEAR(self->owner);
	Py_RETURN_NONE;
}

static PyObject *model_enter(ModelObject *self, PyObject *unused)
{
	(void)unused;
	if (!model_owner(self))
		return NULL;
	return Py_NewRef((PyObject *)self);
}

static PyObject *model_exit(ModelObject *self, PyObject *args)
{
	(void)args;
	Py_CLEAR(self->owner);
	Py_RETURN_FALSE;
}

static PyObject *model_verify_payload(ModelObject *self, PyObject *unused)
{
	(void)unused;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	kiln_error err;
	int rc;
	/* The reference keeps the model open even if another thread closes the Model. */
	Py_INCREF(o);
	const kiln_model *m = o->model;
	Py_BEGIN_ALLOW_THREADS rc = kiln_model_verify(m, &err); /* every shard */
	Py_END_ALLOW_THREADS Py_DECREF(o);
	if (rc)
		return raise_kiln(rc, &err);
	Py_RETURN_NONE;
}

/* The model index a key names (over the whole series for a series): a str (name), an int
 * (index, negative from the end) or a Tensor of this directory. -1 with an exception set
 * otherwise. */
static int resolve_index(OwnerObject *o, PyObject *key, uint64_t *out)
{
	uint64_t n = kiln_model_count(o->model);
	if (PyUnicode_Check(key)) {
		const kiln_tensor *t = find_name(o, key);
		if (!t)
			return -1;
		*out = t->index;
		return 0;
	}
	if (PyObject_TypeCheck(key, &TensorType)) {
		TensorObject *t = (TensorObject *)key;
		if (t->owner != o) {
			PyErr_SetString(PyExc_ValueError,
					"the tensor belongs to another directory");
			return -1;
		}
		*out = t->t->index;
		return 0;
	}
	Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
	if (i == -1 && PyErr_Occurred())
		return -1;
	if (i < 0)
		i += (Py_ssize_t)n;
	if (i < 0 || (uint64_t)i >= n) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return -1;
	}
	*out = (uint64_t)i;
	return 0;
}

/* Indices for a sequence of keys (None: every tensor) in new PyMem memory (*out, *count). */
static int resolve_indices(OwnerObject *o, PyObject *keys, uint64_t **out, size_t *count)
{
	uint64_t n = kiln_model_count(o->model);
	PyObject *seq = keys == Py_None ? NULL : PySequence_Fast(keys, "expected a sequence");
	if (keys != Py_None && !seq)
		return -1;
	Py_ssize_t len = seq ? PySequence_Fast_GET_SIZE(seq) : (Py_ssize_t)n;
	uint64_t *idx = PyMem_Malloc(len ? (size_t)len * sizeof(*idx) : 1);
	if (!idx) {
		Py_XDECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		if (!seq) {
			idx[i] = (uint64_t)i;
		} else if (resolve_index(o, PySequence_Fast_GET_ITEM(seq, i), &idx[i]) < 0) {
			Py_DECREF(seq);
			PyMem_Free(idx);
			return -1;
		}
	}
	Py_XDECREF(seq);
	*out = idx;
	*count = (size_t)len;
	return 0;
}

static PyObject *model_hint(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"tensors", "hint", NULL};
	PyObject *keys = Py_None;
	const char *name = "willneed";
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|Os:hint", kwlist, &keys, &name))
		return NULL;
	static const char *const hints[] = {"willneed", "dontneed", "cold", "pageout"};
	unsigned hint = 0;
	while (hint < 4 && strcmp(name, hints[hint]))
		hint++;
	if (hint == 4)
		return PyErr_Format(PyExc_ValueError,
				    "hint must be willneed, dontneed, cold or pageout, not \"%s\"",
				    name);
	OwnerObject *o = model_owner(self);
	uint64_t *idx;
	size_t count;
	if (!o || resolve_indices(o, keys, &idx, &count) < 0)
		return NULL;
	kiln_error err;
	int rc;
	Py_INCREF(o);
	const kiln_model *m = o->model;
	/* One call: the model sends each tensor to its own shard's mapping. */
	Py_BEGIN_ALLOW_THREADS rc = kiln_tensor_hint(m, idx, count, hint, &err);
	Py_END_ALLOW_THREADS Py_DECREF(o);
	PyMem_Free(idx);
	if (rc)
		return raise_kiln(rc, &err);
	Py_RETURN_NONE;
}

/* The (tensor, buffer) pairs of stream, load and group_load, checked: each key resolved, each
 * buffer writable and large enough; keys_only: keys alone, no buffers (kiln allocates). */
struct pairs {
	PyObject *seq, *keys; /* keys: each pair's key, in order */
	Py_ssize_t n, got;    /* got: buffers held */
	uint64_t *idx;
	void **dests;
	Py_buffer *views;
};

static void pairs_release(struct pairs *p)
{
	for (Py_ssize_t i = 0; i < p->got; i++)
		PyBuffer_Release(&p->views[i]);
	PyMem_Free(p->idx);
	PyMem_Free(p->dests);
	PyMem_Free(p->views);
	Py_XDECREF(p->keys);
	Py_XDECREF(p->seq);
}

static int pairs_take(OwnerObject *o, PyObject *pairs, int keys_only, const char *what,
		      struct pairs *p)
{
	memset(p, 0, sizeof(*p));
	p->seq = PySequence_Fast(pairs, keys_only ? "expected a sequence of tensors"
						  : "pairs must be a sequence of (tensor, buffer)");
	if (!p->seq)
		return -1;
	Py_ssize_t n = p->n = PySequence_Fast_GET_SIZE(p->seq);
	p->keys = PyList_New(n);
	p->idx = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*p->idx));
	p->dests = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*p->dests));
	p->views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*p->views));
	if (!p->keys || !p->idx || !p->dests || !p->views) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *key = PySequence_Fast_GET_ITEM(p->seq, i), *buf = NULL;
		if (!keys_only && !PyArg_ParseTuple(key, "OO", &key, &buf)) {
			PyErr_Format(PyExc_TypeError, "%s: item %zd is not a (tensor, buffer) pair",
				     what, i);
			return -1;
		}
		if (resolve_index(o, key, &p->idx[i]) < 0)
			return -1;
		Py_INCREF(key);
		PyList_SET_ITEM(p->keys, i, key);
		if (keys_only)
			continue;
		if (PyObject_GetBuffer(buf, &p->views[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
			return -1;
		p->got = i + 1;
		const kiln_tensor *t = kiln_model_tensor(o->model, p->idx[i]);
		if ((uint64_t)p->views[i].len < t->byte_length) {
			PyErr_Format(PyExc_ValueError,
				     "a buffer of %zd bytes cannot hold tensor %llu (%llu bytes)",
				     p->views[i].len, (unsigned long long)local_index(o->model, t),
				     (unsigned long long)t->byte_length);
			return -1;
		}
		p->dests[i] = p->views[i].buf;
	}
	return 0;
}

/*
 * stream(pairs, *, engine="auto", direct=False, chunk_size=0, queue_depth=0): read payloads
 * from the file into caller buffers; pairs is a sequence of (key, writable buffer).
 */
static PyObject *model_stream(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"pairs", "engine", "direct", "chunk_size", "queue_depth", NULL};
	PyObject *pairs;
	const char *engine = "auto";
	int direct = 0;
	unsigned int chunk = 0, depth = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$spII:stream", kwlist, &pairs, &engine,
					 &direct, &chunk, &depth))
		return NULL;
	kiln_stream_options so;
	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	if (!strcmp(engine, "auto"))
		so.engine = KILN_ENGINE_AUTO;
	else if (!strcmp(engine, "uring"))
		so.engine = KILN_ENGINE_URING;
	else if (!strcmp(engine, "pread"))
		so.engine = KILN_ENGINE_PREAD;
	else
		return PyErr_Format(PyExc_ValueError,
				    "engine must be auto, uring or pread, not \"%s\"", engine);
	so.flags = direct ? KILN_STREAM_DIRECT : 0;
	so.chunk_size = chunk;
	so.queue_depth = depth;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	struct pairs pp;
	PyObject *ret = NULL;
	if (pairs_take(o, pairs, 0, "stream", &pp) < 0)
		goto out;
	Py_ssize_t n = pp.n;
	uint64_t *idx = pp.idx;
	void **dests = pp.dests;
	kiln_stream_result res;
	kiln_error err;
	int rc;
	memset(&res, 0, sizeof(res));
	Py_INCREF(o);
	const kiln_model *m = o->model;
	/* A series streams through one queue across its files. */
	Py_BEGIN_ALLOW_THREADS rc =
	    kiln_stream(m, idx, (size_t)n, (void *const *)dests, &so, &res, &err);
	Py_END_ALLOW_THREADS Py_DECREF(o);
	if (rc) {
		raise_kiln(rc, &err);
		goto out;
	}
	ret = Py_BuildValue("{s:K,s:K,s:K,s:s,s:O,s:i,s:i}", "bytes", (unsigned long long)res.bytes,
			    "chunks", (unsigned long long)res.chunks, "retries",
			    (unsigned long long)res.retries, "engine",
			    res.engine == KILN_ENGINE_URING ? "uring" : "pread", "direct",
			    res.direct ? Py_True : Py_False, "uring_fallback", res.uring_fallback,
			    "direct_fallback", res.direct_fallback);
out:
	pairs_release(&pp);
	return ret;
}

/*
 * read_slices(items, *, direct=False): kiln_read_slices, one queue of reads for many slices;
 * items is a sequence of (key, axis, start, stop, buffer), the slice's bytes landing in the
 * buffer (at least kiln_slice_size() bytes). Works on every open, directory-only included.
 */
static PyObject *model_read_slices(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"items", "direct", NULL};
	PyObject *items;
	int direct = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$p:read_slices", kwlist, &items, &direct))
		return NULL;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	PyObject *seq = PySequence_Fast(items, "items must be a sequence of "
					       "(tensor, axis, start, stop, buffer)");
	if (!seq)
		return NULL;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
	uint64_t *idx = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*idx));
	kiln_slice *sl = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*sl));
	void **dests = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*dests));
	Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*views));
	PyObject *ret = NULL;
	if (!idx || !sl || !dests || !views) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *key, *buf;
		Py_ssize_t axis, start, stop;
		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OnnnO", &key, &axis,
				      &start, &stop, &buf)) {
			PyErr_Format(PyExc_TypeError,
				     "read_slices: item %zd is not (tensor, axis, start, stop, "
				     "buffer)",
				     i);
			goto out;
		}
		/* Checked here: unsigned conversions would wrap -1 into a huge bound. */
		if (axis < 0 || start < 0 || stop < 0) {
			PyErr_Format(
			    PyExc_ValueError,
			    "read_slices: item %zd: axis, start and stop must be 0 or more "
			    "(got %zd, %zd, %zd)",
			    i, axis, start, stop);
			goto out;
		}
		if (resolve_index(o, key, &idx[i]) < 0)
			goto out;
		sl[i] = (kiln_slice){.axis = (uint32_t)(axis > UINT32_MAX ? UINT32_MAX : axis),
				     .start = (uint64_t)start,
				     .stop = (uint64_t)stop};
		const kiln_tensor *t = kiln_model_tensor(o->model, idx[i]);
		uint64_t need;
		kiln_error err;
		int rc = kiln_slice_size(t, &sl[i], &need, &err);
		if (rc) {
			raise_kiln(rc, &err);
			goto out;
		}
		if (PyObject_GetBuffer(buf, &views[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
			goto out;
		got = i + 1;
		if ((uint64_t)views[i].len < need) {
			PyErr_Format(PyExc_ValueError,
				     "a buffer of %zd bytes cannot hold the slice of tensor %llu "
				     "(%llu bytes)",
				     views[i].len, (unsigned long long)local_index(o->model, t),
				     (unsigned long long)need);
			goto out;
		}
		dests[i] = views[i].buf;
	}
	kiln_stream_options so;
	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	so.flags = direct ? KILN_STREAM_DIRECT : 0;
	kiln_stream_result res;
	memset(&res, 0, sizeof(res));
	kiln_error err;
	int rc;
	Py_INCREF(o);
	const kiln_model *m = o->model;
	Py_BEGIN_ALLOW_THREADS rc =
	    kiln_read_slices(m, idx, sl, (size_t)n, (void *const *)dests, &so, &res, &err);
	Py_END_ALLOW_THREADS Py_DECREF(o);
	if (rc)
		raise_kiln(rc, &err);
	else
		ret = PyLong_FromUnsignedLongLong(res.bytes);
out:
	for (Py_ssize_t i = 0; i < got; i++)
		PyBuffer_Release(&views[i]);
	PyMem_Free(idx);
	PyMem_Free(sl);
	PyMem_Free(dests);
	PyMem_Free(views);
	Py_DECREF(seq);
	return ret;
}
/* kiln_load's callbacks, on the calling thread with the GIL released: each takes it back. A
 * Python exception stops the load and is kept for load() to raise. */
struct load_cb {
	PyObject *progress, *on_ready, *keys;
	int failed;
	const uint32_t *device_of; /* by model index: the device of each tensor loaded */
};

static uint32_t load_place(void *ctx, const kiln_tensor *t)
{
	const struct load_cb *cb = ctx;
	return cb->device_of ? cb->device_of[t->index] : 0;
}

static int load_progress(void *ctx, const kiln_load_progress *p)
{
	struct load_cb *cb = ctx;
	if (cb->failed)
		return cb->failed;
	PyGILState_STATE g = PyGILState_Ensure();
	/* Every 50 ms, with or without a callback: Ctrl-C's KeyboardInterrupt (any signal handler's
	 * exception) stops the load, reads in flight included, instead of waiting for its end. */
	if (PyErr_CheckSignals() < 0) {
		cb->failed = 1;
	} else if (cb->progress) {
		PyObject *r =
		    PyObject_CallFunction(cb->progress, "KK", (unsigned long long)p->bytes,
					  (unsigned long long)p->bytes_total);
		cb->failed = r == NULL;
		Py_XDECREF(r);
	}
	PyGILState_Release(g);
	return cb->failed;
}

static int load_ready(void *ctx, const kiln_ready *rd)
{
	struct load_cb *cb = ctx;
	if (!cb->on_ready || cb->failed)
		return cb->failed;
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *r = PyObject_CallFunctionObjArgs(
	    cb->on_ready, PySequence_Fast_GET_ITEM(cb->keys, (Py_ssize_t)rd->position), NULL);
	cb->failed = r == NULL;
	Py_XDECREF(r);
	PyGILState_Release(g);
	return cb->failed;
}

/* The arena, then the device it is on (its capsule, the context: kept open until here). */
static void free_arena_capsule(PyObject *cap)
{
	PyObject *device = PyCapsule_GetContext(cap);
	kiln_arena_free(PyCapsule_GetPointer(cap, "kiln.arena"));
	Py_XDECREF(device);
}

/* device= and place= of load(): the device table of a "kiln.device" capsule, and each tensor's
 * device by model index (*out, PyMem; NULL when every tensor goes to device 0). */
static int load_device(OwnerObject *o, PyObject *device, PyObject *place, const struct pairs *pp,
		       const struct kp_device **dev, uint32_t **out)
{
	*dev = NULL;
	*out = NULL;
	if (device == Py_None) {
		if (place != Py_None) {
			PyErr_SetString(PyExc_ValueError, "place= needs device=");
			return -1;
		}
		return 0;
	}
	*dev = PyCapsule_GetPointer(device, "kiln.device");
	if (!*dev)
		return -1;
	if (place == Py_None)
		return 0;
	uint64_t count = kiln_model_count(o->model);
	uint32_t *d = PyMem_Calloc(count ? (size_t)count : 1, sizeof(*d));
	if (!d) {
		PyErr_NoMemory();
		return -1;
	}
	PyObject *seq = PyLong_Check(place) ? NULL
					    : PySequence_Fast(place, "place must be an int or "
								     "one int per tensor");
	if (!PyLong_Check(place) && !seq) {
		PyMem_Free(d);
		return -1;
	}
	if (seq && PySequence_Fast_GET_SIZE(seq) != pp->n) {
		PyErr_Format(PyExc_ValueError, "place has %zd devices for %zd tensors",
			     PySequence_Fast_GET_SIZE(seq), pp->n);
		goto fail;
	}
	for (Py_ssize_t i = 0; i < pp->n; i++) {
		long v = PyLong_AsLong(seq ? PySequence_Fast_GET_ITEM(seq, i) : place);
		if (v == -1 && PyErr_Occurred())
			goto fail;
		if (v < 0 || (uint64_t)v >= ((*dev)->count ? (*dev)->count : 1)) {
			PyErr_Format(PyExc_ValueError, "device %ld: there are %u", v,
				     (*dev)->count ? (*dev)->count : 1);
			goto fail;
		}
		d[pp->idx[i]] = (uint32_t)v;
	}
	Py_XDECREF(seq);
	*out = d;
	return 0;
fail:
	Py_XDECREF(seq);
	PyMem_Free(d);
	return -1;
}

/* The dtype codes named by typed= (a sequence of kiln dtype names), as a bit per code. */
static int typed_codes(PyObject *typed, uint64_t *mask)
{
	*mask = 0;
	if (typed == Py_None)
		return 0;
	PyObject *seq = PySequence_Fast(typed, "typed must be a sequence of dtype names");
	if (!seq)
		return -1;
	for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
		const char *name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
		unsigned code = name ? kiln_dtype_from_name(name) : 0;
		if (!name || !code || code >= 64 || !kp_dlpack_typed(code)) {
			if (name)
				PyErr_Format(PyExc_ValueError,
					     "typed: \"%s\" is not a dtype DLPack can carry", name);
			Py_DECREF(seq);
			return -1;
		}
		*mask |= (uint64_t)1 << code;
	}
	Py_DECREF(seq);
	return 0;
}

/*
 * load(pairs, *, threads=0, direct=False, drop_cache=False, inflight=0, progress=None,
 * on_ready=None, arena=False, device=None, place=None, register=False, typed=None): kiln_load
 * into caller buffers, in the order of pairs; with arena=True, pairs are keys alone and the
 * result's "capsules" view kiln's own block, as uint8 bytes, or typed and shaped for the dtypes
 * named in typed (the consumer's DLPack decides which it takes: one call per tensor saved);
 * register: KILN_LOAD_REGISTER (a GPU device).
 */
static PyObject *model_load(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"pairs",    "threads",  "direct", "drop_cache", "inflight",
				 "progress", "on_ready", "arena",  "device",     "place",
				 "register", "typed",    NULL};
	PyObject *pairs, *progress = Py_None, *on_ready = Py_None, *device = Py_None,
			 *place = Py_None, *typed = Py_None;
	unsigned int threads = 0;
	int direct = 0, drop = 0, arena = 0, reg = 0;
	unsigned long long inflight = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$IppKOOpOOpO:load", kwlist, &pairs, &threads,
					 &direct, &drop, &inflight, &progress, &on_ready, &arena,
					 &device, &place, &reg, &typed))
		return NULL;
	uint64_t typed_mask;
	if (typed_codes(typed, &typed_mask) < 0)
		return NULL;
	if (typed_mask && (!arena || device != Py_None))
		return PyErr_Format(PyExc_ValueError, "typed= shapes host arena capsules: "
						      "arena=True without device=");
	if (device != Py_None && !arena)
		return PyErr_Format(PyExc_ValueError,
				    "device= loads into kiln's arena: arena=True");
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	struct pairs pp;
	PyObject *ret = NULL;
	const struct kp_device *dev = NULL;
	uint32_t *device_of = NULL;
	if (pairs_take(o, pairs, arena, "load", &pp) < 0 ||
	    load_device(o, device, place, &pp, &dev, &device_of) < 0)
		goto out;
	Py_ssize_t n = pp.n;
	uint64_t *idx = pp.idx;
	void **dests = pp.dests;
	PyObject *keys = pp.keys;
	struct load_cb cb = {.progress = progress == Py_None ? NULL : progress,
			     .on_ready = on_ready == Py_None ? NULL : on_ready,
			     .keys = keys,
			     .device_of = device_of};
	kiln_load_options lo;
	memset(&lo, 0, sizeof(lo));
	lo.size = sizeof(lo);
	lo.threads = threads;
	lo.flags = (direct ? KILN_LOAD_DIRECT : 0) | (drop ? KILN_LOAD_DROP_CACHE : 0) |
		   (reg ? KILN_LOAD_REGISTER : 0);
	lo.inflight_bytes = inflight;
	lo.dests = arena ? NULL : (void *const *)dests;
	lo.progress = load_progress;
	/* only when asked: without a listener kiln_load reads a run a thread (kiln/load.h) */
	lo.on_ready = cb.on_ready ? load_ready : NULL;
	lo.ctx = &cb;
	lo.device = dev ? dev->device : NULL;
	lo.place = device_of ? load_place : NULL;
	kiln_load_result res;
	kiln_error err;
	kiln_arena *block = NULL;
	int rc;
	Py_INCREF(o);
	const kiln_model *m = o->model;
	Py_BEGIN_ALLOW_THREADS rc =
	    kiln_load(m, idx, (size_t)n, &lo, dests, arena ? &block : NULL, &res, &err);
	Py_END_ALLOW_THREADS Py_DECREF(o);
	if (cb.failed) {
		kiln_arena_free(block);
		goto out; /* the callback's exception */
	}
	if (rc) {
		raise_kiln(rc, &err);
		goto out;
	}
	ret = Py_BuildValue("{s:K,s:K,s:I,s:d,s:K,s:O}", "bytes", (unsigned long long)res.bytes,
			    "tensors", (unsigned long long)res.tensors, "threads", res.threads,
			    "seconds", res.seconds, "peak_inflight",
			    (unsigned long long)res.peak_inflight, "direct",
			    res.direct ? Py_True : Py_False);
	if (ret && arena) {
		/* One capsule (host) or view (a device) per tensor, each holding the arena's own
		 * capsule, which holds the device: the block is freed when the last tensor made
		 * from them is gone, and the device closed after it. */
		PyObject *owner = PyCapsule_New(block, "kiln.arena", free_arena_capsule);
		if (owner && dev) {
			Py_INCREF(device);
			PyCapsule_SetContext(owner, device);
		}
		PyObject *caps = owner ? PyList_New(n) : NULL;
		if (!owner)
			kiln_arena_free(block);
		for (Py_ssize_t i = 0; caps && i < n; i++) {
			const kiln_tensor *t = kiln_model_tensor(o->model, idx[i]);
			PyObject *c = NULL;
			if (dev) {
				PyObject *tv = tensor_new(o, t);
				c = tv ? kp_device_view(
					     owner, (TensorObject *)tv, dests[i], dev->dl_type,
					     (int32_t)(device_of ? device_of[t->index] : 0))
				       : NULL;
				Py_XDECREF(tv);
			} else if (t->dtype < 64 && typed_mask >> t->dtype & 1) {
				c = kp_typed_capsule(t, dests[i], owner);
			} else {
				c = kp_bytes_capsule(dests[i], t->byte_length, owner);
			}
			if (!c)
				Py_CLEAR(caps);
			else
				PyList_SET_ITEM(caps, i, c);
		}
		Py_XDECREF(owner);
		if (!caps || PyDict_SetItemString(ret, dev ? "views" : "capsules", caps) < 0)
			Py_CLEAR(ret);
		Py_XDECREF(caps);
	}
out:
	PyMem_Free(device_of);
	pairs_release(&pp);
	return ret;
}

/* The collective of group_load: the Python all_gather(mine, all) with the GIL taken back; its
 * exception is kept for group_load to raise, and the load sees an IO failure. */
struct group_cb {
	PyObject *all_gather;
	Py_ssize_t world;
	PyObject *exc_type, *exc_value, *exc_tb;
};

static int group_all_gather(void *ctx, const void *mine, void *all, size_t len, kiln_error *err)
{
	struct group_cb *cb = ctx;
	if (cb->exc_type)
		return kiln_error_set(err, KILN_IO, 0, "all_gather raised before");
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *a = PyMemoryView_FromMemory((char *)mine, (Py_ssize_t)len, PyBUF_READ);
	PyObject *b =
	    a ? PyMemoryView_FromMemory((char *)all, (Py_ssize_t)len * cb->world, PyBUF_WRITE)
	      : NULL;
	PyObject *r = b ? PyObject_CallFunctionObjArgs(cb->all_gather, a, b, NULL) : NULL;
	int rc = 0;
	if (!r) {
		PyErr_Fetch(&cb->exc_type, &cb->exc_value, &cb->exc_tb);
		PyObject *s = cb->exc_value ? PyObject_Str(cb->exc_value) : NULL;
		const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
		if (!msg)
			PyErr_Clear();
		rc = kiln_error_set(err, KILN_IO, 0, "all_gather raised: %.400s",
				    msg ? msg : "an exception");
		Py_XDECREF(s);
	}
	Py_XDECREF(r);
	/* The views must not outlive the buffers: release them now. */
	if (b)
		PyObject_CallMethod(b, "release", NULL) ? (void)0 : PyErr_Clear();
	if (a)
		PyObject_CallMethod(a, "release", NULL) ? (void)0 : PyErr_Clear();
	Py_XDECREF(b);
	Py_XDECREF(a);
	PyGILState_Release(g);
	return rc;
}

/*
 * group_load(pairs, rank, world, all_gather, *, chunk_size=0, direct=False, verify_all=False):
 * kiln_group_load
 * into caller buffers; all_gather(mine, all) gets a read-only memoryview of this rank's bytes
 * and a writable one of world times as many, to fill with every rank's in rank order.
 */
static PyObject *model_group_load(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"pairs",      "rank",   "world",      "all_gather",
				 "chunk_size", "direct", "verify_all", NULL};
	PyObject *pairs, *fn;
	unsigned int rank, world, chunk = 0;
	int direct = 0, verify_all = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIO|$Ipp:group_load", kwlist, &pairs, &rank,
					 &world, &fn, &chunk, &direct, &verify_all))
		return NULL;
	if (!PyCallable_Check(fn))
		return PyErr_Format(PyExc_TypeError, "all_gather must be callable");
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	struct pairs pp;
	PyObject *ret = NULL;
	if (pairs_take(o, pairs, 0, "group_load", &pp) < 0)
		goto out;
	Py_ssize_t n = pp.n;
	uint64_t *idx = pp.idx;
	void **dests = pp.dests;
	struct group_cb cb = {.all_gather = fn, .world = (Py_ssize_t)world};
	kiln_collective c;
	memset(&c, 0, sizeof(c));
	c.size = sizeof(c);
	c.rank = rank;
	c.world = world;
	c.ctx = &cb;
	c.all_gather = group_all_gather;
	kiln_group_options go;
	memset(&go, 0, sizeof(go));
	go.size = sizeof(go);
	go.chunk_size = chunk;
	go.flags = (direct ? KILN_LOAD_DIRECT : 0) | (verify_all ? KILN_GROUP_VERIFY_ALL : 0);
	kiln_group_result res;
	kiln_error err;
	int rc;
	Py_INCREF(o);
	const kiln_model *m = o->model;
	Py_BEGIN_ALLOW_THREADS rc =
	    kiln_group_load(m, idx, (size_t)n, (void *const *)dests, &c, &go, &res, &err);
	Py_END_ALLOW_THREADS Py_DECREF(o);
	if (cb.exc_type) {
		PyErr_Restore(cb.exc_type, cb.exc_value, cb.exc_tb); /* the collective's own */
		goto out;
	}
	if (rc) {
		raise_kiln(rc, &err);
		goto out;
	}
	ret = Py_BuildValue(
	    "{s:K,s:K,s:K,s:K,s:K}", "bytes_read", (unsigned long long)res.bytes_read,
	    "bytes_received", (unsigned long long)res.bytes_received, "rounds",
	    (unsigned long long)res.rounds, "staging_bytes", (unsigned long long)res.staging_bytes,
	    "bytes_verified", (unsigned long long)res.bytes_verified);
out:
	pairs_release(&pp);
	return ret;
}

static PyObject *model_get_info(ModelObject *self, void *c)
{
	(void)c;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	kiln_model_info in;
	kiln_file_info first;
	kiln_model_get_info(o->model, &in);
	kiln_model_file_info(o->model, 0, &first);
	/* A series: counts and sizes are totals over the shards, verified once every shard is;
	 * version, flags and payload_base are the first shard's, source and auto_choice the first
	 * shard's too, the fallbacks any shard's, direct every shard's. */
	uint64_t names = 0, payload = 0, directory = 0, block = 0;
	for (uint32_t s = 0; s < in.files; s++) {
		kiln_file_info fi;
		kiln_model_file_info(o->model, s, &fi);
		names += fi.name_bytes;
		payload += fi.payload_bytes;
		directory += fi.directory_bytes;
		block += fi.size;
	}
	const char *src = kiln_source_name(in.source);
	static const char *const why[] = {"", "cached", "cold", "large", "unmappable", "owned"};
	const char *choice =
	    in.auto_choice < sizeof(why) / sizeof(why[0]) ? why[in.auto_choice] : "?";
	return Py_BuildValue(
	    "{s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:O,s:O,s:s,s:i,s:i,s:i,s:I,s:K,s:I,s:s,s:i,s:O,s:K,"
	    "s:K}",
	    "tensor_count", (unsigned long long)in.tensor_count, "name_bytes",
	    (unsigned long long)names, "payload_bytes", (unsigned long long)payload,
	    "directory_bytes", (unsigned long long)directory, "payload_base",
	    (unsigned long long)first.payload_base, "block_length", (unsigned long long)block,
	    "version", (int)first.version, "flags", (int)first.flags, "payload_verified",
	    in.payload_verified ? Py_True : Py_False, "direct", in.direct ? Py_True : Py_False,
	    "source", src ? src : "unknown", "direct_fallback", (int)in.direct_fallback,
	    "uring_fallback", (int)in.uring_fallback, "advice_errno", (int)in.advice_errno,
	    "dio_align", (unsigned int)in.dio_align, "pinned", (unsigned long long)in.pinned,
	    "shards", (unsigned int)in.files, "auto_choice", choice, "cache_refused",
	    (int)in.cache_refused, "digests_verified", in.digests_verified ? Py_True : Py_False,
	    "digest_chunks", (unsigned long long)in.digest_chunks, "digest_bytes",
	    (unsigned long long)in.digest_bytes);
}

/* A metadata value as Python gives it: int, float, bool, str (bytes when not UTF-8), list. */
static PyObject *py_value(const kiln_value *v, int depth)
{
	switch (v->type) {
	case KILN_META_U8:
	case KILN_META_U16:
	case KILN_META_U32:
	case KILN_META_U64:
		return PyLong_FromUnsignedLongLong(v->num.u);
	case KILN_META_I8:
	case KILN_META_I16:
	case KILN_META_I32:
	case KILN_META_I64:
		return PyLong_FromLongLong(v->num.i);
	case KILN_META_F32:
	case KILN_META_F64:
		return PyFloat_FromDouble(v->num.f);
	case KILN_META_BOOL:
		return PyBool_FromLong((long)v->num.u);
	case KILN_META_STRING: {
		if (kiln_utf8_check(v->str, v->str_len) == SIZE_MAX)
			return PyUnicode_DecodeUTF8(v->str, (Py_ssize_t)v->str_len, "strict");
		return PyBytes_FromStringAndSize(v->str, (Py_ssize_t)v->str_len);
	}
	case KILN_META_ARRAY: {
		if (depth > 64)
			return PyErr_Format(PyExc_ValueError, "metadata arrays nested too deep");
		if (v->count > PY_SSIZE_T_MAX)
			return PyErr_NoMemory();
		PyObject *list = PyList_New((Py_ssize_t)v->count);
		kiln_value_iter it;
		kiln_value item;
		kiln_value_iter_init(&it, v);
		for (Py_ssize_t i = 0; list && kiln_value_next(&it, &item); i++) {
			PyObject *x = py_value(&item, depth + 1);
			if (!x) {
				Py_CLEAR(list);
				break;
			}
			PyList_SET_ITEM(list, i, x);
		}
		return list;
	}
	default:
		return PyErr_Format(PyExc_ValueError, "unknown metadata type %u", v->type);
	}
}

/* The model's metadata: {key: value} in file order (with_types: {key: (type, value)}). */
static PyObject *metadata_dict(OwnerObject *o, int with_types)
{
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS rc = kiln_model_metadata(o->model, &e, &n, &err);
	Py_END_ALLOW_THREADS if (rc) return raise_kiln(rc, &err);
	PyObject *d = PyDict_New();
	for (uint64_t i = 0; d && i < n; i++) {
		PyObject *k =
		    PyUnicode_DecodeUTF8(e[i].key, (Py_ssize_t)e[i].key_len, "surrogateescape");
		PyObject *v = k ? py_value(&e[i].value, 0) : NULL;
		if (v && with_types) {
			const char *t = kiln_meta_type_name(e[i].value.type);
			const char *it = kiln_meta_type_name(e[i].value.item_type);
			PyObject *tv = e[i].value.type == KILN_META_ARRAY
					   ? PyUnicode_FromFormat("arr:%s", it ? it : "?")
					   : PyUnicode_FromString(t ? t : "?");
			PyObject *pair = tv ? PyTuple_Pack(2, tv, v) : NULL;
			Py_XDECREF(tv);
			Py_DECREF(v);
			v = pair;
		}
		if (!v || PyDict_SetItem(d, k, v) != 0)
			Py_CLEAR(d);
		Py_XDECREF(k);
		Py_XDECREF(v);
	}
	return d;
}

static PyObject *model_metadata(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"types", NULL};
	int types = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p:metadata", kwlist, &types))
		return NULL;
	OwnerObject *o = model_owner(self);
	return o ? metadata_dict(o, types) : NULL;
}

static PyObject *model_get_format(ModelObject *self, void *c)
{
	(void)c;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	kiln_model_info in;
	kiln_model_get_info(o->model, &in);
	return PyUnicode_FromString(kiln_format_name(in.format));
}

static PyObject *model_get_paths(ModelObject *self, void *c)
{
	(void)c;
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	uint32_t n = kiln_model_files(o->model);
	PyObject *list = PyList_New(n);
	for (uint32_t s = 0; list && s < n; s++) {
		kiln_file_info fi;
		kiln_model_file_info(o->model, s, &fi);
		PyObject *p = fi.path ? PyUnicode_DecodeFSDefault(fi.path) : Py_NewRef(Py_None);
		if (!p) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, s, p);
	}
	return list;
}

static PyObject *model_get_closed(ModelObject *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->owner == NULL);
}

static PyGetSetDef model_getset[] = {
    {"info", (getter)model_get_info, NULL,
     "Header fields, sizes and how the bytes were loaded. For a series (shards > 1) counts and\n"
     "sizes are totals and the other fields are the first shard's.",
     NULL},
    {"paths", (getter)model_get_paths, NULL, "The files open: one, or every shard of a series.",
     NULL},
    {"closed", (getter)model_get_closed, NULL, "True after close().", NULL},
    {"format", (getter)model_get_format, NULL, "\"klnt\", \"safetensors\" or \"gguf\".", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyObject *model_write_digests(ModelObject *self, PyObject *args, PyObject *kw);
static PyObject *model_verify_digests(ModelObject *self, PyObject *unused);

static PyMethodDef model_methods[] = {
    {"keys", (PyCFunction)model_keys, METH_NOARGS, "Names of the named tensors, in file order."},
    {"metadata", (PyCFunction)(void (*)(void))model_metadata, METH_VARARGS | METH_KEYWORDS,
     "metadata(*, types=False) -> dict\n"
     "What the model says besides its tensors, in file order: GGUF key/values as int, float,\n"
     "bool, str (bytes when not UTF-8) and list; safetensors __metadata__ (str); a KLNT file's\n"
     "kiln.metadata document. types=True gives (type, value) pairs, type as GGUF names it\n"
     "(\"u32\", \"str\", \"arr:f32\", ...)."},
    {"verify_payload", (PyCFunction)model_verify_payload, METH_NOARGS,
     "Check the bytes between payloads and the 4-bit padding are zero (raises "
     "FormatTypeError)."},
    {"write_digests", (PyCFunction)(void (*)(void))model_write_digests,
     METH_VARARGS | METH_KEYWORDS,
     "write_digests(*, chunk=None) -> dict\n"
     "Read every byte of every file and write its XXH3-128 digests, one per chunk (a power of\n"
     "two from 4096 to 1 GiB; None: 1 MiB), into FILE.kiln-digest beside it (docs/integrity.md).\n"
     "Returns files, algorithm, source, chunk_bytes, chunks, bytes and content (the first\n"
     "file's table digest, hex). Ctrl-C stops it, leaving no partial sidecar."},
    {"verify_digests", (PyCFunction)model_verify_digests, METH_NOARGS,
     "verify_digests() -> dict\n"
     "Read every byte the sidecars cover and check it: the same dict as write_digests, or\n"
     "kiln.CorruptError naming the file, chunk, byte range and tensor; kiln.Error (cls\n"
     "NOTFOUND) when a file has no digests."},
    {"hint", (PyCFunction)(void (*)(void))model_hint, METH_VARARGS | METH_KEYWORDS,
     "hint(tensors=None, hint=\"willneed\"): advise the kernel about these tensors' pages\n"
     "(names, indices or Tensors; None: all): willneed, dontneed, cold, pageout. mmap only."},
    {"stream", (PyCFunction)(void (*)(void))model_stream, METH_VARARGS | METH_KEYWORDS,
     "stream(pairs, *, engine=\"auto\", direct=False, chunk_size=0, queue_depth=0) -> dict\n"
     "Read payloads from the file into caller buffers, many reads in flight, the GIL\n"
     "released; pairs: (name, index or Tensor, writable buffer of at least nbytes)."},
    {"load", (PyCFunction)(void (*)(void))model_load, METH_VARARGS | METH_KEYWORDS,
     "load(pairs, *, threads=0, direct=False, drop_cache=False, inflight=0, progress=None,\n"
     "on_ready=None, arena=False, device=None, place=None, register=False) -> dict\n"
     "The load pipeline (kiln_load): payloads into caller buffers on reader threads, the GIL\n"
     "released; pairs: (name, index or Tensor, writable buffer), announced in that order\n"
     "(read in it with on_ready; without, each thread reads a contiguous run of the pairs).\n"
     "progress(done, total) in bytes and on_ready(key) run on this thread; an\n"
     "exception in either stops the load and is raised. arena=True: pairs are keys alone,\n"
     "kiln allocates one block (huge pages where the kernel gives them), and the result's\n"
     "\"capsules\" are DLPack capsules (uint8, 1-D) of each tensor's bytes in it, the block\n"
     "freed when the last is gone. device (a kiln._cuda.devices() handle, arena=True): the\n"
     "arena is in that device's memory, placed per tensor by place (an int, or one per pair;\n"
     "a tensor listed twice goes where its last place says),\n"
     "and the result's \"views\" are kiln.DeviceView objects (DLPack on the device).\n"
     "register=True (a device; a model opened whole): no staging, the file's own pages\n"
     "registered a window at a time and copied from (KILN_LOAD_REGISTER)."},
    {"group_load", (PyCFunction)(void (*)(void))model_group_load, METH_VARARGS | METH_KEYWORDS,
     "group_load(pairs, rank, world, all_gather, *, chunk_size=0, direct=False) -> dict\n"
     "Read once per group (kiln_group_load): this rank reads its chunks, all_gather(mine,\n"
     "all) fills `all` (writable, world x len(mine) bytes) with every rank's in rank order;\n"
     "every rank ends with every tensor. Before any chunk, the ranks compare what they opened\n"
     "(an error names the difference)."},
    {"read_slices", (PyCFunction)(void (*)(void))model_read_slices, METH_VARARGS | METH_KEYWORDS,
     "read_slices(items, *, direct=False) -> int\n"
     "Read slices of tensors into buffers (kiln_read_slices): items is a sequence of\n"
     "(tensor, axis, start, stop, buffer), each slice [start, stop) of one axis landing in its\n"
     "buffer as a C-contiguous array of the slice's shape. Only the slice's bytes are read, all\n"
     "in one queue, the GIL released; works on a directory-only open. Returns the bytes read."},
    {"close", (PyCFunction)model_close, METH_NOARGS,
     "Drop this Model's hold on the open model. Arrays, tensors and views made from it stay\n"
     "valid: the model is closed when the last of them is gone."},
    {"__enter__", (PyCFunction)model_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)model_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods model_as_sequence = {
    .sq_length = (lenfunc)model_len,
    .sq_item = (ssizeargfunc)model_item,
    .sq_contains = (objobjproc)model_contains,
};

static PyMappingMethods model_as_mapping = {
    .mp_length = (lenfunc)model_len,
    .mp_subscript = (binaryfunc)model_subscript,
};

/* "kiln.Dir", the type's first name, which users and tests match (kiln.Dir is kiln.Model). */
static PyObject *model_repr(ModelObject *self)
{
	if (!self->owner)
		return PyUnicode_FromString("<kiln.Dir closed>");
	kiln_model_info in;
	kiln_model_get_info(self->owner->model, &in);
	const char *src = kiln_source_name(in.source);
	if (in.files > 1)
		return PyUnicode_FromFormat("<kiln.Dir %llu tensors in %u shards, %s>",
					    (unsigned long long)in.tensor_count,
					    (unsigned int)in.files, src ? src : "unknown");
	return PyUnicode_FromFormat("<kiln.Dir %llu tensors, %llu bytes, %s>",
				    (unsigned long long)in.tensor_count,
				    (unsigned long long)in.bytes, src ? src : "unknown");
}

PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_dealloc = (destructor)model_dealloc,
    .tp_repr = (reprfunc)model_repr,
    .tp_as_sequence = &model_as_sequence,
    .tp_as_mapping = &model_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An open, validated model (KLNT, safetensors or GGUF; one file or a series): len(), "
	      "iteration, [index] and [name] give Tensor views. kiln.Dir is another name of it.",
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

/* ---------------------------------------------------------------------------------------------
 * Module functions
 * ------------------------------------------------------------------------------------------- */

/* A Model with an empty Owner (no model yet): deallocating it is safe at once. */
static ModelObject *new_model(void)
{
	OwnerObject *owner = PyObject_New(OwnerObject, &OwnerType);
	if (!owner)
		return NULL;
	owner->model = NULL;
	owner->holding = 0;
	owner->writable = 0;
	ModelObject *d = PyObject_New(ModelObject, &ModelType);
	if (!d) {
		Py_DECREF(owner);
		return NULL;
	}
	d->owner = owner;
	return d;
}

/* A URL's payload arrives on the opening thread, the GIL released: every 50 ms the signal
 * handlers run (Ctrl-C), and their exception stops the fetch. */
static int open_progress(void *ctx, uint64_t done, uint64_t total)
{
	(void)done, (void)total;
	int *interrupted = ctx;
	PyGILState_STATE g = PyGILState_Ensure();
	if (PyErr_CheckSignals() < 0)
		*interrupted = 1;
	PyGILState_Release(g);
	return *interrupted;
}

/* Model.write_digests / Model.verify_digests (kiln/verify.h): the GIL released, the signal
 * handlers run through open_progress, a dict of what was written or checked. */
static PyObject *digest_report(const kiln_verify_report *r)
{
	char hex[33];
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", r->content[i]);
	const char *alg = kiln_digest_algorithm_name(r->algorithm);
	const char *src = kiln_digest_source_name(r->source);
	return Py_BuildValue("{s:I,s:s,s:s,s:K,s:K,s:K,s:s}", "files", (unsigned)r->files,
			     "algorithm", alg ? alg : "?", "source", src ? src : "?", "chunk_bytes",
			     r->chunk_log2 ? 1ULL << r->chunk_log2 : 0ULL, "chunks",
			     (unsigned long long)r->chunks, "bytes", (unsigned long long)r->bytes,
			     "content", hex);
}

static PyObject *run_digests(ModelObject *self, unsigned log2, int write)
{
	OwnerObject *o = model_owner(self);
	if (!o)
		return NULL;
	int interrupted = 0, rc;
	kiln_digest_options opts = {.size = sizeof(opts),
				    .chunk_log2 = log2,
				    .progress = open_progress,
				    .progress_ctx = &interrupted};
	kiln_verify_report r;
	kiln_error err;
	Py_INCREF(o); /* the model stays open even if another thread closes the Model */
	const kiln_model *m = o->model;
	Py_BEGIN_ALLOW_THREADS rc = write ? kiln_model_write_digests(m, &opts, &r, &err)
					  : kiln_model_verify_digests(m, &opts, &r, &err);
	Py_END_ALLOW_THREADS Py_DECREF(o);
	if (interrupted)
		return NULL; /* the signal handler's exception */
	if (rc && rc != KILN_UNSYNCED)
		return raise_kiln(rc, &err);
	return digest_report(&r);
}

static PyObject *model_write_digests(ModelObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"chunk", NULL};
	PyObject *chunk = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$O", kwlist, &chunk))
		return NULL;
	unsigned log2 = 0;
	if (chunk != Py_None) {
		unsigned long long v = PyLong_Check(chunk) ? PyLong_AsUnsignedLongLong(chunk) : 0;
		if (PyErr_Occurred())
			PyErr_Clear();
		while (log2 < 31 && (1ULL << log2) < v)
			log2++;
		if (v < 4096 || v > (1ULL << 30) || (1ULL << log2) != v)
			return PyErr_Format(PyExc_ValueError,
					    "chunk must be a power of two from 4096 to 1073741824 "
					    "bytes, or None");
	}
	return run_digests(self, log2, 1);
}

static PyObject *model_verify_digests(ModelObject *self, PyObject *unused)
{
	(void)unused;
	return run_digests(self, 0, 0);
}

PyObject *mod_open(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {
	    "path",           "source",  "direct",         "populate",   "verify",
	    "copy_on_write",  "threads", "format",         "align",      "one_file",
	    "directory_only", "timeout", "verify_payload", "pack_views", NULL};
	PyObject *path = NULL;
	const char *source = "mmap", *format = "auto";
	int direct = 0, populate = 0, verify = 0, cow = 1, align = 0, one_file = 0, dironly = 0;
	int verify_payload = 0, pack_views = 0;
	unsigned int threads = 0;
	double timeout = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$sppppIspppdpp:open", kwlist,
					 PyUnicode_FSConverter, &path, &source, &direct, &populate,
					 &verify, &cow, &threads, &format, &align, &one_file,
					 &dironly, &timeout, &verify_payload, &pack_views))
		return NULL;
	kiln_open_options opts;
	memset(&opts, 0, sizeof(opts));
	opts.size = sizeof(opts);
	/* URLs: each operation (the open, the payload's fetch, each later read) ends with
	 * FileError (ETIMEDOUT) past `timeout` seconds; 0: kiln's limits per request only. */
	int interrupted = 0;
	kiln_remote_options remote = {
	    .size = sizeof(remote), .progress = open_progress, .progress_ctx = &interrupted};
	opts.remote = &remote;
	if (!(timeout >= 0 && timeout < 1e12)) {
		Py_DECREF(path);
		return PyErr_Format(PyExc_ValueError, "timeout must be seconds (0: none), not %g",
				    timeout);
	}
	if (timeout > 0)
		remote.deadline_ms = (uint64_t)(timeout * 1000) ? (uint64_t)(timeout * 1000) : 1;
	if (!strcmp(source, "mmap"))
		opts.source = KILN_SOURCE_MMAP;
	else if (!strcmp(source, "read"))
		opts.source = KILN_SOURCE_READ;
	else if (!strcmp(source, "uring"))
		opts.source = KILN_SOURCE_URING;
	else if (!strcmp(source, "auto"))
		opts.source = KILN_SOURCE_AUTO;
	else {
		Py_DECREF(path);
		return PyErr_Format(PyExc_ValueError,
				    "source must be \"mmap\", \"read\", \"uring\" or \"auto\", not "
				    "\"%s\"",
				    source);
	}
	opts.threads = threads; /* kiln checks the limit (INVAL past 64) */
	if (direct)
		opts.flags |= KILN_OPEN_DIRECT;
	if (populate)
		opts.flags |= KILN_OPEN_POPULATE;
	/* verify: every byte against its digests, and the payload rules; verify_payload: the
	 * rules alone (no digests needed). */
	if (verify)
		opts.flags |= KILN_OPEN_VERIFY_DIGESTS | KILN_OPEN_VERIFY_PAYLOAD;
	if (verify_payload)
		opts.flags |= KILN_OPEN_VERIFY_PAYLOAD;
	/* Any DLPack consumer may write (torch has no read-only tensors): a copy-on-write mapping
	 * turns such a write into a private copy of the page instead of SIGSEGV. Reading costs
	 * the same; numpy arrays stay read-only regardless. */
	if (cow && opts.source == KILN_SOURCE_MMAP && !dironly)
		opts.flags |= KILN_OPEN_PRIVATE;

	/* Any format (KLNT, safetensors, GGUF) unless the caller names one: a file of another
	 * format is then a FrameError naming what it is. */
	unsigned f = 0;
	while (f <= KILN_FORMAT_SAFETENSORS && strcmp(format, kiln_format_name(f)))
		f++;
	if (f > KILN_FORMAT_SAFETENSORS) {
		Py_DECREF(path);
		return PyErr_Format(PyExc_ValueError,
				    "format must be \"auto\", \"klnt\", \"gguf\" or "
				    "\"safetensors\", not \"%s\"",
				    format);
	}
	opts.format = f;
	if (align)
		opts.flags |= KILN_OPEN_ALIGN;
	if (one_file)
		opts.flags |= KILN_OPEN_ONE_FILE;
	/* Nothing of the payload in memory: numpy() and DLPack refuse, copy(), read_into(),
	 * load() and read_slices() read through the source. */
	if (dironly)
		opts.flags |= KILN_OPEN_DIRECTORY_ONLY;
	if (pack_views)
		opts.flags |= KILN_OPEN_PACK_VIEWS;

	ModelObject *d = new_model();
	if (!d) {
		Py_DECREF(path);
		return NULL;
	}
	OwnerObject *owner = d->owner;
	kiln_error err;
	int rc;
	const char *p = PyBytes_AS_STRING(path);
	kiln_model *model = NULL;
	/* A shard name opens the whole series (the library finds its siblings beside it). */
	Py_BEGIN_ALLOW_THREADS rc = kiln_model_open(p, &opts, &model, &err);
	Py_END_ALLOW_THREADS Py_DECREF(path);
	if (rc) {
		Py_DECREF(d);
		return interrupted ? NULL : raise_kiln(rc, &err); /* the handler's exception */
	}
	owner->model = model;
	kiln_model_info mi;
	kiln_model_get_info(model, &mi);
	if (mi.cache_refused && kiln_cache_check(opts.remote, &err) &&
	    PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%s; fetched uncached", err.message) < 0) {
		Py_DECREF(d); /* warnings turned into errors */
		return NULL;
	}
	owner->writable =
	    !dironly && ((cow && opts.source == KILN_SOURCE_MMAP) ||
			 opts.source == KILN_SOURCE_READ || opts.source == KILN_SOURCE_URING);
	return (PyObject *)d;
}

/* parse(data): a Model over the bytes of one file (any format) held in memory: kiln_model_parse,
 * every check of an open; the views point into `data`, which the Model keeps (a writable buffer
 * changed afterwards changes what the views see: the checks were made at parse time). */
PyObject *mod_parse(PyObject *mod, PyObject *data)
{
	(void)mod;
	ModelObject *d = new_model();
	if (!d)
		return NULL;
	OwnerObject *owner = d->owner;
	if (PyObject_GetBuffer(data, &owner->held, PyBUF_C_CONTIGUOUS) < 0) {
		Py_DECREF(d);
		return NULL;
	}
	owner->holding = 1;
	kiln_error err;
	kiln_model *model = NULL;
	int rc;
	/* Bytes nobody can change (bytes, read-only views) are validated with the GIL released;
	 * a writable buffer keeps it, so no Python thread changes the bytes under the checks. */
	if (owner->held.readonly) {
		Py_BEGIN_ALLOW_THREADS rc =
		    kiln_model_parse(owner->held.buf, (size_t)owner->held.len, NULL, &model, &err);
		Py_END_ALLOW_THREADS
	} else {
		rc = kiln_model_parse(owner->held.buf, (size_t)owner->held.len, NULL, &model, &err);
	}
	if (rc) {
		Py_DECREF(d);
		return raise_kiln(rc, &err);
	}
	owner->model = model;
	return (PyObject *)d;
}
