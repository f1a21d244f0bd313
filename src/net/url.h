/* SPDX-License-Identifier: MIT */
/* URLs (src/net/url.c): parsing them, never deciding what a caller's name is (the resolver's). */
#ifndef KILN_NET_URL_H
#define KILN_NET_URL_H

#include "base/base.h"

enum { KILN__URL_NONE, KILN__URL_S3, KILN__URL_HTTP };
/* Which scheme kiln fetches `s` starts with: s3://, http:// or https:// (HTTP), or NONE. */
int kiln__url_scheme(const char *s);
/* kiln__url_scheme(s) != NONE: the resolver's one question (src/model/resolve.c), and
 * kiln_path_is_url's answer. */
int kiln__is_url(const char *s);
/* Bytes of a URL before its query or fragment: what names the object. */
size_t kiln__url_name_len(const char *url);
/* The URL as a message shows it, into buf[0, cap) (KILN__URL_SHOWN bytes hold it): a password
 * before the host and the query (a presigned signature, a token) left out as "***@" and "?...",
 * a long name cut in the middle. */
#define KILN__URL_SHOWN 128
void kiln__url_shown(const char *url, char *buf, size_t cap);
/* The host of an http(s) URL (no user, no port), lowercased into buf[0, cap). */
void kiln__url_host(const char *url, char *buf, size_t cap);
/* Whether `host` is `domain` or a name under it. */
int kiln__host_is(const char *host, const char *domain);
/* The bearer token a request to `url` carries: HF_TOKEN for https:// to huggingface.co or hf.co
 * (or a name under them), never over http:// or to another host; NULL for none. */
const char *kiln__url_bearer(const char *url);
/* s3://BUCKET/KEY as an HTTP URL: ENDPOINT/BUCKET/KEY (path style) when there is an endpoint,
 * else AWS's virtual-hosted style in `region`; the key percent-encoded, slashes kept. malloc'd,
 * NULL without memory. */
char *kiln__s3_url(const char *bucket, size_t blen, const char *key, const char *endpoint,
		   const char *region);

#endif
