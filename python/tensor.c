/* SPDX-License-Identifier: MIT */
/*
 * Tensor: one view of an open model (name, dtype, shape, layout and quantization fields),
 * numpy arrays of it, copies and reads.
 */
#include "kiln_py.h"

/* ---------------------------------------------------------------------------------------------
 * Tensor views
 * ------------------------------------------------------------------------------------------- */

uint64_t local_index(const kiln_model *m, const kiln_tensor *t)
{
	kiln_file_info fi;
	if (kiln_model_file_info(m, t->file, &fi))
		return t->index;
	return t->index - fi.first_tensor;
}

PyObject *tensor_new(OwnerObject *owner, const kiln_tensor *t)
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

static PyObject *tensor_get_name(TensorObject *self, void *c)
{
	(void)c;
	return name_of(self->t->name, self->t->name_len);
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

static PyObject *tensor_get_safetensors_dtype(TensorObject *self, void *c)
{
	(void)c;
	const char *s = kiln_safetensors_dtype(self->t, NULL);
	if (!s)
		Py_RETURN_NONE;
	return PyUnicode_FromString(s);
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

static PyObject *tensor_get_role(TensorObject *self, void *c)
{
	(void)c;
	return PyUnicode_FromString(self->t->role == KILN_ROLE_METADATA ? "metadata" : "model");
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
     "Index in the Model: over the whole series (the descriptor index for one file).", NULL},
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
    {"safetensors_dtype", (getter)tensor_get_safetensors_dtype, NULL,
     "The dtype string safetensors gives this view (\"F32\", \"C64\", ...), or None when "
     "safetensors has none (kiln_safetensors_dtype).",
     NULL},
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
    {"role", (getter)tensor_get_role, NULL,
     "\"model\", or \"metadata\" for the converters' metadata document (kiln.metadata), "
     "which loads of a model's weights leave out (kiln_tensor_role).",
     NULL},
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
	if (!self->t->data && self->t->byte_length)
		return no_data(self->t, self->index, "numpy()");
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
	 * the other arrays of the same Model, never by the file). */
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
     "process's copy of the page only (seen by the Model's other views, never by the file);\n"
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

PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A view of one tensor of an open model: plain fields, numpy(), __dlpack__().",
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
};
