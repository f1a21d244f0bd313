/* SPDX-License-Identifier: MIT */
/*
 * DLPack (v0.x ABI, defined here so no header is needed): capsules that view a tensor's payload
 * and hold the model while a consumer uses them.
 */
#include "kiln_py.h"

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

PyObject *kp_bytes_capsule(void *data, uint64_t len, PyObject *owner)
{
	if (len > (uint64_t)INT64_MAX)
		return PyErr_Format(PyExc_OverflowError, "%llu bytes are too many",
				    (unsigned long long)len);
	kiln_dlpack *d = calloc(1, sizeof(*d));
	if (!d)
		return PyErr_NoMemory();
	d->shape[0] = (int64_t)len;
	d->m.dl_tensor.data = len ? data : (void *)empty_payload;
	d->m.dl_tensor.device.device_type = 1;
	d->m.dl_tensor.ndim = 1;
	d->m.dl_tensor.dtype = (DLDataType){1, 8, 1};
	d->m.dl_tensor.shape = d->shape;
	Py_INCREF(owner);
	d->m.manager_ctx = owner;
	d->m.deleter = dlpack_deleter;
	PyObject *cap = PyCapsule_New(&d->m, "dltensor", dlpack_capsule_destructor);
	if (!cap)
		dlpack_deleter(&d->m);
	return cap;
}

/* A DLPack capsule of the payload: typed, or (raw) its bytes as a 1-D uint8 tensor. */
static PyObject *make_capsule(TensorObject *self, int raw)
{
	const kiln_tensor *t = self->t;
	if (!t->data && t->byte_length)
		return no_data(t, self->index, "DLPack");
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

PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
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

PyObject *tensor_to_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"raw", NULL};
	int raw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:to_dlpack", kwlist, &raw))
		return NULL;
	return make_capsule(self, raw);
}

PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
	(void)self;
	(void)unused;
	return Py_BuildValue("(ii)", 1, 0);
}
