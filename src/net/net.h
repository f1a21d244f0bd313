/* SPDX-License-Identifier: MIT */
/*
 * Objects behind URLs (s3://, http://, https://), fetched with ranged GETs over libcurl
 * (src/net/http.c): where a URL leads and with which credentials (src/net/aws.c), the first GET
 * that pins the object's size and ETag, and ranges fetched many at a time with retries. The
 * REMOTE source (src/source/remote.c) is built on it; nothing here knows a format.
 */
#ifndef KILN_NET_NET_H
#define KILN_NET_NET_H

#include "net/url.h"

struct kiln__remote;

/* Where `url` leads (the environment and `o` read once, here). INVAL for a URL kiln cannot use
 * (not one of its schemes: "not a URL kiln fetches"), NOMEM. */
int kiln__remote_new(const char *url, const kiln_remote_options *o, struct kiln__remote **out,
		     kiln_error *err);
void kiln__remote_free(struct kiln__remote *r);

/* The first GET: bytes [0, want) or the whole object when it is shorter, into dst (want bytes
 * of room). Pins the object's size and ETag; *got is how many bytes came. */
int kiln__remote_pin(struct kiln__remote *r, uint64_t want, uint8_t *dst, uint64_t *got,
		     kiln_error *err);
uint64_t kiln__remote_size(const struct kiln__remote *r);
/* The pinned ETag, "" when the server sent none. */
const char *kiln__remote_etag(const struct kiln__remote *r);

/* Bytes [off, off + len) of each span into its dst, many GETs in flight, each span cut into
 * chunks, and spans in ascending order a small gap apart fetched together in one GET (the
 * rows of a slice, small tensors one after another); `progress` says whether the options'
 * progress callback hears of it. `stop` (NULL: none), once nonzero, ends the transfers in
 * flight within a poll (100 ms): CANCELED. Safe from several threads at once (calls are
 * serialized per object). */
int kiln__remote_get(struct kiln__remote *r, const struct kiln__span *spans, size_t n, int progress,
		     const _Atomic int *stop, kiln_error *err);

/* The text of the first <TAG>..</TAG> of an S3 error body (NUL-terminated, at most `tag` of 30
 * bytes), into out[0, cap) with every unprintable byte as '?', cut to fit; "" when there is no
 * such element. Exposed for its fuzz target (fuzz/fuzz_s3error.c). */
void kiln__xml_field(const char *body, const char *tag, char *out, size_t cap);

/* A whole small object (a safetensors index) of at most `cap` bytes, NUL-terminated, in
 * malloc'ed memory. LIMIT when it is larger. */
int kiln__remote_read_small(const char *url, const kiln_remote_options *o, size_t cap, char **out,
			    size_t *len, kiln_error *err);

/* The object beside r's, named as r's with `suffix` after it (a sidecar), fetched with r's
 * credentials over one connection: its size in *size and, in malloc'ed *out, all of it when it
 * has at most `cap` bytes, else its first min(head, size) bytes (*len says how many). NOTFOUND
 * when the server has none (404; 401 and 403 too, which S3 answers for a missing key to a
 * client that may not list the bucket); INVAL for a URL with a query (a signed URL names one
 * object); else the fetch's errors, naming the sidecar's URL. */
int kiln__remote_beside(struct kiln__remote *r, const char *suffix, size_t cap, size_t head,
			uint8_t **out, size_t *len, uint64_t *size, kiln_error *err);

/* The options as given, checked (INVAL naming the field). NULL is every default. */
int kiln__remote_check_options(const kiln_remote_options *o, kiln_error *err);

#endif
