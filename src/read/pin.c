/* SPDX-License-Identifier: MIT */
/*
 * Pinning tensors for DMA: mlock the page range covering a tensor, then the caller's hook (for
 * example cudaHostRegister with read-only registration). Pins are counted per tensor; mlock is
 * not counted by the kernel, so unpinning one range re-locks what other live pins still cover.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "read/read.h"
#include "base/sys.h"

struct kiln__pin {
	uint64_t tensor;
	uint32_t count;
	uint8_t *ptr;
	size_t len;
	kiln_pin_hooks hooks;
};

static struct kiln__pin *find(kiln_model *m, uint64_t index)
{
	for (uint32_t i = 0; i < m->npins; i++)
		if (m->pins[i].tensor == index)
			return &m->pins[i];
	return NULL;
}

/* munlock [ptr, ptr + len), then lock again the pages a live pin other than `self` still covers:
 * mlock is not counted, so the first munlock of a page unlocks it for every pin. */
static void unlock_range(kiln_model *m, uint8_t *ptr, size_t len, const struct kiln__pin *self)
{
	munlock(ptr, len);
	for (uint32_t i = 0; i < m->npins; i++) {
		const struct kiln__pin *o = &m->pins[i];
		if (o == self || !o->len)
			continue;
		uint8_t *a = o->ptr > ptr ? o->ptr : ptr;
		uint8_t *b = o->ptr + o->len < ptr + len ? o->ptr + o->len : ptr + len;
		if (a < b)
			mlock(a, (size_t)(b - a));
	}
}

static void unpin_range(kiln_model *m, struct kiln__pin *p)
{
	if (!p->len)
		return;
	if (p->hooks.unpin)
		p->hooks.unpin(p->hooks.ctx, p->ptr, p->len);
	unlock_range(m, p->ptr, p->len, p);
}

int kiln_tensor_pin(kiln_model *m, uint64_t index, const kiln_pin_hooks *hooks, kiln_error *err)
{
	kiln__clear_error(err);
	const kiln_tensor *t = kiln__tensor_or_fail(m, index, err);
	if (!t)
		return KILN_INVAL;
	if (!kiln__file_pinnable(&m->files[t->file]))
		return kiln__fail(err, KILN_UNSUPPORTED, index, NULL, KILN_NO_OFFSET,
				  "a borrowed buffer is the caller's to pin");
	struct kiln__pin *p = find(m, index);
	if (p) {
		p->count++;
		m->pinned++;
		return 0;
	}
	if (m->npins == m->pins_cap) {
		uint32_t cap = m->pins_cap ? m->pins_cap * 2 : 8;
		struct kiln__pin *n = realloc(m->pins, cap * sizeof(*n));
		if (!n)
			return kiln__nomem(err, 0, NULL);
		m->pins = n;
		m->pins_cap = cap;
	}
	uintptr_t page = kiln__page_size();
	uintptr_t a = (uintptr_t)t->data / page * page;
	uintptr_t b = ((uintptr_t)t->data + (uintptr_t)t->byte_length + page - 1) / page * page;
	struct kiln__pin pin = {.tensor = index, .count = 1, .ptr = (uint8_t *)a, .len = b - a};
	if (hooks)
		pin.hooks = *hooks;
	if (pin.len) {
		if (kiln__sys.mlock(pin.ptr, pin.len) != 0) {
			int rc = kiln__mlock_fail(err, errno, pin.len);
			if (err)
				err->tensor = index;
			return rc;
		}
		if (pin.hooks.pin) {
			/* The hook reports into its own zeroed struct: the caller's err may be
			 * NULL, and the hook must not be able to fake kiln's other fields. */
			kiln_error why = {0};
			int e = pin.hooks.pin(pin.hooks.ctx, pin.ptr, pin.len, &why);
			if (e) {
				unlock_range(m, pin.ptr, pin.len, NULL);
				why.message[sizeof(why.message) - 1] = '\0';
				if (!why.message[0])
					snprintf(why.message, sizeof(why.message), "it returned %d",
						 e);
				int rc = kiln__fail_sys(
				    err, KILN_IO, why.sys_errno > 0 ? why.sys_errno : 0,
				    "the pin hook failed for tensor %" PRIu64 ": %s", index,
				    why.message);
				if (err)
					err->tensor = index;
				return rc;
			}
		}
	}
	m->pins[m->npins++] = pin;
	m->pinned++;
	return 0;
}

int kiln_tensor_unpin(kiln_model *m, uint64_t index, kiln_error *err)
{
	kiln__clear_error(err);
	struct kiln__pin *p = m ? find(m, index) : NULL;
	if (!p)
		return kiln__fail_inval(err, index, NULL, "tensor %" PRIu64 " is not pinned",
					index);
	m->pinned--;
	if (--p->count)
		return 0;
	unpin_range(m, p);
	*p = m->pins[--m->npins];
	return 0;
}

void kiln__pins_release(struct kiln_model *m)
{
	while (m->npins) {
		struct kiln__pin *p = &m->pins[m->npins - 1];
		unpin_range(m, p);
		m->npins--;
	}
	free(m->pins);
	m->pins = NULL;
	m->pins_cap = 0;
	m->pinned = 0;
}
