/* SPDX-License-Identifier: MIT */
/*
 * kiln.Error and its subclasses: one per error class, carrying the error's detail; and the
 * TypeError and ValueError of a view that numpy or DLPack cannot give.
 */
#include "kiln_py.h"

/* ---------------------------------------------------------------------------------------------
 * Exceptions
 * ------------------------------------------------------------------------------------------- */

static PyObject *Error, *FormatError, *FrameError, *FormatTypeError, *LimitError, *UTF8Error,
    *FileError, *CorruptError;

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
	case KILN_CORRUPT:
		return CorruptError;
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
PyObject *raise_kiln(int code, const kiln_error *e)
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

/* Messages name a tensor by its descriptor index in its file (Tensor.index), `index` here. */
PyObject *no_type(const kiln_tensor *t, uint64_t index, const char *what, const char *hint)
{
	PyObject *name = name_of(t->name, t->name_len);
	if (!name)
		return NULL;
	PyErr_Format(PyExc_TypeError, "tensor %llu (%R) has dtype %s, which %s has no type for; %s",
		     (unsigned long long)index, name, dtype_name(t->dtype), what, hint);
	Py_DECREF(name);
	return NULL;
}

PyObject *no_data(const kiln_tensor *t, uint64_t index, const char *what)
{
	PyObject *name = name_of(t->name, t->name_len);
	if (!name)
		return NULL;
	PyErr_Format(PyExc_ValueError,
		     "tensor %llu (%R) was opened directory-only: its bytes are not in memory, so "
		     "%s cannot view them; copy(), read_into(), Model.load() or "
		     "Model.read_slices() read them",
		     (unsigned long long)index, name, what);
	Py_DECREF(name);
	return NULL;
}

static PyObject *new_exc(PyObject *m, const char *name, PyObject *bases, const char *doc)
{
	char full[64];
	snprintf(full, sizeof(full), "kiln.%s", name);
	PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	if (e && PyModule_AddObject(m, name, Py_NewRef(e)) < 0)
		Py_CLEAR(e);
	return e;
}

int kp_add_errors(PyObject *m)
{
	if (!(Error = new_exc(m, "Error", NULL,
			      "Base of kiln's errors: code, cls (\"FRAME\", \"IO\", ...), tensor, "
			      "field, offset and errno say what and where.")) ||
	    !(FormatError = new_exc(m, "FormatError", Error,
				    "The file's bytes were rejected by its format's rules (KLNT, "
				    "safetensors, GGUF).")) ||
	    !(FrameError = new_exc(m, "FrameError", FormatError,
				   "Not the file it claims to be: magic, framing, syntax.")) ||
	    !(FormatTypeError = new_exc(m, "FormatTypeError", FormatError,
					"Fields contradict each other or the format rules.")) ||
	    !(LimitError = new_exc(m, "LimitError", FormatError,
				   "A count or length does not fit in the bytes available.")) ||
	    !(UTF8Error =
		  new_exc(m, "UTF8Error", FormatError, "A name or string is not valid UTF-8.")) ||
	    !(CorruptError = new_exc(m, "CorruptError", Error,
				     "Bytes differ from their digest (kiln's CORRUPT class): the "
				     "file, chunk, byte range and tensor are in the message.")))
		return -1;
	PyObject *bases = PyTuple_Pack(2, Error, PyExc_OSError);
	if (!bases)
		return -1;
	FileError = new_exc(m, "FileError", bases,
			    "A system call failed (kiln's IO class); also an OSError with errno.");
	Py_DECREF(bases);
	if (!FileError)
		return -1;
	return 0;
}
