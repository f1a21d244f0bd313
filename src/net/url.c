/* SPDX-License-Identifier: MIT */
/*
 * URLs: which schemes kiln fetches, what in a URL names the object (not its query: a presigned
 * URL's signature changes, the object does not), how a URL is shown in a message (its query, a
 * credential, left out), its host, and s3://BUCKET/KEY as the HTTP URL it leads to. Parsing
 * only: whether a name a caller gave is a URL is the resolver's question (src/model/resolve.c).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/sys.h"
#include "net/url.h"

int kiln__url_scheme(const char *s)
{
	if (!s)
		return KILN__URL_NONE;
	if (!strncmp(s, "s3://", 5))
		return KILN__URL_S3;
	if (!strncmp(s, "http://", 7) || !strncmp(s, "https://", 8))
		return KILN__URL_HTTP;
	return KILN__URL_NONE;
}

int kiln__is_url(const char *s)
{
	return kiln__url_scheme(s) != KILN__URL_NONE;
}

size_t kiln__url_name_len(const char *url)
{
	return strcspn(url, "?#");
}

static int unreserved(unsigned char c)
{
	return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

char *kiln__s3_url(const char *bucket, size_t blen, const char *key, const char *endpoint,
		   const char *region)
{
	size_t klen = strlen(key);
	char *enc = malloc(klen * 3 + 1), *q = enc;
	if (!enc)
		return NULL;
	for (size_t i = 0; i < klen; i++) {
		unsigned char c = (unsigned char)key[i];
		if (unreserved(c) || c == '/')
			*q++ = (char)c;
		else
			q += sprintf(q, "%%%02X", c);
	}
	*q = '\0';
	char *url = NULL;
	int n;
	if (endpoint) {
		size_t el = strlen(endpoint);
		while (el && endpoint[el - 1] == '/')
			el--;
		n = asprintf(&url, "%.*s/%.*s/%s", (int)el, endpoint, (int)blen, bucket, enc);
	} else {
		n = asprintf(&url, "https://%.*s.s3.%s.amazonaws.com/%s", (int)blen, bucket, region,
			     enc);
	}
	free(enc);
	return n < 0 ? NULL : url;
}

void kiln__url_host(const char *url, char *buf, size_t cap)
{
	const char *h = strstr(url, "://");
	h = h ? h + 3 : url;
	const char *at = h;
	while (*at && *at != '/' && *at != '?' && *at != '#')
		at++;
	const char *u = memchr(h, '@', (size_t)(at - h));
	if (u)
		h = u + 1;
	size_t n = 0;
	while (h < at && *h != ':' && n + 1 < cap)
		buf[n++] = (char)tolower((unsigned char)*h++);
	buf[n] = '\0';
}

int kiln__host_is(const char *host, const char *domain)
{
	size_t a = strlen(host), b = strlen(domain);
	return !strcmp(host, domain) ||
	       (a > b && host[a - b - 1] == '.' && !strcmp(host + a - b, domain));
}

void kiln__url_shown(const char *url, char *buf, size_t cap)
{
	size_t n = kiln__url_name_len(url);
	const char *more = url[n] ? "?..." : "";
	/* user:password@ before the host: a credential, left out */
	const char *a = strstr(url, "://");
	size_t from = a && (size_t)(a - url) < n ? (size_t)(a - url) + 3 : 0;
	size_t auth = from + strcspn(url + from, "/?#");
	const char *at = memchr(url + from, '@', auth - from);
	char name[512];
	if (at)
		snprintf(name, sizeof(name), "%.*s***%.*s", (int)from, url,
			 (int)(n - (size_t)(at - url)), at);
	else
		snprintf(name, sizeof(name), "%.*s", (int)n, url);
	n = strlen(name);
	if (n > 100)
		snprintf(buf, cap, "%.40s...%s%s", name, name + n - 56, more);
	else
		snprintf(buf, cap, "%s%s", name, more);
}

const char *kiln__url_bearer(const char *url)
{
	const char *tok = kiln__env("HF_TOKEN");
	char host[256];
	if (!tok || strncmp(url, "https://", 8))
		return NULL; /* a bearer token in cleartext is anyone's on the path */
	kiln__url_host(url, host, sizeof(host));
	return kiln__host_is(host, "huggingface.co") || kiln__host_is(host, "hf.co") ? tok : NULL;
}
