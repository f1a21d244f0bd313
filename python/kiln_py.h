/* SPDX-License-Identifier: MIT */
/*
 * What the files of kiln._kiln share (python/: errors.c, model.c, tensor.c, dlpack.c,
 * module.c, split by type as CPython's own extension modules are). The extension is over the
 * public API (include/kiln/kiln.h) only.
 */
#ifndef KILN_PY_H
#define KILN_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API  NPY_1_7_API_VERSION
/* One numpy C-API table for the module; module.c imports it. */
#define PY_ARRAY_UNIQUE_SYMBOL kiln_py_numpy_api
#ifndef KILN_PY_IMPORT_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <kiln/kiln.h>
#include <kiln/toolkit.h>

#include <stdlib.h>
#include <string.h>

/* A name as str (None for none); the library has checked it is well-formed UTF-8. */
static inline PyObject *name_of(const char *p, size_t len)
{
	if (!p)
		Py_RETURN_NONE;
	return PyUnicode_DecodeUTF8(p, (Py_ssize_t)len, "strict");
}

/* A dtype code's name as kiln spells it ("f32", "opaque"), "unknown" for none. */
static inline const char *dtype_name(unsigned code)
{
	const char *n = kiln_dtype_name(code);
	return n ? n : "unknown";
}

/*
 * The files form layers, each calling only those below it: module.c (the module) over model.c
 * (Owner, Model) over tensor.c (Tensor) over dlpack.c (capsules, DeviceView) over errors.c; cuda.c
 * beside them over dlpack.c.
 */

/* errors.c: raise the kiln.Error subclass for err->code (detail as attributes); NULL. */
PyObject *raise_kiln(int code, const kiln_error *e);
/* errors.c: create kiln.Error and its subclasses in module m; -1 with an exception set. */
int kp_add_errors(PyObject *m);
/* errors.c: TypeError: tensor `index` has a dtype `what` (numpy, DLPack) has no type for. */
PyObject *no_type(const kiln_tensor *t, uint64_t index, const char *what, const char *hint);
/* errors.c: ValueError for a view with no bytes in memory (a directory-only open): `what`
 * cannot view it. */
PyObject *no_data(const kiln_tensor *t, uint64_t index, const char *what);

/* model.c: the one reference-counted holder of a kiln_model. */
typedef struct {
	PyObject_HEAD kiln_model *model; /* one file or every shard of a series */
	Py_buffer held;                  /* parse(): the bytes the model's views point into */
	int holding;
	int writable; /* the bytes are this process's own: a private mapping or an owned block */
} OwnerObject;
extern PyTypeObject OwnerType;

/* model.c: Model (kiln.Model, also kiln.Dir), a model's Python face. */
typedef struct {
	PyObject_HEAD OwnerObject *owner; /* NULL once closed */
} ModelObject;
extern PyTypeObject ModelType;
PyObject *mod_open(PyObject *mod, PyObject *args, PyObject *kw);
PyObject *mod_parse(PyObject *mod, PyObject *data);

/* tensor.c: Tensor, one view. */
typedef struct {
	PyObject_HEAD OwnerObject *owner;
	const kiln_tensor *t; /* t->index: the model's index; t->file: its shard */
	uint64_t index;       /* the descriptor index in its shard's file */
} TensorObject;
extern PyTypeObject TensorType;
/* A Tensor for view t of owner's model; None for NULL (no such tensor). */
PyObject *tensor_new(OwnerObject *owner, const kiln_tensor *t);
/* A tensor's descriptor index in its shard's file (its model index less the file's first). */
uint64_t local_index(const kiln_model *m, const kiln_tensor *t);

/* dlpack.c: Tensor.__dlpack__, to_dlpack and __dlpack_device__. */
PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw);
PyObject *tensor_to_dlpack(TensorObject *self, PyObject *args, PyObject *kw);
PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused);
/* dlpack.c: a data pointer for empty payloads, so numpy and DLPack consumers never get NULL. */
extern const unsigned char empty_payload[64];
/* A DLPack capsule (CPU, uint8, 1-D) of len bytes at data, holding a reference to owner until
 * the consumer is done with it. */
PyObject *kp_bytes_capsule(void *data, uint64_t len, PyObject *owner);
/* Whether DLPack has a type for dtype code (kp_typed_capsule can carry it). */
int kp_dlpack_typed(unsigned code);
/* Tensor t's bytes at data as a typed, shaped host capsule (its dtype has a DLPack type). */
PyObject *kp_typed_capsule(const kiln_tensor *t, void *data, PyObject *owner);
/* dlpack.c: DeviceView, a tensor kiln_load placed in a device's arena; `arena` is the arena's
 * capsule (held). */
extern PyTypeObject DeviceViewType;
PyObject *kp_device_view(PyObject *arena, TensorObject *tensor, void *data, int32_t device_type,
			 int32_t device_id);

/* The parts of a DeviceView (-1 with TypeError for anything else). */
int kp_device_view_get(PyObject *view, void **data, uint64_t *len, int32_t *device_type,
		       int32_t *device_id);

#ifdef KILN_PY_CUDA
/* cuda.c, where the CUDA adapter is built: cuda_devices(), cuda_to_host(), cuda_pointer(). */
PyObject *mod_cuda_devices(PyObject *mod, PyObject *args, PyObject *kw);
PyObject *mod_cuda_device_count(PyObject *mod, PyObject *cap);
PyObject *mod_cuda_to_host(PyObject *mod, PyObject *view);
PyObject *mod_cuda_pointer(PyObject *mod, PyObject *arg);
#endif

/* A "kiln.device" capsule's pointer (made by kiln._cuda.devices(), python/cuda.c): a
 * kiln_load device table, the DLPack device type its memory has, and how many devices. */
struct kp_device {
	const kiln_device *device;
	int32_t dl_type; /* kDLCUDA = 2 */
	uint32_t count;
	void *state; /* the provider's (closed by the capsule's destructor) */
};

#endif
