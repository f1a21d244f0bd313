/* SPDX-License-Identifier: MIT */
/*
 * The BUFFER source: the caller's bytes, borrowed (kiln_model_parse). Every fetch is a pointer
 * into them; nothing is read, copied or released. The writer's check of a directory it is about
 * to write uses it too, with no payload behind the directory (f->base stays NULL, so do data
 * pointers).
 */
#include "source/source.h"

static int buffer_attach(struct kiln__file *f, const kiln_open_options *o, const void *buf,
			 size_t len, kiln_error *err)
{
	(void)o;
	static const uint8_t empty[1];
	f->load.source = KILN_SOURCE_BUFFER;
	f->size = len;
	f->src_state = (void *)(buf ? buf : empty);
	(void)err;
	return 0;
}

static const uint8_t *bytes(const struct kiln__file *f)
{
	return f->src_state;
}

static const uint8_t *buffer_fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep,
				   kiln_error *err)
{
	(void)len, (void)keep, (void)err;
	return bytes(f) + off;
}

static const uint8_t *buffer_prefix(struct kiln__file *f, uint64_t len, kiln_error *err)
{
	(void)len, (void)err;
	return bytes(f);
}

static int buffer_finish(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	(void)o, (void)err;
	f->base = bytes(f);
	f->mem = bytes(f);
	return 0;
}

static void buffer_release(struct kiln__file *f)
{
	f->src_state = NULL;
}

static int buffer_read(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		       kiln_error *err)
{
	(void)err;
	if (len)
		memcpy(dst, bytes(f) + off, len);
	return 0;
}

const struct kiln__source kiln__source_buffer = {
    .id = KILN_SOURCE_BUFFER,
    .attach = buffer_attach,
    .fetch = buffer_fetch,
    .prefix = buffer_prefix,
    .finish = buffer_finish,
    .release = buffer_release,
    .read = buffer_read,
    .feed = kiln__feed_local,
    .pinnable = 0,
};
