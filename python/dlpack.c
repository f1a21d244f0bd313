/* SPDX-License-Identifier: MIT */
/*
 * DLPack (v0.x ABI, defined here so no header is needed): capsules that view a tensor's payload
 * and hold the model while a consumer uses them.
 */
#include "kiln_py.h"

/* --- DLPack (v0.x ABI, defined here so no header is needed) ---------------------------------- */

/* Aligned for any dtype; numpy arrays of empty payloads point here too, so numpy never allocates
 * memory of its own for them. */
_Alignas(64) const unsigned char empty_payload[64];

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

/* A capsule of `rank` dims over data on `dev`, holding a reference to owner until consumed and
 * done with; raw: shape is the byte count and the type uint8. */
static PyObject *new_capsule(void *data, DLDevice dev, DLDataType dt, unsigned rank,
			     const uint64_t *shape, PyObject *owner)
{
	kiln_dlpack *d = calloc(1, sizeof(*d));
	if (!d)
		return PyErr_NoMemory();
	for (unsigned i = 0; i < rank; i++) {
		if (shape[i] > (uint64_t)INT64_MAX) {
			free(d);
			return PyErr_Format(PyExc_OverflowError, "dimension %u is too large", i);
		}
		d->shape[i] = (int64_t)shape[i];
	}
	/* Host memory is never NULL for a consumer; a device's empty tensor keeps its own. */
	d->m.dl_tensor.data = data || dev.device_type != 1 ? data : (void *)empty_payload;
	d->m.dl_tensor.device = dev;
	d->m.dl_tensor.ndim = (int32_t)rank;
	d->m.dl_tensor.dtype = dt;
	d->m.dl_tensor.shape = d->shape;
	d->m.dl_tensor.strides = NULL;
	d->m.dl_tensor.byte_offset = 0;
	Py_INCREF(owner);
	d->m.manager_ctx = owner;
	d->m.deleter = dlpack_deleter;
	PyObject *cap = PyCapsule_New(&d->m, "dltensor", dlpack_capsule_destructor);
	if (!cap)
		dlpack_deleter(&d->m);
	return cap;
}

/* The capsule of tensor t's bytes at data (typed, or raw: 1-D uint8). */
static PyObject *tensor_capsule(const kiln_tensor *t, uint64_t index, void *data, DLDevice dev,
				int raw, PyObject *owner)
{
	DLDataType dt = {1, 8, 1};
	if (!raw && dl_type(t->dtype, &dt) < 0)
		return no_type(t, index, "DLPack", "to_dlpack(raw=True) gives its bytes as uint8");
	uint64_t bytes = t->byte_length;
	return new_capsule(data, dev, dt, raw ? 1 : t->rank, raw ? &bytes : t->shape, owner);
}

PyObject *kp_bytes_capsule(void *data, uint64_t len, PyObject *owner)
{
	return new_capsule(len ? data : NULL, (DLDevice){1, 0}, (DLDataType){1, 8, 1}, 1, &len,
			   owner);
}

int kp_dlpack_typed(unsigned code)
{
	DLDataType dt;
	return dl_type(code, &dt) == 0;
}

PyObject *kp_typed_capsule(const kiln_tensor *t, void *data, PyObject *owner)
{
	return tensor_capsule(t, t->index, data, (DLDevice){1, 0}, 0, owner);
}

/* A DLPack capsule of the payload: typed, or (raw) its bytes as a 1-D uint8 tensor. */
static PyObject *make_capsule(TensorObject *self, int raw)
{
	const kiln_tensor *t = self->t;
	if (!t->data && t->byte_length)
		return no_data(t, self->index, "DLPack");
	return tensor_capsule(t, self->index, (void *)t->data, (DLDevice){1, 0}, raw,
			      (PyObject *)self->owner);
}

/* The array API's dl_device: a (type, id) pair, as a tuple or any sequence. */
static int parse_device(PyObject *o, int *type, int *id)
{
	PyObject *t = PySequence_Check(o) ? PySequence_Tuple(o) : NULL;
	if (!t) {
		PyErr_Clear();
		PyErr_SetString(PyExc_TypeError,
				"dl_device must be a (device type, device id) pair");
		return -1;
	}
	int ok = PyArg_ParseTuple(t, "ii:dl_device", type, id);
	Py_DECREF(t);
	return ok ? 0 : -1;
}

/*
 * The array API's keywords of __dlpack__: stream is the consumer's (host memory needs none; a
 * device load has finished every copy before it returned); max_version is met with the legacy
 * (v0.x) "dltensor" capsule, which every consumer reads; a copy or another device than `have`
 * cannot be given, and the protocol says to raise BufferError then. 0, or -1 with it raised.
 */
static int dlpack_request(PyObject *args, PyObject *kw, DLDevice have, const char *where,
			  const char *no_copy)
{
	static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
	PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OOO:__dlpack__", kwlist, &stream,
					 &max_version, &dl_device, &copy))
		return -1;
	if (copy == Py_True) {
		PyErr_SetString(PyExc_BufferError, no_copy);
		return -1;
	}
	if (dl_device != Py_None) {
		int type = 0, id = -1;
		if (parse_device(dl_device, &type, &id) < 0)
			return -1;
		if (type != have.device_type || id != have.device_id) {
			PyErr_Format(PyExc_BufferError, "%s (%d, %d), not (%d, %d)", where,
				     have.device_type, have.device_id, type, id);
			return -1;
		}
	}
	return 0;
}

PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
{
	if (dlpack_request(args, kw, (DLDevice){1, 0}, "kiln tensors are on the CPU",
			   "kiln tensors export views only; Tensor.copy() gives a copy") < 0)
		return NULL;
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

/* --- DeviceView: a loaded tensor in device memory (kiln_load into a device's arena) ---------- */

typedef struct {
	PyObject_HEAD PyObject *arena; /* the arena's capsule, which holds the device open */
	TensorObject *tensor;          /* what the bytes are (dtype, shape, name) */
	void *data;
	DLDevice dev;
} DeviceViewObject;

static void view_dealloc(DeviceViewObject *self)
{
	Py_XDECREF(self->arena);
	Py_XDECREF(self->tensor);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

PyObject *kp_device_view(PyObject *arena, TensorObject *tensor, void *data, int32_t device_type,
			 int32_t device_id)
{
	DeviceViewObject *v = PyObject_New(DeviceViewObject, &DeviceViewType);
	if (!v)
		return NULL;
	Py_INCREF(arena);
	Py_INCREF(tensor);
	v->arena = arena;
	v->tensor = tensor;
	v->data = data;
	v->dev = (DLDevice){device_type, device_id};
	return (PyObject *)v;
}

int kp_device_view_get(PyObject *view, void **data, uint64_t *len, int32_t *device_type,
		       int32_t *device_id)
{
	if (!PyObject_TypeCheck(view, &DeviceViewType)) {
		PyErr_SetString(PyExc_TypeError, "expected a kiln.DeviceView");
		return -1;
	}
	DeviceViewObject *v = (DeviceViewObject *)view;
	*data = v->data;
	*len = v->tensor->t->byte_length;
	*device_type = v->dev.device_type;
	*device_id = v->dev.device_id;
	return 0;
}

static PyObject *view_dlpack(DeviceViewObject *self, PyObject *args, PyObject *kw)
{
	if (dlpack_request(args, kw, self->dev, "this view is on",
			   "kiln device views export views only") < 0)
		return NULL;
	return tensor_capsule(self->tensor->t, self->tensor->index, self->data, self->dev, 0,
			      self->arena);
}

static PyObject *view_to_dlpack(DeviceViewObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"raw", NULL};
	int raw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:to_dlpack", kwlist, &raw))
		return NULL;
	return tensor_capsule(self->tensor->t, self->tensor->index, self->data, self->dev, raw,
			      self->arena);
}

static PyObject *view_dlpack_device(DeviceViewObject *self, PyObject *unused)
{
	(void)unused;
	return Py_BuildValue("(ii)", self->dev.device_type, self->dev.device_id);
}

static PyObject *view_get_address(DeviceViewObject *self, void *c)
{
	(void)c;
	return PyLong_FromVoidPtr(self->data);
}

static PyObject *view_get_tensor(DeviceViewObject *self, void *c)
{
	(void)c;
	Py_INCREF(self->tensor);
	return (PyObject *)self->tensor;
}

static PyObject *view_get_nbytes(DeviceViewObject *self, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(self->tensor->t->byte_length);
}

static PyGetSetDef view_getset[] = {
    {"address", (getter)view_get_address, NULL, "The bytes' device address (an int).", NULL},
    {"nbytes", (getter)view_get_nbytes, NULL, "Payload bytes.", NULL},
    {"tensor", (getter)view_get_tensor, NULL,
     "The kiln.Tensor these bytes are of (name, dtype, shape).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef view_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))view_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A DLPack capsule of the tensor on its device (typed; TypeError for a dtype DLPack has no\n"
     "type for: to_dlpack(raw=True) gives its bytes). The device memory lives while any\n"
     "capsule or view of the load does."},
    {"to_dlpack", (PyCFunction)(void (*)(void))view_to_dlpack, METH_VARARGS | METH_KEYWORDS,
     "to_dlpack(raw=False): a capsule as __dlpack__ gives; raw=True: the bytes as 1-D uint8."},
    {"__dlpack_device__", (PyCFunction)view_dlpack_device, METH_NOARGS,
     "(device type, device id): (2, N) for CUDA device N."},
    {NULL, NULL, 0, NULL}};

PyTypeObject DeviceViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.DeviceView",
    .tp_basicsize = sizeof(DeviceViewObject),
    .tp_dealloc = (destructor)view_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One tensor loaded into a device's memory by Model.load(device=...): DLPack only.",
    .tp_methods = view_methods,
    .tp_getset = view_getset,
};
