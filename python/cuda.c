/* SPDX-License-Identifier: MIT */
/*
 * kiln._kiln's CUDA functions, built in only where the CUDA adapter is (adapters/cuda/, with the
 * toolkit): the GPUs as a load device (a "kiln.device" capsule for Model.load(device=...)), and
 * two small queries for checking what landed without a CUDA-enabled torch.
 */
#include "kiln_py.h" /* Python.h first, as CPython asks */

#include <cuda_runtime_api.h>

#include <kiln/kiln_cuda.h>

static void close_devices(PyObject *cap)
{
	struct kp_device *d = PyCapsule_GetPointer(cap, "kiln.device");
	if (!d)
		return;
	kiln_cuda_devices_close(d->state);
	free(d);
}

/* cuda_devices(lanes=0): every visible GPU (kiln_cuda_devices_open). */
PyObject *mod_cuda_devices(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"lanes", NULL};
	unsigned int lanes = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|I:cuda_devices", kwlist, &lanes))
		return NULL;
	kiln_cuda_devices *gpus = NULL;
	kiln_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS rc = kiln_cuda_devices_open(lanes, &gpus, &err);
	Py_END_ALLOW_THREADS if (rc) return raise_kiln(rc, &err);
	struct kp_device *d = calloc(1, sizeof(*d));
	if (!d) {
		kiln_cuda_devices_close(gpus);
		return PyErr_NoMemory();
	}
	d->device = kiln_cuda_device(gpus);
	d->dl_type = 2; /* kDLCUDA */
	d->count = d->device->count;
	d->state = gpus;
	PyObject *cap = PyCapsule_New(d, "kiln.device", close_devices);
	if (!cap) {
		kiln_cuda_devices_close(gpus);
		free(d);
	}
	return cap;
}

/* cuda_device_count(devices) -> int: the GPUs of a cuda_devices() handle. */
PyObject *mod_cuda_device_count(PyObject *mod, PyObject *cap)
{
	(void)mod;
	const struct kp_device *d = PyCapsule_GetPointer(cap, "kiln.device");
	return d ? PyLong_FromUnsignedLong(d->count) : NULL;
}

/* cuda_to_host(view) -> bytes: a DeviceView's bytes copied back (cudaMemcpy). */
PyObject *mod_cuda_to_host(PyObject *mod, PyObject *view)
{
	(void)mod;
	void *data;
	uint64_t len;
	int32_t type, id;
	(void)id;
	if (kp_device_view_get(view, &data, &len, &type, &id) < 0)
		return NULL;
	if (type != 2)
		return PyErr_Format(PyExc_ValueError, "the view is on device type %d, not CUDA (2)",
				    type);
	if (len > (uint64_t)PY_SSIZE_T_MAX)
		return PyErr_NoMemory();
	PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
	if (!b || !len)
		return b;
	/* Unified addressing knows the device from the pointer: the caller's current device is
	 * left as it is. */
	cudaError_t e;
	Py_BEGIN_ALLOW_THREADS e =
	    cudaMemcpy(PyBytes_AS_STRING(b), data, (size_t)len, cudaMemcpyDefault);
	Py_END_ALLOW_THREADS if (e != cudaSuccess)
	{
		Py_DECREF(b);
		return PyErr_Format(PyExc_RuntimeError, "cudaMemcpy of %llu bytes failed: %s (%d)",
				    (unsigned long long)len, cudaGetErrorString(e), (int)e);
	}
	return b;
}

/* cuda_pointer(address) -> (memory type, device): cudaPointerGetAttributes (type 2: device
 * memory, 1: pinned host, 0: unregistered host). */
PyObject *mod_cuda_pointer(PyObject *mod, PyObject *arg)
{
	(void)mod;
	void *p = PyLong_AsVoidPtr(arg);
	if (!p && PyErr_Occurred())
		return NULL;
	struct cudaPointerAttributes a;
	memset(&a, 0, sizeof(a));
	cudaError_t e = cudaPointerGetAttributes(&a, p);
	if (e != cudaSuccess)
		cudaGetLastError(); /* not left for the next caller (torch) to find */
	if (e != cudaSuccess)
		return PyErr_Format(PyExc_RuntimeError, "cudaPointerGetAttributes failed: %s (%d)",
				    cudaGetErrorString(e), (int)e);
	return Py_BuildValue("(ii)", (int)a.type, a.device);
}
