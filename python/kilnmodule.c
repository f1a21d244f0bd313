/* SPDX-License-Identifier: MIT */
/*
 * kiln._kiln: the CPython extension under the `kiln` package, over the public API
 * (include/kiln/kiln.h) only.
 *
 * kiln.open() opens one kiln_model: a KLNT file, or the whole series when the path is a shard of
 * one (kiln_model_open() finds the siblings; the module parses no names). Dir indexes are the
 * model's (shard 0's tensors first); a Tensor's shard is its view's file and its `index` the
 * descriptor index in that file.
 *
 * Lifetime: every open model belongs to one Owner object. The Dir, every Tensor
 * view, every numpy array (as its base) and every DLPack capsule (through its manager context)
 * hold a reference on the Owner, and only the Owner's deallocation closes it. Dir.close() drops
 * the Dir's reference, so arrays made before it keep the mappings (or the owned blocks of the
 * read/uring sources) alive until the last of them is gone: no array can dangle.
 *
 * Files are mapped copy-on-write by default (KILN_OPEN_PRIVATE): torch has no read-only tensors,
 * so a tensor made through DLPack may be written, and the write must copy a page, not fault.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <kiln/kiln.h>

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Exceptions
 * ------------------------------------------------------------------------------------------- */

static PyObject *Error, *FormatError, *FrameError, *FormatTypeError, *LimitError, *UTF8Error,
    *FileError;

static PyObject *class_for(int code)
{
	switch (code) {
	case KILN_FRAME:
		return FrameError;
	case KILN_TYPE:
		return FormatTypeError;
	case KILN_LIMIT:
		return LimitError;
	case KILN_UTF8:
		return UTF8Error;
	case KILN_IO:
		return FileError;
	default:
		return Error;
	}
}

static int set_attr(PyObject *obj, const char *name, PyObject *value)
{
	if (!value)
		return -1;
	int rc = PyObject_SetAttrString(obj, name, value);
	Py_DECREF(value);
	return rc;
}

/* Raise the kiln.Error subclass for err->code with its detail as attributes; returns NULL. */
static PyObject *raise_kiln(int code, const kiln_error *e)
{
	PyObject *type = class_for(code);
	const char *msg = e->message[0] ? e->message : kiln_strerror(code);
	PyObject *args;
	if (type == FileError && e->sys_errno)
		args = Py_BuildValue("(is)", e->sys_errno, msg);
	else
		args = Py_BuildValue("(s)", msg);
	if (!args)
		return NULL;
	PyObject *exc = PyObject_Call(type, args, NULL);
	Py_DECREF(args);
	if (!exc)
		return NULL;
	PyObject *none = Py_None;
	if (set_attr(exc, "code", PyLong_FromLong(code)) ||
	    set_attr(exc, "cls", PyUnicode_FromString(kiln_code_name(code))) ||
	    set_attr(exc, "tensor",
		     e->tensor == KILN_NO_INDEX ? Py_NewRef(none)
						: PyLong_FromUnsignedLongLong(e->tensor)) ||
	    set_attr(exc, "field", e->field ? PyUnicode_FromString(e->field) : Py_NewRef(none)) ||
	    set_attr(exc, "offset",
		     e->offset == KILN_NO_OFFSET ? Py_NewRef(none)
						 : PyLong_FromUnsignedLongLong(e->offset)) ||
	    set_attr(exc, "errno",
		     e->sys_errno ? PyLong_FromLong(e->sys_errno) : Py_NewRef(none))) {
		Py_DECREF(exc);
		return NULL;
	}
	PyErr_SetObject(type, exc);
	Py_DECREF(exc);
	return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Owner: the one reference-counted holder of a kiln_model
 * ------------------------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD kiln_model *model; /* one file or every shard of a series */
	Py_buffer held;                  /* parse(): the bytes the model's views point into */
	int holding;
	int writable; /* the bytes are this process's own: a private mapping or an owned block */
} OwnerObject;

static void owner_dealloc(OwnerObject *self)
{
	kiln_model_close(self->model);
	if (self->holding)
		PyBuffer_Release(&self->held);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A tensor's descriptor index in its shard's file (its model index less the file's first). */
static uint64_t local_index(const kiln_model *m, const kiln_tensor *t)
{
	kiln_file_info fi;
	if (kiln_model_file_info(m, t->file, &fi))
		return t->index;
	return t->index - fi.first_tensor;
}

static PyTypeObject OwnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._kiln.Mapping",
    .tp_basicsize = sizeof(OwnerObject),
    .tp_dealloc = (destructor)owner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Keeps an open directory or series (mappings or owned blocks) alive; closed when "
	      "the last Dir, Tensor, array or DLPack capsule using it is gone.",
};

/* ---------------------------------------------------------------------------------------------
 * Tensor views
 * ------------------------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD OwnerObject *owner;
	const kiln_tensor *t; /* t->index: the model's index; t->file: its shard */
	uint64_t index;       /* the descriptor index in its shard's file */
} TensorObject;

static PyTypeObject TensorType;

/* A Tensor for view t of owner's model; None for NULL (no such tensor). */
static PyObject *tensor_new(OwnerObject *owner, const kiln_tensor *t)
{
	if (!t)
		Py_RETURN_NONE;
	TensorObject *self = PyObject_New(TensorObject, &TensorType);
	if (!self)
		return NULL;
	Py_INCREF(owner);
	self->owner = owner;
	self->t = t;
	self->index = local_index(owner->model, t);
	return (PyObject *)self;
}

static void tensor_dealloc(TensorObject *self)
{
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static PyObject *name_of(const char *p, size_t len)
{
	if (!p)
		Py_RETURN_NONE;
	/* The library has checked the name is well-formed UTF-8. */
	return PyUnicode_DecodeUTF8(p, (Py_ssize_t)len, "strict");
}

static PyObject *tensor_get_name(TensorObject *self, void *c)
{
	(void)c;
	return name_of(self->t->name, self->t->name_len);
}

static const char *dtype_name(unsigned code)
{
	const char *n = kiln_dtype_name(code);
	return n ? n : "unknown";
}

static PyObject *tensor_get_dtype(TensorObject *self, void *c)
{
	(void)c;
	return PyUnicode_FromString(dtype_name(self->t->dtype));
}

static PyObject *tensor_get_shape(TensorObject *self, void *c)
{
	(void)c;
	PyObject *tup = PyTuple_New(self->t->rank);
	if (!tup)
		return NULL;
	for (unsigned i = 0; i < self->t->rank; i++) {
		PyObject *v = PyLong_FromUnsignedLongLong(self->t->shape[i]);
		if (!v) {
			Py_DECREF(tup);
			return NULL;
		}
		PyTuple_SET_ITEM(tup, i, v);
	}
	return tup;
}

static PyObject *tensor_get_layout(TensorObject *self, void *c)
{
	(void)c;
	return name_of(self->t->layout, self->t->layout_len);
}

static PyObject *tensor_get_quant_axis(TensorObject *self, void *c)
{
	(void)c;
	if (self->t->quant_axis == KILN_NONE16)
		Py_RETURN_NONE;
	return PyLong_FromLong(self->t->quant_axis);
}

static PyObject *tensor_get_scale(TensorObject *self, void *c)
{
	(void)c;
	return tensor_new(self->owner, kiln_tensor_scale(self->owner->model, self->t));
}

static PyObject *tensor_get_outer(TensorObject *self, void *c)
{
	(void)c;
	return tensor_new(self->owner, kiln_tensor_outer(self->owner->model, self->t));
}

static PyObject *tensor_get_address(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromVoidPtr((void *)self->t->data);
}

#define TENSOR_U64(field)                                                     \
	static PyObject *tensor_get_##field(TensorObject *self, void *c)      \
	{                                                                     \
		(void)c;                                                      \
		return PyLong_FromUnsignedLongLong((uint64_t)self->t->field); \
	}
TENSOR_U64(rank)
TENSOR_U64(count)
TENSOR_U64(byte_length)
TENSOR_U64(byte_offset)
TENSOR_U64(file_offset)
TENSOR_U64(block_size)
TENSOR_U64(quant_scheme)
TENSOR_U64(group_size)
#undef TENSOR_U64

static PyObject *tensor_get_index(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(self->index);
}

static PyObject *tensor_get_shard(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLong(self->t->file);
}

static PyObject *tensor_get_alignment(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLong(self->t->alignment);
}

static PyObject *tensor_get_gindex(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(self->t->index);
}

static PyObject *tensor_get_dtype_code(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromLong(self->t->dtype);
}

static PyGetSetDef tensor_getset[] = {
    {"name", (getter)tensor_get_name, NULL, "Name (str), or None when unnamed.", NULL},
    {"index", (getter)tensor_get_index, NULL, "Descriptor index (in its shard's file).", NULL},
    {"shard", (getter)tensor_get_shard, NULL, "Shard of a series holding it (0 for one file).",
     NULL},
    {"set_index", (getter)tensor_get_gindex, NULL,
     "Index in the Dir: over the whole series (the descriptor index for one file).", NULL},
    {"dtype", (getter)tensor_get_dtype, NULL, "dtype name as kiln spells it (\"f32\", ...).", NULL},
    {"dtype_code", (getter)tensor_get_dtype_code, NULL, "dtype code from the format's table.",
     NULL},
    {"rank", (getter)tensor_get_rank, NULL, "Number of dimensions.", NULL},
    {"shape", (getter)tensor_get_shape, NULL, "Shape as a tuple of ints.", NULL},
    {"count", (getter)tensor_get_count, NULL, "Element count.", NULL},
    {"nbytes", (getter)tensor_get_byte_length, NULL, "Payload bytes.", NULL},
    {"byte_offset", (getter)tensor_get_byte_offset, NULL, "Offset in the payload region.", NULL},
    {"file_offset", (getter)tensor_get_file_offset, NULL, "Offset in the file.", NULL},
    {"layout", (getter)tensor_get_layout, NULL, "Opaque layout name, or None.", NULL},
    {"block_size", (getter)tensor_get_block_size, NULL, "Opaque block size (0 unless opaque).",
     NULL},
    {"quant_scheme", (getter)tensor_get_quant_scheme, NULL, "0 none, 1 block, 2 block + outer.",
     NULL},
    {"quant_axis", (getter)tensor_get_quant_axis, NULL, "Quantized axis, or None.", NULL},
    {"group_size", (getter)tensor_get_group_size, NULL, "Elements per scale (0 when none).", NULL},
    {"scale", (getter)tensor_get_scale, NULL, "The scale tensor's view, or None.", NULL},
    {"outer", (getter)tensor_get_outer, NULL, "The outer scale tensor's view, or None.", NULL},
    {"address", (getter)tensor_get_address, NULL, "Address of the first payload byte.", NULL},
    {"alignment", (getter)tensor_get_alignment, NULL,
     "The largest power of two (up to 4096) dividing the data's address.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

/* numpy's type number for a kiln dtype, or -1 when numpy has none. */
static int npy_type(unsigned code)
{
	switch (code) {
	case KILN_DT_BOOL:
		return NPY_BOOL;
	case KILN_DT_U8:
		return NPY_UINT8;
	case KILN_DT_I8:
		return NPY_INT8;
	case KILN_DT_U16:
		return NPY_UINT16;
	case KILN_DT_I16:
		return NPY_INT16;
	case KILN_DT_U32:
		return NPY_UINT32;
	case KILN_DT_I32:
		return NPY_INT32;
	case KILN_DT_U64:
		return NPY_UINT64;
	case KILN_DT_I64:
		return NPY_INT64;
	case KILN_DT_F16:
		return NPY_FLOAT16;
	case KILN_DT_F32:
		return NPY_FLOAT32;
	case KILN_DT_F64:
		return NPY_FLOAT64;
	default:
		return -1;
	}
}

/* Messages name a tensor by its descriptor index in its file (Tensor.index), `index` here. */
static PyObject *no_type(const kiln_tensor *t, uint64_t index, const char *what, const char *hint)
{
	PyObject *name = name_of(t->name, t->name_len);
	if (!name)
		return NULL;
	PyErr_Format(PyExc_TypeError, "tensor %llu (%R) has dtype %s, which %s has no type for; %s",
		     (unsigned long long)index, name, dtype_name(t->dtype), what, hint);
	Py_DECREF(name);
	return NULL;
}

/* A data pointer for empty payloads, so numpy never allocates memory of its own. */
static _Alignas(64) const unsigned char empty_payload[64];

/* The numpy type, rank and dims of a tensor's array (raw: its bytes as 1-D uint8); -1 with an
 * exception set when numpy cannot hold it. */
static int array_shape(const kiln_tensor *t, uint64_t index, int raw, int *type, int *nd,
		       npy_intp *dims)
{
	if (raw) {
		*type = NPY_UINT8;
		*nd = 1;
		if (t->byte_length > (uint64_t)NPY_MAX_INTP) {
			PyErr_Format(PyExc_OverflowError, "tensor %llu is too large",
				     (unsigned long long)index);
			return -1;
		}
		dims[0] = (npy_intp)t->byte_length;
		return 0;
	}
	*type = npy_type(t->dtype);
	if (*type < 0) {
		no_type(t, index, "numpy",
			t->dtype == KILN_DT_BF16 ? "numpy(raw=True) gives its bytes as uint8, and "
						   "torch.from_dlpack() gives torch.bfloat16"
						 : "numpy(raw=True) gives its bytes as uint8");
		return -1;
	}
	*nd = t->rank;
	for (int i = 0; i < *nd; i++) {
		if (t->shape[i] > (uint64_t)NPY_MAX_INTP) {
			PyErr_Format(PyExc_OverflowError,
				     "tensor %llu: dimension %d is too large for numpy",
				     (unsigned long long)index, i);
			return -1;
		}
		dims[i] = (npy_intp)t->shape[i];
	}
	return 0;
}

static PyObject *tensor_numpy(TensorObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"raw", "writable", NULL};
	int raw = 0, writable = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p$p:numpy", kwlist, &raw, &writable))
		return NULL;
	if (writable && !self->owner->writable)
		return PyErr_Format(PyExc_ValueError,
				    "tensor %llu: writable=True needs memory of this process's own "
				    "(open with copy_on_write=True or an owned source)",
				    (unsigned long long)self->index);
	const kiln_tensor *t = self->t;
	npy_intp dims[KILN_MAX_RANK];
	int nd, type;
	if (array_shape(t, self->index, raw, &type, &nd, dims) < 0)
		return NULL;
	void *data = t->data ? (void *)t->data : (void *)empty_payload;
	PyArray_Descr *descr = PyArray_DescrFromType(type);
	if (!descr)
		return NULL;
	/* Read-only unless asked: a writable array writes this process's private pages (seen by
	 * the other arrays of the same Dir, never by the file). */
	int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED |
		    (writable && t->data ? NPY_ARRAY_WRITEABLE : 0);
	PyObject *arr =
	    PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, data, flags, NULL);
	if (!arr)
		return NULL;
	Py_INCREF(self->owner);
	if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self->owner) < 0) {
		Py_DECREF(arr);
		return NULL;
	}
	return arr;
}

/* kiln_tensor_read into dst[0, cap) with the GIL released; -1 with the exception set. */
static int read_payload(TensorObject *self, void *dst, size_t cap)
{
	kiln_error err;
	int rc;
	const kiln_model *m = self->owner->model;
	uint64_t index = self->t->index;
	Py_BEGIN_ALLOW_THREADS rc = kiln_tensor_read(m, index, dst, cap, NULL, NULL, &err);
	Py_END_ALLOW_THREADS if (rc)
	{
		raise_kiln(rc, &err);
		return -1;
	}
	return 0;
}

static PyObject *tensor_read_into(TensorObject *self, PyObject *arg)
{
	Py_buffer view;
	if (PyObject_GetBuffer(arg, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	int rc = -1;
	if ((uint64_t)view.len < self->t->byte_length)
		PyErr_Format(PyExc_ValueError,
			     "a buffer of %zd bytes cannot hold tensor %llu (%llu bytes)", view.len,
			     (unsigned long long)self->index,
			     (unsigned long long)self->t->byte_length);
	else
		rc = read_payload(self, view.buf, (size_t)view.len);
	PyBuffer_Release(&view);
	return rc ? NULL : PyLong_FromUnsignedLongLong(self->t->byte_length);
}

static PyObject *tensor_copy(TensorObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"raw", NULL};
	int raw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:copy", kwlist, &raw))
		return NULL;
	npy_intp dims[KILN_MAX_RANK];
	int nd, type;
	if (array_shape(self->t, self->index, raw, &type, &nd, dims) < 0)
		return NULL;
	PyObject *arr = PyArray_Empty(nd, dims, PyArray_DescrFromType(type), 0);
	if (!arr)
		return NULL;
	if (read_payload(self, PyArray_DATA((PyArrayObject *)arr),
			 (size_t)PyArray_NBYTES((PyArrayObject *)arr)) < 0) {
		Py_DECREF(arr);
		return NULL;
	}
	return arr;
}

/* --- DLPack (v0.x ABI, defined here so no header is needed) ---------------------------------- */

typedef struct {
	int32_t device_type; /* kDLCPU = 1 */
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6 */
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides; /* NULL: compact row-major */
	uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
	DLManagedTensor m;
	int64_t shape[KILN_MAX_RANK];
} kiln_dlpack;

/* The consumer calls this when it is done, possibly on a thread without the GIL. */
static void dlpack_deleter(DLManagedTensor *m)
{
	if (Py_IsInitialized()) {
		PyGILState_STATE st = PyGILState_Ensure();
		Py_XDECREF((PyObject *)m->manager_ctx);
		PyGILState_Release(st);
	}
	free(m);
}

/* A capsule never consumed (renamed "used_dltensor" by the consumer) still owns its tensor. */
static void dlpack_capsule_destructor(PyObject *capsule)
{
	if (!PyCapsule_IsValid(capsule, "dltensor"))
		return;
	DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
	if (m && m->deleter)
		m->deleter(m);
}

static int dl_type(unsigned code, DLDataType *dt)
{
	static const DLDataType table[] = {
	    [KILN_DT_BOOL] = {6, 8, 1}, [KILN_DT_U8] = {1, 8, 1},    [KILN_DT_I8] = {0, 8, 1},
	    [KILN_DT_U16] = {1, 16, 1}, [KILN_DT_I16] = {0, 16, 1},  [KILN_DT_U32] = {1, 32, 1},
	    [KILN_DT_I32] = {0, 32, 1}, [KILN_DT_U64] = {1, 64, 1},  [KILN_DT_I64] = {0, 64, 1},
	    [KILN_DT_F16] = {2, 16, 1}, [KILN_DT_BF16] = {4, 16, 1}, [KILN_DT_F32] = {2, 32, 1},
	    [KILN_DT_F64] = {2, 64, 1},
	};
	if (code >= sizeof(table) / sizeof(table[0]) || !table[code].bits)
		return -1;
	*dt = table[code];
	return 0;
}

/* A DLPack capsule of the payload: typed, or (raw) its bytes as a 1-D uint8 tensor. */
static PyObject *make_capsule(TensorObject *self, int raw)
{
	const kiln_tensor *t = self->t;
	DLDataType dt = {1, 8, 1};
	if (!raw && dl_type(t->dtype, &dt) < 0)
		return no_type(t, self->index, "DLPack",
			       "to_dlpack(raw=True) gives its bytes as uint8");
	kiln_dlpack *d = calloc(1, sizeof(*d));
	if (!d)
		return PyErr_NoMemory();
	unsigned rank = raw ? 1 : t->rank;
	for (unsigned i = 0; i < rank; i++) {
		uint64_t v = raw ? t->byte_length : t->shape[i];
		if (v > (uint64_t)INT64_MAX) {
			free(d);
			return PyErr_Format(PyExc_OverflowError, "tensor %llu is too large",
					    (unsigned long long)self->index);
		}
		d->shape[i] = (int64_t)v;
	}
	d->m.dl_tensor.data = t->data ? (void *)t->data : (void *)empty_payload;
	d->m.dl_tensor.device.device_type = 1;
	d->m.dl_tensor.ndim = (int32_t)rank;
	d->m.dl_tensor.dtype = dt;
	d->m.dl_tensor.shape = d->shape;
	d->m.dl_tensor.strides = NULL;
	d->m.dl_tensor.byte_offset = 0;
	Py_INCREF(self->owner);
	d->m.manager_ctx = self->owner;
	d->m.deleter = dlpack_deleter;
	PyObject *cap = PyCapsule_New(&d->m, "dltensor", dlpack_capsule_destructor);
	if (!cap)
		dlpack_deleter(&d->m);
	return cap;
}

static PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
{
	/* The array API's keywords: stream is meaningless for host memory; max_version is met
	 * with the legacy (v0.x) "dltensor" capsule, which every consumer reads; a copy or another
	 * device cannot be given, and the protocol says to raise BufferError then. */
	static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
	PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OOO:__dlpack__", kwlist, &stream,
					 &max_version, &dl_device, &copy))
		return NULL;
	if (copy == Py_True) {
		PyErr_SetString(PyExc_BufferError,
				"kiln tensors export views only; Tensor.copy() gives a copy");
		return NULL;
	}
	if (dl_device != Py_None) {
		int type = 0, id = -1;
		if (!PyArg_ParseTuple(dl_device, "ii:dl_device", &type, &id))
			return NULL;
		if (type != 1 || id != 0) {
			PyErr_Format(PyExc_BufferError,
				     "kiln tensors are on the CPU (1, 0), not (%d, %d)", type, id);
			return NULL;
		}
	}
	return make_capsule(self, 0);
}

static PyObject *tensor_to_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"raw", NULL};
	int raw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:to_dlpack", kwlist, &raw))
		return NULL;
	return make_capsule(self, raw);
}

static PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
	(void)self;
	(void)unused;
	return Py_BuildValue("(ii)", 1, 0);
}

static PyObject *tensor_repr(TensorObject *self)
{
	PyObject *name = name_of(self->t->name, self->t->name_len);
	PyObject *shape = name ? tensor_get_shape(self, NULL) : NULL;
	PyObject *r = NULL;
	if (shape)
		r = PyUnicode_FromFormat("<kiln.Tensor %llu %R %s %R>",
					 (unsigned long long)self->index, name,
					 dtype_name(self->t->dtype), shape);
	Py_XDECREF(name);
	Py_XDECREF(shape);
	return r;
}

static PyMethodDef tensor_methods[] = {
    {"numpy", (PyCFunction)(void (*)(void))tensor_numpy, METH_VARARGS | METH_KEYWORDS,
     "numpy(raw=False, *, writable=False): a read-only numpy array viewing the payload (no\n"
     "copy). raw=True gives the payload bytes as a 1-D uint8 array, for dtypes numpy has no\n"
     "type for. writable=True (memory of this process's own: copy_on_write=True or an owned\n"
     "source) allows writes, which change this process's pages only."},
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A DLPack capsule viewing the payload (no copy). DLPack v0.x has no read-only flag, so a\n"
     "consumer may write: with the default copy-on-write mapping a write changes this\n"
     "process's copy of the page only (seen by the Dir's other views, never by the file);\n"
     "with copy_on_write=False it is a segmentation fault."},
    {"copy", (PyCFunction)(void (*)(void))tensor_copy, METH_VARARGS | METH_KEYWORDS,
     "copy(raw=False): a new, writable numpy array holding the payload, read from the file\n"
     "(io_uring or pread, the GIL released), not through the mapping."},
    {"read_into", (PyCFunction)tensor_read_into, METH_O,
     "read_into(buffer): read the payload into any writable buffer of at least nbytes bytes\n"
     "(a bytearray, a numpy array, ...), the GIL released. Returns nbytes."},
    {"to_dlpack", (PyCFunction)(void (*)(void))tensor_to_dlpack, METH_VARARGS | METH_KEYWORDS,
     "to_dlpack(raw=False): a DLPack capsule as __dlpack__ gives; raw=True views the payload\n"
     "bytes as a 1-D uint8 tensor (for dtypes the consumer has no type for)."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS, "(1, 0): CPU memory."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A view of one tensor of an open directory: plain fields, numpy(), __dlpack__().",
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
};

/* ---------------------------------------------------------------------------------------------
 * Dir
 * ------------------------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD OwnerObject *owner; /* NULL once closed */
} DirObject;

static OwnerObject *dir_owner(DirObject *self)
{
	if (!self->owner)
		PyErr_SetString(PyExc_ValueError, "the directory is closed");
	return self->owner;
}

static void dir_dealloc(DirObject *self)
{
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static Py_ssize_t dir_len(DirObject *self)
{
	OwnerObject *o = dir_owner(self);
	return o ? (Py_ssize_t)kiln_model_count(o->model) : -1;
}

static PyObject *dir_item(DirObject *self, Py_ssize_t i)
{
	OwnerObject *o = dir_owner(self);
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

static PyObject *dir_subscript(DirObject *self, PyObject *key)
{
	OwnerObject *o = dir_owner(self);
	if (!o)
		return NULL;
	if (PyUnicode_Check(key)) {
		const kiln_tensor *t = find_name(o, key);
		return t ? tensor_new(o, t) : NULL;
	}
	Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
	if (i == -1 && PyErr_Occurred())
		return NULL;
	return dir_item(self, i);
}

static int dir_contains(DirObject *self, PyObject *key)
{
	OwnerObject *o = dir_owner(self);
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

static PyObject *dir_keys(DirObject *self, PyObject *unused)
{
	(void)unused;
	OwnerObject *o = dir_owner(self);
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

static PyObject *dir_close(DirObject *self, PyObject *unused)
{
	(void)unused;
	Py_CLEAR(self->owner);
	Py_RETURN_NONE;
}

static PyObject *dir_enter(DirObject *self, PyObject *unused)
{
	(void)unused;
	if (!dir_owner(self))
		return NULL;
	return Py_NewRef((PyObject *)self);
}

static PyObject *dir_exit(DirObject *self, PyObject *args)
{
	(void)args;
	Py_CLEAR(self->owner);
	Py_RETURN_FALSE;
}

static PyObject *dir_verify_payload(DirObject *self, PyObject *unused)
{
	(void)unused;
	OwnerObject *o = dir_owner(self);
	if (!o)
		return NULL;
	kiln_error err;
	int rc;
	/* The reference keeps the model open even if another thread closes the Dir. */
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

static PyObject *dir_hint(DirObject *self, PyObject *args, PyObject *kw)
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
	OwnerObject *o = dir_owner(self);
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

/*
 * stream(pairs, *, engine="auto", direct=False, chunk_size=0, queue_depth=0): read payloads
 * from the file into caller buffers; pairs is a sequence of (key, writable buffer).
 */
static PyObject *dir_stream(DirObject *self, PyObject *args, PyObject *kw)
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
	OwnerObject *o = dir_owner(self);
	if (!o)
		return NULL;
	PyObject *seq = PySequence_Fast(pairs, "pairs must be a sequence of (tensor, buffer)");
	if (!seq)
		return NULL;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
	PyObject *ret = NULL;
	uint64_t *idx = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*idx));
	void **dests = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*dests));
	Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*views));
	if (!idx || !dests || !views) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *key, *buf;
		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OO:stream pair", &key,
				      &buf) ||
		    resolve_index(o, key, &idx[i]) < 0 ||
		    PyObject_GetBuffer(buf, &views[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
			goto out;
		got = i + 1;
		const kiln_tensor *t = kiln_model_tensor(o->model, idx[i]);
		if ((uint64_t)views[i].len < t->byte_length) {
			PyErr_Format(PyExc_ValueError,
				     "a buffer of %zd bytes cannot hold tensor %llu (%llu bytes)",
				     views[i].len, (unsigned long long)local_index(o->model, t),
				     (unsigned long long)t->byte_length);
			goto out;
		}
		dests[i] = views[i].buf;
	}
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
	for (Py_ssize_t i = 0; i < got; i++)
		PyBuffer_Release(&views[i]);
	PyMem_Free(idx);
	PyMem_Free(dests);
	PyMem_Free(views);
	Py_DECREF(seq);
	return ret;
}

static PyObject *dir_get_info(DirObject *self, void *c)
{
	(void)c;
	OwnerObject *o = dir_owner(self);
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
	    "{s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:O,s:O,s:s,s:i,s:i,s:i,s:I,s:K,s:I,s:s}",
	    "tensor_count", (unsigned long long)in.tensor_count, "name_bytes",
	    (unsigned long long)names, "payload_bytes", (unsigned long long)payload,
	    "directory_bytes", (unsigned long long)directory, "payload_base",
	    (unsigned long long)first.payload_base, "block_length", (unsigned long long)block,
	    "version", (int)first.version, "flags", (int)first.flags, "payload_verified",
	    in.payload_verified ? Py_True : Py_False, "direct", in.direct ? Py_True : Py_False,
	    "source", src ? src : "unknown", "direct_fallback", (int)in.direct_fallback,
	    "uring_fallback", (int)in.uring_fallback, "advice_errno", (int)in.advice_errno,
	    "dio_align", (unsigned int)in.dio_align, "pinned", (unsigned long long)in.pinned,
	    "shards", (unsigned int)in.files, "auto_choice", choice);
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

static PyObject *dir_metadata(DirObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"types", NULL};
	int types = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p:metadata", kwlist, &types))
		return NULL;
	OwnerObject *o = dir_owner(self);
	return o ? metadata_dict(o, types) : NULL;
}

static PyObject *dir_get_format(DirObject *self, void *c)
{
	(void)c;
	OwnerObject *o = dir_owner(self);
	if (!o)
		return NULL;
	kiln_model_info in;
	kiln_model_get_info(o->model, &in);
	return PyUnicode_FromString(kiln_format_name(in.format));
}

static PyObject *dir_get_paths(DirObject *self, void *c)
{
	(void)c;
	OwnerObject *o = dir_owner(self);
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

static PyObject *dir_get_closed(DirObject *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->owner == NULL);
}

static PyGetSetDef dir_getset[] = {
    {"info", (getter)dir_get_info, NULL,
     "Header fields, sizes and how the bytes were loaded. For a series (shards > 1) counts and\n"
     "sizes are totals and the other fields are the first shard's.",
     NULL},
    {"paths", (getter)dir_get_paths, NULL, "The files open: one, or every shard of a series.",
     NULL},
    {"closed", (getter)dir_get_closed, NULL, "True after close().", NULL},
    {"format", (getter)dir_get_format, NULL, "\"klnt\", \"safetensors\" or \"gguf\".", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef dir_methods[] = {
    {"keys", (PyCFunction)dir_keys, METH_NOARGS, "Names of the named tensors, in file order."},
    {"metadata", (PyCFunction)(void (*)(void))dir_metadata, METH_VARARGS | METH_KEYWORDS,
     "metadata(*, types=False) -> dict\n"
     "What the model says besides its tensors, in file order: GGUF key/values as int, float,\n"
     "bool, str (bytes when not UTF-8) and list; safetensors __metadata__ (str); a KLNT file's\n"
     "kiln.metadata document. types=True gives (type, value) pairs, type as GGUF names it\n"
     "(\"u32\", \"str\", \"arr:f32\", ...)."},
    {"verify_payload", (PyCFunction)dir_verify_payload, METH_NOARGS,
     "Check the bytes between payloads and the 4-bit padding are zero (raises "
     "FormatTypeError)."},
    {"hint", (PyCFunction)(void (*)(void))dir_hint, METH_VARARGS | METH_KEYWORDS,
     "hint(tensors=None, hint=\"willneed\"): advise the kernel about these tensors' pages\n"
     "(names, indices or Tensors; None: all): willneed, dontneed, cold, pageout. mmap only."},
    {"stream", (PyCFunction)(void (*)(void))dir_stream, METH_VARARGS | METH_KEYWORDS,
     "stream(pairs, *, engine=\"auto\", direct=False, chunk_size=0, queue_depth=0) -> dict\n"
     "Read payloads from the file into caller buffers, many reads in flight, the GIL\n"
     "released; pairs: (name, index or Tensor, writable buffer of at least nbytes)."},
    {"close", (PyCFunction)dir_close, METH_NOARGS,
     "Drop this Dir's hold on the directory. Arrays, tensors and views made from it stay\n"
     "valid: the directory is closed when the last of them is gone."},
    {"__enter__", (PyCFunction)dir_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)dir_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods dir_as_sequence = {
    .sq_length = (lenfunc)dir_len,
    .sq_item = (ssizeargfunc)dir_item,
    .sq_contains = (objobjproc)dir_contains,
};

static PyMappingMethods dir_as_mapping = {
    .mp_length = (lenfunc)dir_len,
    .mp_subscript = (binaryfunc)dir_subscript,
};

static PyObject *dir_repr(DirObject *self)
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

static PyTypeObject DirType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Dir",
    .tp_basicsize = sizeof(DirObject),
    .tp_dealloc = (destructor)dir_dealloc,
    .tp_repr = (reprfunc)dir_repr,
    .tp_as_sequence = &dir_as_sequence,
    .tp_as_mapping = &dir_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An open, validated KLNT directory: len(), iteration, [index] and [name] give "
	      "Tensor views.",
    .tp_methods = dir_methods,
    .tp_getset = dir_getset,
};

/* ---------------------------------------------------------------------------------------------
 * Module functions
 * ------------------------------------------------------------------------------------------- */

static PyObject *mod_open(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"path",   "source",        "direct",  "populate",
				 "verify", "copy_on_write", "threads", "format",
				 "align",  "one_file",      NULL};
	PyObject *path = NULL;
	const char *source = "mmap", *format = "auto";
	int direct = 0, populate = 0, verify = 0, cow = 1, align = 0, one_file = 0;
	unsigned int threads = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$sppppIspp:open", kwlist,
					 PyUnicode_FSConverter, &path, &source, &direct, &populate,
					 &verify, &cow, &threads, &format, &align, &one_file))
		return NULL;
	kiln_open_options opts;
	memset(&opts, 0, sizeof(opts));
	opts.size = sizeof(opts);
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
	if (verify)
		opts.flags |= KILN_OPEN_VERIFY_PAYLOAD;
	/* Any DLPack consumer may write (torch has no read-only tensors): a copy-on-write mapping
	 * turns such a write into a private copy of the page instead of SIGSEGV. Reading costs
	 * the same; numpy arrays stay read-only regardless. */
	if (cow && opts.source == KILN_SOURCE_MMAP)
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

	OwnerObject *owner = PyObject_New(OwnerObject, &OwnerType);
	DirObject *d = owner ? PyObject_New(DirObject, &DirType) : NULL;
	if (!d) {
		if (owner) {
			owner->model = NULL;
			owner->holding = 0;
			Py_DECREF(owner);
		}
		Py_DECREF(path);
		return NULL;
	}
	owner->model = NULL;
	owner->holding = 0;
	owner->writable = 0;
	d->owner = owner;
	kiln_error err;
	int rc;
	const char *p = PyBytes_AS_STRING(path);
	kiln_model *model = NULL;
	/* A shard name opens the whole series (the library finds its siblings beside it). */
	Py_BEGIN_ALLOW_THREADS rc = kiln_model_open(p, &opts, &model, &err);
	Py_END_ALLOW_THREADS Py_DECREF(path);
	if (rc) {
		Py_DECREF(d);
		return raise_kiln(rc, &err);
	}
	owner->model = model;
	owner->writable = (cow && opts.source == KILN_SOURCE_MMAP) ||
			  opts.source == KILN_SOURCE_READ || opts.source == KILN_SOURCE_URING;
	return (PyObject *)d;
}

/* parse(data): a Dir over the bytes of one file (any format) held in memory: kiln_model_parse,
 * every check of an open; the views point into `data`, which the Dir keeps. */
static PyObject *mod_parse(PyObject *mod, PyObject *data)
{
	(void)mod;
	OwnerObject *owner = PyObject_New(OwnerObject, &OwnerType);
	DirObject *d = owner ? PyObject_New(DirObject, &DirType) : NULL;
	if (!d) {
		if (owner) {
			owner->model = NULL;
			owner->holding = 0;
			Py_DECREF(owner);
		}
		return NULL;
	}
	owner->model = NULL;
	owner->holding = 0;
	owner->writable = 0;
	d->owner = owner;
	if (PyObject_GetBuffer(data, &owner->held, PyBUF_C_CONTIGUOUS) < 0) {
		Py_DECREF(d);
		return NULL;
	}
	owner->holding = 1;
	kiln_error err;
	kiln_model *model = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS rc =
	    kiln_model_parse(owner->held.buf, (size_t)owner->held.len, NULL, &model, &err);
	Py_END_ALLOW_THREADS if (rc)
	{
		Py_DECREF(d);
		return raise_kiln(rc, &err);
	}
	owner->model = model;
	return (PyObject *)d;
}

static void release_buffers(Py_buffer *bufs, Py_ssize_t n)
{
	for (Py_ssize_t i = 0; i < n; i++)
		PyBuffer_Release(&bufs[i]);
}

/* The optional fields of a write_file tensor: layout, block_size and the quantization fields. */
static int spec_extra(PyObject *extra, kiln_tensor_spec *s)
{
	static const char *const keys[] = {"layout",     "block_size", "quant_scheme",
					   "quant_axis", "group_size", "scale_index",
					   "outer_index"};
	PyObject *key, *value;
	Py_ssize_t pos = 0;
	while (PyDict_Next(extra, &pos, &key, &value)) {
		const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
		size_t which = 0;
		while (k && which < sizeof(keys) / sizeof(keys[0]) && strcmp(k, keys[which]))
			which++;
		if (!k || which == sizeof(keys) / sizeof(keys[0])) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_ValueError, "unknown tensor field %R", key);
			return -1;
		}
		if (which == 0) {
			Py_ssize_t len;
			s->layout = PyUnicode_AsUTF8AndSize(value, &len);
			if (!s->layout)
				return -1;
			s->layout_len = (size_t)len;
			continue;
		}
		unsigned long v = PyLong_AsUnsignedLong(value);
		if (v == (unsigned long)-1 && PyErr_Occurred())
			return -1;
		uint32_t max = which == 2 || which == 3 ? UINT16_MAX : UINT32_MAX;
		if (v > max) {
			PyErr_Format(PyExc_OverflowError, "%s %lu is out of range", k, v);
			return -1;
		}
		switch (which) {
		case 1:
			s->block_size = (uint32_t)v;
			break;
		case 2:
			s->quant_scheme = (uint16_t)v;
			break;
		case 3:
			s->quant_axis = (uint16_t)v;
			break;
		case 4:
			s->group_size = (uint32_t)v;
			break;
		case 5:
			s->scale_index = (uint32_t)v;
			break;
		default:
			s->outer_index = (uint32_t)v;
			break;
		}
	}
	return 0;
}

/*
 * write_file(path, tensors, sync=True): tensors is a sequence of (name or None, dtype name or
 * code, shape, data[, fields]) where data supports the buffer protocol (C-contiguous) and holds
 * the payload, and fields is a dict of layout, block_size and the quantization fields.
 */
static PyObject *mod_write_file(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"path", "tensors", "sync", NULL};
	PyObject *path = NULL, *seq_in;
	int sync = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|$p:write_file", kwlist,
					 PyUnicode_FSConverter, &path, &seq_in, &sync))
		return NULL;
	PyObject *seq = PySequence_Fast(seq_in, "tensors must be a sequence");
	if (!seq) {
		Py_DECREF(path);
		return NULL;
	}
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
	PyObject *result = NULL;
	if ((size_t)n > UINT32_MAX) {
		PyErr_SetString(PyExc_OverflowError, "too many tensors");
		goto out;
	}
	kiln_tensor_spec *specs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*specs));
	Py_buffer *bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*bufs));
	if (!specs || !bufs) {
		PyErr_NoMemory();
		goto free;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *name, *dtype, *shape, *data;
		PyObject *extra = NULL;
		if (!PyArg_ParseTuple(item, "OOOO|O!:write_file tensor", &name, &dtype, &shape,
				      &data, &PyDict_Type, &extra))
			goto free;
		kiln_tensor_spec *s = &specs[i];
		if (extra && spec_extra(extra, s) < 0)
			goto free;
		if (name != Py_None) {
			Py_ssize_t len;
			s->name = PyUnicode_AsUTF8AndSize(name, &len);
			if (!s->name)
				goto free;
			s->name_len = (size_t)len;
		}
		if (PyLong_Check(dtype)) {
			unsigned long code = PyLong_AsUnsignedLong(dtype);
			if (PyErr_Occurred())
				goto free;
			s->dtype = code <= UINT16_MAX ? (uint16_t)code : 0;
		} else {
			const char *dn = PyUnicode_Check(dtype) ? PyUnicode_AsUTF8(dtype) : NULL;
			s->dtype = dn ? (uint16_t)kiln_dtype_from_name(dn) : 0;
		}
		if (!s->dtype) {
			PyErr_Format(PyExc_ValueError, "unknown dtype %R", dtype);
			goto free;
		}
		PyObject *sh = PySequence_Fast(shape, "shape must be a sequence");
		if (!sh)
			goto free;
		Py_ssize_t rank = PySequence_Fast_GET_SIZE(sh);
		if (rank > KILN_MAX_RANK) {
			Py_DECREF(sh);
			PyErr_Format(PyExc_ValueError, "rank %zd is more than %d", rank,
				     KILN_MAX_RANK);
			goto free;
		}
		s->rank = (uint8_t)rank;
		for (Py_ssize_t k = 0; k < rank; k++) {
			unsigned long long v =
			    PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(sh, k));
			if (v == (unsigned long long)-1 && PyErr_Occurred()) {
				Py_DECREF(sh);
				goto free;
			}
			s->shape[k] = v;
		}
		Py_DECREF(sh);
		if (PyObject_GetBuffer(data, &bufs[i], PyBUF_C_CONTIGUOUS) < 0)
			goto free;
		got = i + 1;
		s->data = bufs[i].buf;
		s->byte_length = (uint64_t)bufs[i].len;
	}
	kiln_error err;
	int rc;
	const char *p = PyBytes_AS_STRING(path);
	uint32_t flags = sync ? 0 : KILN_WRITE_NO_SYNC;
	Py_BEGIN_ALLOW_THREADS rc = kiln_write_file(p, specs, (uint32_t)n, flags, &err);
	Py_END_ALLOW_THREADS if (rc) raise_kiln(rc, &err);
	else result = Py_NewRef(Py_None);
free:
	release_buffers(bufs, got);
	PyMem_Free(specs);
	PyMem_Free(bufs);
out:
	Py_DECREF(seq);
	Py_DECREF(path);
	return result;
}

/*
 * write_safetensors(path, tensors, metadata=None, *, sync=True): the safetensors writer
 * (kiln_safetensors_write_file, or with path None kiln_safetensors_write_memory into the bytes
 * returned). tensors: (name, safetensors dtype, shape, data_ptr, data_len) tuples; the caller keeps
 * the memory alive (safetensors' TensorSpec contract). metadata: None or a dict of str to str.
 * The GIL is released while the bytes are written.
 */
static PyObject *mod_write_safetensors(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"path", "tensors", "metadata", "sync", NULL};
	PyObject *path_in, *seq_in, *meta_in = Py_None, *path = NULL;
	int sync = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O$p:write_safetensors", kwlist, &path_in,
					 &seq_in, &meta_in, &sync))
		return NULL;
	if (path_in != Py_None && !PyUnicode_FSConverter(path_in, &path))
		return NULL;
	PyObject *seq = PySequence_Fast(seq_in, "tensors must be a sequence"), *result = NULL;
	PyObject *items = NULL;
	kiln_tensor_spec *specs = NULL;
	kiln_str_pair *pairs = NULL;
	if (!seq)
		goto out;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), nmeta = 0;
	specs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*specs));
	if (meta_in != Py_None) {
		if (!PyDict_Check(meta_in)) {
			PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str");
			goto out;
		}
		if (!(items = PyDict_Items(meta_in)))
			goto out;
		nmeta = PyList_GET_SIZE(items);
		pairs = PyMem_Calloc(nmeta ? (size_t)nmeta : 1, sizeof(*pairs));
	}
	if (!specs || (meta_in != Py_None && !pairs)) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < nmeta; i++) {
		PyObject *kv = PyList_GET_ITEM(items, i), *k = PyTuple_GET_ITEM(kv, 0),
			 *v = PyTuple_GET_ITEM(kv, 1);
		if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
			PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str");
			goto out;
		}
		Py_ssize_t kl, vl;
		if (!(pairs[i].key = PyUnicode_AsUTF8AndSize(k, &kl)) ||
		    !(pairs[i].value = PyUnicode_AsUTF8AndSize(v, &vl)))
			goto out;
		pairs[i].key_len = (size_t)kl;
		pairs[i].value_len = (size_t)vl;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *name, *dtype, *shape;
		unsigned long long ptr, len;
		if (!PyArg_ParseTuple(item, "UUOKK:write_safetensors tensor", &name, &dtype, &shape,
				      &ptr, &len))
			goto out;
		kiln_tensor_spec *sp = &specs[i];
		Py_ssize_t nl, dl;
		const char *dn;
		if (!(sp->name = PyUnicode_AsUTF8AndSize(name, &nl)) ||
		    !(dn = PyUnicode_AsUTF8AndSize(dtype, &dl)))
			goto out;
		sp->name_len = (size_t)nl;
		if (!kiln_safetensors_dtype_code(dn, (size_t)dl, &sp->dtype)) {
			PyErr_Format(PyExc_ValueError, "unknown safetensors dtype %R", dtype);
			goto out;
		}
		if (kiln_dtype_is_opaque(sp->dtype)) {
			sp->layout = dn;
			sp->layout_len = (size_t)dl;
		}
		PyObject *sh = PySequence_Fast(shape, "shape must be a sequence");
		if (!sh)
			goto out;
		Py_ssize_t rank = PySequence_Fast_GET_SIZE(sh);
		if (rank > KILN_MAX_RANK) {
			Py_DECREF(sh);
			PyErr_Format(PyExc_ValueError, "rank %zd is more than %d", rank,
				     KILN_MAX_RANK);
			goto out;
		}
		sp->rank = (uint8_t)rank;
		for (Py_ssize_t k = 0; k < rank; k++) {
			unsigned long long v =
			    PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(sh, k));
			if (v == (unsigned long long)-1 && PyErr_Occurred()) {
				Py_DECREF(sh);
				goto out;
			}
			sp->shape[k] = v;
		}
		Py_DECREF(sh);
		sp->data = (const void *)(uintptr_t)ptr;
		sp->byte_length = len;
		if (len && !ptr) {
			PyErr_Format(PyExc_ValueError, "tensor %R: data_ptr is 0 for %llu bytes",
				     name, len);
			goto out;
		}
	}
	kiln_error err;
	int rc;
	kiln_str_pair *mp = meta_in == Py_None ? NULL : pairs;
	if (path) {
		const char *p = PyBytes_AS_STRING(path);
		uint32_t flags = sync ? 0 : KILN_WRITE_NO_SYNC;
		Py_BEGIN_ALLOW_THREADS rc = kiln_safetensors_write_file(p, specs, (size_t)n, mp,
									(size_t)nmeta, flags, &err);
		Py_END_ALLOW_THREADS if (rc) raise_kiln(rc, &err);
		else result = Py_NewRef(Py_None);
		goto out;
	}
	uint64_t total;
	if ((rc = kiln_safetensors_size(specs, (size_t)n, mp, (size_t)nmeta, &total, &err))) {
		raise_kiln(rc, &err);
		goto out;
	}
	if (total > PY_SSIZE_T_MAX) {
		PyErr_NoMemory();
		goto out;
	}
	PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
	if (!bytes)
		goto out;
	size_t written;
	char *dst = PyBytes_AS_STRING(bytes);
	Py_BEGIN_ALLOW_THREADS rc = kiln_safetensors_write_memory(
	    specs, (size_t)n, mp, (size_t)nmeta, dst, (size_t)total, &written, &err);
	Py_END_ALLOW_THREADS if (rc)
	{
		Py_DECREF(bytes);
		raise_kiln(rc, &err);
	}
	else result = bytes;
out:
	PyMem_Free(specs);
	PyMem_Free(pairs);
	Py_XDECREF(items);
	Py_XDECREF(seq);
	Py_XDECREF(path);
	return result;
}

static PyObject *mod_dtype_bits(PyObject *mod, PyObject *arg)
{
	(void)mod;
	const char *name = PyUnicode_AsUTF8(arg);
	if (!name)
		return NULL;
	unsigned code = kiln_dtype_from_name(name);
	if (!code)
		return PyErr_Format(PyExc_ValueError, "unknown dtype %s", name);
	return PyLong_FromUnsignedLong(kiln_dtype_bits(code));
}

static PyMethodDef module_methods[] = {
    {"open", (PyCFunction)(void (*)(void))mod_open, METH_VARARGS | METH_KEYWORDS,
     "open(path, *, source=\"mmap\", direct=False, populate=False, verify=False,\n"
     "     copy_on_write=True, threads=0, format=\"auto\", align=False, one_file=False) -> Dir\n\n"
     "Open and validate a model: a KLNT file or any shard of a KLNT series\n"
     "(STEM-NNNNN-of-MMMMM.klnt), a .safetensors file, any shard of a sharded checkpoint or\n"
     "its model.safetensors.index.json, or a .gguf file or any part of a split one: every\n"
     "file of the model opens as one Dir. format: \"auto\" (told from the first bytes) or\n"
     "\"klnt\", \"safetensors\", \"gguf\" to insist. align: give each tensor whose payload\n"
     "is misaligned for its dtype an aligned owned copy (safetensors promises no alignment;\n"
     "torch needs it); the others stay zero-copy. one_file: open a shard alone. source:\n"
     "\"mmap\" (a mapping), \"read\" or \"uring\" (the files read into owned memory;\n"
     "threads > 1 reads on that many threads, the GIL released), \"auto\". copy_on_write\n"
     "(mmap): map copy-on-write, so a consumer that writes through DLPack (torch) changes a\n"
     "private copy, never the file; False maps read-only shared, where such a write is a\n"
     "segmentation fault. Raises a kiln.Error subclass."},
    {"write_file", (PyCFunction)(void (*)(void))mod_write_file, METH_VARARGS | METH_KEYWORDS,
     "write_file(path, tensors, *, sync=True): write a canonical KLNT file; tensors is a\n"
     "sequence of (name or None, dtype name or code, shape, buffer[, fields]), fields a dict\n"
     "of layout, block_size, quant_scheme, quant_axis, group_size, scale_index, outer_index."},
    {"dtype_bits", (PyCFunction)mod_dtype_bits, METH_O, "Bits per element of a dtype name."},
    {"parse", (PyCFunction)mod_parse, METH_O,
     "parse(data) -> Dir\n\nValidate and index one file held in memory (bytes or any buffer): "
     "every check of open(); the tensors view `data`, which the Dir keeps alive."},
    {"write_safetensors", (PyCFunction)(void (*)(void))mod_write_safetensors,
     METH_VARARGS | METH_KEYWORDS,
     "write_safetensors(path, tensors, metadata=None, *, sync=True) -> None or bytes\n\n"
     "The safetensors writer (kiln_safetensors_write_file; path None: the file as bytes).\n"
     "tensors: (name, safetensors dtype, shape, data_ptr, data_len) tuples."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kiln_module = {PyModuleDef_HEAD_INIT,
					 "kiln._kiln",
					 "The C half of the kiln package.",
					 -1,
					 module_methods,
					 NULL,
					 NULL,
					 NULL,
					 NULL};

static PyObject *new_exc(PyObject *m, const char *name, PyObject *bases, const char *doc)
{
	char full[64];
	snprintf(full, sizeof(full), "kiln.%s", name);
	PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	if (e && PyModule_AddObject(m, name, Py_NewRef(e)) < 0)
		Py_CLEAR(e);
	return e;
}

PyMODINIT_FUNC PyInit__kiln(void);
PyMODINIT_FUNC PyInit__kiln(void)
{
	import_array();
	if (PyType_Ready(&OwnerType) < 0 || PyType_Ready(&TensorType) < 0 ||
	    PyType_Ready(&DirType) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&kiln_module);
	if (!m)
		return NULL;
	if (!(Error = new_exc(m, "Error", NULL,
			      "Base of kiln's errors: code, cls (\"FRAME\", \"IO\", ...), tensor, "
			      "field, offset and errno say what and where.")) ||
	    !(FormatError = new_exc(m, "FormatError", Error,
				    "The file's bytes are not a valid KLNT v2 block.")) ||
	    !(FrameError = new_exc(m, "FrameError", FormatError, "Not a KLNT v2 block.")) ||
	    !(FormatTypeError = new_exc(m, "FormatTypeError", FormatError,
					"Fields contradict each other or the format rules.")) ||
	    !(LimitError = new_exc(m, "LimitError", FormatError,
				   "A count or length does not fit in the bytes available.")) ||
	    !(UTF8Error = new_exc(m, "UTF8Error", FormatError, "A name is not valid UTF-8.")))
		goto fail;
	PyObject *bases = PyTuple_Pack(2, Error, PyExc_OSError);
	if (!bases)
		goto fail;
	FileError = new_exc(m, "FileError", bases,
			    "A system call failed (kiln's IO class); also an OSError with errno.");
	Py_DECREF(bases);
	if (!FileError)
		goto fail;
	if (PyModule_AddObject(m, "Dir", Py_NewRef((PyObject *)&DirType)) < 0 ||
	    PyModule_AddObject(m, "Tensor", Py_NewRef((PyObject *)&TensorType)) < 0 ||
	    PyModule_AddStringConstant(m, "library_version", kiln_version()) < 0)
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
