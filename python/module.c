/* SPDX-License-Identifier: MIT */
/*
 * kiln._kiln: the CPython extension under the `kiln` package; this file has the writers'
 * functions, the method table and the module's initialisation.
 */
#define KILN_PY_IMPORT_NUMPY
#include "kiln_py.h"

/* A tensor's shape (any sequence of non-negative ints, at most KILN_MAX_RANK) into s; -1 with
 * the exception set. */
static int shape_of(PyObject *shape, kiln_tensor_spec *s)
{
	PyObject *sh = PySequence_Fast(shape, "shape must be a sequence");
	if (!sh)
		return -1;
	Py_ssize_t rank = PySequence_Fast_GET_SIZE(sh);
	int rc = 0;
	if (rank > KILN_MAX_RANK) {
		PyErr_Format(PyExc_ValueError, "rank %zd is more than %d", rank, KILN_MAX_RANK);
		rc = -1;
	}
	for (Py_ssize_t k = 0; !rc && k < rank; k++) {
		unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(sh, k));
		if (v == (unsigned long long)-1 && PyErr_Occurred())
			rc = -1;
		s->shape[k] = v;
	}
	if (!rc)
		s->rank = (uint8_t)rank;
	Py_DECREF(sh);
	return rc;
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
	static char *kwlist[] = {"path",     "tensors",  "sync",    "max_shard_size",
				 "metadata", "one_file", "digests", NULL};
	PyObject *path = NULL, *seq_in;
	int sync = 1, one_file = 0, digests = 1;
	unsigned long long max_shard = 0;
	Py_buffer meta = {0};
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|$pKz*pp:write_file", kwlist,
					 PyUnicode_FSConverter, &path, &seq_in, &sync, &max_shard,
					 &meta, &one_file, &digests))
		return NULL;
	if (one_file && (meta.buf || max_shard)) {
		PyBuffer_Release(&meta);
		Py_DECREF(path);
		PyErr_SetString(
		    PyExc_ValueError,
		    "one_file=True writes the tensors given, as one file: no metadata= or "
		    "max_shard_size= (pass the document as a tensor)");
		return NULL;
	}
	/* A tuple of its own: the names borrowed below stay alive whatever the caller's list does
	 * (another thread may change it while the GIL is released). */
	PyObject *seq = PySequence_Check(seq_in) ? PySequence_Tuple(seq_in) : NULL;
	if (!seq && !PyErr_Occurred())
		PyErr_SetString(PyExc_TypeError, "tensors must be a sequence");
	if (!seq) {
		PyBuffer_Release(&meta);
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
		if (shape_of(shape, s) < 0)
			goto free;
		if (PyObject_GetBuffer(data, &bufs[i], PyBUF_C_CONTIGUOUS) < 0)
			goto free;
		got = i + 1;
		s->data = bufs[i].buf;
		s->byte_length = (uint64_t)bufs[i].len;
	}
	kiln_error err;
	int rc;
	const char *p = PyBytes_AS_STRING(path);
	kiln_series_options o = {.size = sizeof(o),
				 .flags = (sync ? 0 : KILN_WRITE_NO_SYNC) |
					  (digests ? 0 : KILN_WRITE_NO_DIGESTS),
				 .max_shard_size = max_shard,
				 .metadata = meta.buf,
				 .metadata_len = meta.buf ? (size_t)meta.len : 0};
	kiln_series_result *res = PyMem_Malloc(sizeof(*res));
	if (!res) {
		PyErr_NoMemory();
		goto free;
	}
	Py_BEGIN_ALLOW_THREADS if (one_file)
	{
		rc = kiln_write_file(p, specs, (uint32_t)n, o.flags, &err);
		snprintf(res->first, sizeof(res->first), "%s", p);
	}
	else rc = kiln_write_series(p, specs, (uint64_t)n, &o, res, &err);
	Py_END_ALLOW_THREADS if (rc) raise_kiln(rc, &err);
	else result = PyUnicode_DecodeFSDefault(res->first);
	PyMem_Free(res);
free:
	release_buffers(bufs, got);
	PyMem_Free(specs);
	PyMem_Free(bufs);
out:
	PyBuffer_Release(&meta); /* a no-op when no metadata was given */
	Py_DECREF(seq);
	Py_DECREF(path);
	return result;
}

/*
 * write_safetensors(path, tensors, metadata=None, *, sync=True, digests=True): the safetensors
 * writer (kiln_safetensors_write_file, with the file's digest table in __metadata__ unless
 * digests is false; or with path None kiln_safetensors_write_memory into the bytes returned,
 * which has none). tensors: (name, safetensors dtype, shape, data_ptr, data_len) tuples; the caller
 * keeps the memory alive (safetensors' TensorSpec contract). metadata: None or a dict of str to
 * str. The GIL is released while the bytes are written.
 */
static PyObject *mod_write_safetensors(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"path", "tensors", "metadata", "sync", "digests", NULL};
	PyObject *path_in, *seq_in, *meta_in = Py_None, *path = NULL;
	int sync = 1, digests = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O$pp:write_safetensors", kwlist, &path_in,
					 &seq_in, &meta_in, &sync, &digests))
		return NULL;
	if (path_in != Py_None && !PyUnicode_FSConverter(path_in, &path))
		return NULL;
	/* A tuple of its own, as in write_file. */
	PyObject *seq = PySequence_Check(seq_in) ? PySequence_Tuple(seq_in) : NULL, *result = NULL;
	if (!seq && !PyErr_Occurred())
		PyErr_SetString(PyExc_TypeError, "tensors must be a sequence");
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
		if (shape_of(shape, sp) < 0)
			goto out;
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
		uint32_t flags =
		    (sync ? 0 : KILN_WRITE_NO_SYNC) | (digests ? 0 : KILN_WRITE_NO_DIGESTS);
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

static PyObject *mod_is_url(PyObject *mod, PyObject *arg)
{
	(void)mod;
	PyObject *b = NULL;
	if (!PyUnicode_FSConverter(arg, &b))
		return NULL;
	int r = kiln_path_is_url(PyBytes_AS_STRING(b));
	Py_DECREF(b);
	return PyBool_FromLong(r);
}

static PyObject *mod_shown(PyObject *mod, PyObject *arg)
{
	(void)mod;
	PyObject *b = NULL;
	if (!PyUnicode_FSConverter(arg, &b))
		return NULL;
	char buf[4096];
	kiln_path_shown(PyBytes_AS_STRING(b), buf, sizeof(buf));
	Py_DECREF(b);
	return PyUnicode_DecodeFSDefault(buf);
}

static PyMethodDef module_methods[] = {
    {"open", (PyCFunction)(void (*)(void))mod_open, METH_VARARGS | METH_KEYWORDS,
     "open(path, *, source=\"mmap\", direct=False, populate=False, verify=False,\n"
     "     copy_on_write=True, threads=0, format=\"auto\", align=False, one_file=False,\n"
     "     directory_only=False, timeout=0, verify_payload=False, pack_views=False) -> Model\n\n"
     "Open and validate a model: a KLNT file or any shard of a KLNT series\n"
     "(STEM-NNNNN-of-MMMMM.klnt), a .safetensors file, any shard of a sharded checkpoint or\n"
     "its model.safetensors.index.json, or a .gguf file or any part of a split one: every\n"
     "file of the model opens as one Model. format: \"auto\" (told from the first bytes) or\n"
     "\"klnt\", \"safetensors\", \"gguf\" to insist. align: give each tensor whose payload\n"
     "is misaligned for its dtype an aligned owned copy (safetensors promises no alignment;\n"
     "torch needs it); the others stay zero-copy. one_file: open a shard alone. source:\n"
     "\"mmap\" (a mapping), \"read\" or \"uring\" (the files read into owned memory;\n"
     "threads > 1 reads on that many threads, the GIL released), \"auto\". copy_on_write\n"
     "(mmap): map copy-on-write, so a consumer that writes through DLPack (torch) changes a\n"
     "private copy, never the file; False maps read-only shared, where such a write is a\n"
     "segmentation fault. directory_only: read the header and directory only (for a URL,\n"
     "one request): tensors have no bytes in memory, so numpy() and DLPack raise, while\n"
     "copy(), read_into(), Model.load() and Model.read_slices() read them through the source\n"
     "(ranged GETs for a URL). timeout: for a URL, seconds each operation (the open, the\n"
     "payload's fetch, each later read) may take, retries included, before FileError\n"
     "(ETIMEDOUT); 0: none past kiln's own limits per request. verify: check every byte\n"
     "against each file's digests (its own, or beside it: klnt digest) as it loads, and the\n"
     "payload rules:\n"
     "CorruptError names a differing chunk, NOTFOUND says how to make digests.\n"
     "verify_payload: the payload rules alone (KLNT's zero gaps). pack_views: keep the\n"
     "tensors' descriptions packed until each is first used (less memory for a model of\n"
     "thousands of tensors of which few are used; more time when all are). Raises a\n"
     "kiln.Error subclass."},
    {"write_file", (PyCFunction)(void (*)(void))mod_write_file, METH_VARARGS | METH_KEYWORDS,
     "write_file(path, tensors, *, sync=True, max_shard_size=0, metadata=None, one_file=False,\n"
     "           digests=True) -> str\n\n"
     "Write canonical KLNT: one file, or a series STEM-0000k-of-0000N.klnt beside path when\n"
     "the names need more than one file's heap or a shard's payload would pass max_shard_size\n"
     "(kiln_write_series). tensors: a sequence of (name or None, dtype name or code, shape,\n"
     "buffer[, fields]), fields a dict of layout, block_size, quant_scheme, quant_axis,\n"
     "group_size, scale_index, outer_index. metadata: the converters' document (bytes), written\n"
     "as kiln.metadata last in the first file. one_file=True writes exactly `path` as one\n"
     "file (kiln_write_file: a shard written by hand, its name not checked). digests=False:\n"
     "the tensors alone, without each file's digest table (kiln.digests, its last tensor).\n"
     "Returns the path of the (first) file."},
    {"dtype_bits", (PyCFunction)mod_dtype_bits, METH_O, "Bits per element of a dtype name."},
#ifdef KILN_PY_CUDA
    {"cuda_devices", (PyCFunction)(void (*)(void))mod_cuda_devices, METH_VARARGS | METH_KEYWORDS,
     "cuda_devices(lanes=0): every visible GPU as a load device for Model.load(device=...)\n"
     "(kiln_cuda_devices_open); kiln.Error (UNSUPPORTED) when none is usable."},
    {"cuda_device_count", (PyCFunction)mod_cuda_device_count, METH_O,
     "cuda_device_count(devices) -> int: the GPUs of a cuda_devices() handle."},
    {"cuda_to_host", (PyCFunction)mod_cuda_to_host, METH_O,
     "cuda_to_host(view) -> bytes: a DeviceView's bytes copied back to the host."},
    {"cuda_pointer", (PyCFunction)mod_cuda_pointer, METH_O,
     "cuda_pointer(address) -> (memory type, device), as cudaPointerGetAttributes says."},
#endif
    {"is_url", (PyCFunction)mod_is_url, METH_O,
     "is_url(path) -> bool: whether kiln fetches path as a URL (s3://, http://, https://)."},
    {"shown", (PyCFunction)mod_shown, METH_O,
     "shown(path) -> str: path as kiln's messages show it (a URL's password and query, which\n"
     "holds a presigned URL's signature, left out)."},
    {"parse", (PyCFunction)mod_parse, METH_O,
     "parse(data) -> Model\n\nValidate and index one file held in memory (bytes or any buffer): "
     "every check of open(); the tensors view `data`, which the Model keeps alive."},
    {"write_safetensors", (PyCFunction)(void (*)(void))mod_write_safetensors,
     METH_VARARGS | METH_KEYWORDS,
     "write_safetensors(path, tensors, metadata=None, *, sync=True, digests=True)\n"
     "    -> None or bytes\n\n"
     "The safetensors writer (kiln_safetensors_write_file, the file's digest table in\n"
     "__metadata__ unless digests=False; path None: the file as bytes, without one).\n"
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

PyMODINIT_FUNC PyInit__kiln(void);
PyMODINIT_FUNC PyInit__kiln(void)
{
	import_array();
	if (PyType_Ready(&OwnerType) < 0 || PyType_Ready(&TensorType) < 0 ||
	    PyType_Ready(&ModelType) < 0 || PyType_Ready(&DeviceViewType) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&kiln_module);
	if (!m)
		return NULL;
	if (kp_add_errors(m) < 0)
		goto fail;
	if (PyModule_AddObject(m, "Model", Py_NewRef((PyObject *)&ModelType)) < 0 ||
	    PyModule_AddObject(m, "Tensor", Py_NewRef((PyObject *)&TensorType)) < 0 ||
	    PyModule_AddObject(m, "DeviceView", Py_NewRef((PyObject *)&DeviceViewType)) < 0 ||
	    PyModule_AddStringConstant(m, "library_version", kiln_version()) < 0 ||
	    PyModule_AddStringConstant(m, "METADATA_TENSOR", KILN_METADATA_TENSOR) < 0)
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
