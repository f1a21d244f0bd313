/* SPDX-License-Identifier: MIT */
/*
 * Objects behind URLs, over libcurl (Debian's libcurl 7.88 speaks HTTP/1.1 and HTTPS with
 * connection reuse and signs S3 requests with SigV4 itself, so kiln writes neither a client
 * nor a signer). A server is as hostile as a file: every response is checked against what was
 * asked (status, Content-Range, the pinned ETag and size) before a byte of it lands, a body
 * never writes past its range, and an error body is read to 1 KiB at most.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/sys.h"
#include "net/aws.h"
#include "net/net.h"

#define CONN_MAX KILN__REMOTE_CONNECTIONS_MAX
#define ERR_BODY KILN__REMOTE_ERROR_BODY

struct kiln__remote {
	char *url;       /* what is fetched */
	char shown[128]; /* the URL for messages: the query (a signature) left out */
	char sigv4[96];  /* "aws:amz:REGION:s3", or empty for unsigned requests */
	char *userpwd;   /* "ACCESS:SECRET" */
	char *bearer;
	char *ca_bundle;
	struct curl_slist *headers; /* every request's; If-Match joins them at the pin */
	/* The headers of a request redirected to another origin (scheme, host or port): If-Match
	 * alone, no credential of any kind (the session token is a header of `headers`). */
	struct curl_slist *plain;
	uint32_t connections, chunk, retries, stall_ms;
	uint64_t min_rate; /* bytes a second a request must average, past the stall limit */
	uint64_t deadline_ms, cap_bps;
	int (*progress)(void *, uint64_t, uint64_t);
	void *progress_ctx;
	/* what the first GET pinned: the size, and the validator later requests ask for (a strong
	 * ETag with If-Match; else Last-Modified with If-Unmodified-Since, a weak ETag compared on
	 * every answer too); `unversioned` when the server gave neither */
	int pinned, unversioned;
	char modified[64];
	uint64_t size;
	char etag[256];
	pthread_mutex_t lock; /* one fetch at a time: the multi handle and the idle handles */
	CURLM *multi;
	CURL *idle[CONN_MAX];
	uint32_t nidle;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void init_curl(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int kiln__remote_check_options(const kiln_remote_options *o, kiln_error *err)
{
	if (!o)
		return 0;
	int rc = kiln__check_size("kiln_remote_options", o->size, sizeof(*o), err);
	if (rc)
		return rc;
	if (o->connections > CONN_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "remote.connections",
					"connections %u is above %u", o->connections, CONN_MAX);
	if (o->chunk_size &&
	    (o->chunk_size < KILN__REMOTE_CHUNK_MIN || o->chunk_size > KILN__REQUEST_MAX))
		return kiln__fail_inval(err, KILN_NO_INDEX, "remote.chunk_size",
					"chunk_size %u is outside 64 KiB to 1 GiB", o->chunk_size);
	if (o->reserved32)
		return kiln__fail_inval(err, KILN_NO_INDEX, "remote.reserved32",
					"kiln_remote_options.reserved32 is not 0");
	for (size_t i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, "remote.reserved",
						"kiln_remote_options.reserved[%zu] is not 0", i);
	return 0;
}

/* --- where a URL leads ------------------------------------------------------------------- */

/* "NAME: VALUE" appended to the header list *list; -1 when out of memory. */
static int add_header(struct curl_slist **list, const char *name, const char *value)
{
	char *h = NULL;
	if (asprintf(&h, "%s: %s", name, value) < 0)
		return -1;
	struct curl_slist *l = curl_slist_append(*list, h);
	free(h);
	if (!l)
		return -1;
	*list = l;
	return 0;
}

int kiln__remote_new(const char *url, const kiln_remote_options *o, struct kiln__remote **out,
		     kiln_error *err)
{
	*out = NULL;
	int rc = kiln__remote_check_options(o, err);
	if (rc)
		return rc;
	int scheme = kiln__url_scheme(url);
	if (scheme == KILN__URL_NONE)
		return kiln__fail_inval(err, KILN_NO_INDEX, "url", "not a URL kiln fetches: %.200s",
					url ? url : "(null)");
	pthread_once(&curl_once, init_curl);
	if (curl_init_rc != CURLE_OK)
		return kiln__fail_sys(err, KILN_IO, EIO, "libcurl did not initialize: %s",
				      curl_easy_strerror(curl_init_rc));
	struct kiln__remote *r = calloc(1, sizeof(*r));
	if (!r)
		return kiln__nomem(err, 0, NULL);
	pthread_mutex_init(&r->lock, NULL);
	kiln__url_shown(url, r->shown, sizeof(r->shown));
	r->connections = o && o->connections ? o->connections : KILN__REMOTE_CONNECTIONS_DEFAULT;
	r->chunk = o && o->chunk_size ? o->chunk_size : KILN__REMOTE_CHUNK_DEFAULT;
	r->retries = !o || !o->retries                    ? KILN__REMOTE_RETRIES_DEFAULT
		     : o->retries == KILN_REMOTE_NO_RETRY ? 0
							  : o->retries;
	r->stall_ms = o && o->stall_ms ? o->stall_ms : KILN__REMOTE_STALL_MS_DEFAULT;
	r->min_rate =
	    o && o->min_bytes_per_sec ? o->min_bytes_per_sec : KILN__REMOTE_MIN_RATE_DEFAULT;
	r->deadline_ms = o ? o->deadline_ms : 0;
	r->cap_bps = o ? o->max_bytes_per_sec : 0;
	r->progress = o ? o->progress : NULL;
	r->progress_ctx = o ? o->progress_ctx : NULL;
	const char *ca = o && o->ca_bundle ? o->ca_bundle : NULL;
	if (scheme == KILN__URL_S3) {
		const char *b = url + 5, *slash = strchr(b, '/');
		size_t blen = slash ? (size_t)(slash - b) : strlen(b);
		int ok = blen >= 1 && blen <= 63 && slash && slash[1];
		for (size_t i = 0; ok && i < blen; i++)
			ok = isalnum((unsigned char)b[i]) || b[i] == '-' || b[i] == '.' ||
			     b[i] == '_';
		if (!ok) {
			kiln__fail_inval(err, KILN_NO_INDEX, "path",
					 "%s is not s3://BUCKET/KEY (a bucket of letters, digits, "
					 "'.', '-', '_' and a key)",
					 r->shown);
			kiln__remote_free(r);
			return KILN_INVAL;
		}
		struct kiln__aws a;
		if ((rc = kiln__aws_settings(o, &a, err))) {
			kiln__remote_free(r);
			return rc;
		}
		r->url = kiln__s3_url(b, blen, slash + 1, a.endpoint, a.region);
		if (a.access) {
			snprintf(r->sigv4, sizeof(r->sigv4), "aws:amz:%s:s3", a.region);
			if (asprintf(&r->userpwd, "%s:%s", a.access, a.secret) < 0)
				r->userpwd = NULL;
		}
		/* SigV4 covers the payload's hash; a GET has none to send. */
		r->headers = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
		int bad = !r->url || (a.access && !r->userpwd) || !r->headers ||
			  (a.token && add_header(&r->headers, "x-amz-security-token", a.token));
		if (!ca)
			ca = kiln__env("AWS_CA_BUNDLE");
		kiln__aws_free(&a);
		if (bad) {
			kiln__remote_free(r);
			return kiln__nomem(err, 0, NULL);
		}
	} else {
		r->url = strdup(url);
		char host[256];
		kiln__url_host(url, host, sizeof(host));
		if (!host[0]) {
			kiln__fail_inval(err, KILN_NO_INDEX, "path", "%s has no host", r->shown);
			kiln__remote_free(r);
			return KILN_INVAL;
		}
		const char *tok = kiln__url_bearer(url);
		if (tok)
			r->bearer = strdup(tok);
		if (!r->url || (tok && !r->bearer)) {
			kiln__remote_free(r);
			return kiln__nomem(err, 0, NULL);
		}
	}
	if (!ca)
		ca = kiln__env("CURL_CA_BUNDLE");
	if (ca && !(r->ca_bundle = strdup(ca))) {
		kiln__remote_free(r);
		return kiln__nomem(err, 0, NULL);
	}
	if (!(r->multi = curl_multi_init())) {
		kiln__remote_free(r);
		return kiln__nomem(err, 0, NULL);
	}
	curl_multi_setopt(r->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)r->connections);
	*out = r;
	return 0;
}

void kiln__remote_free(struct kiln__remote *r)
{
	if (!r)
		return;
	for (uint32_t i = 0; i < r->nidle; i++)
		curl_easy_cleanup(r->idle[i]);
	if (r->multi)
		curl_multi_cleanup(r->multi);
	curl_slist_free_all(r->headers);
	curl_slist_free_all(r->plain);
	free(r->url);
	if (r->userpwd)
		explicit_bzero(r->userpwd, strlen(r->userpwd));
	free(r->userpwd);
	free(r->bearer);
	free(r->ca_bundle);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

uint64_t kiln__remote_size(const struct kiln__remote *r)
{
	return r->size;
}

const char *kiln__remote_etag(const struct kiln__remote *r)
{
	return r->etag;
}

/* --- one range, one attempt at a time ------------------------------------------------------ */

struct xfer {
	struct kiln__remote *r;
	CURL *h;
	uint64_t off, len, got; /* [off, off + len) asked for; got bytes in place */
	uint8_t *dst;
	/* instead of dst: spans within [off, off + len), ascending, landing each at its own dst;
	 * the bytes between them are dropped */
	const struct kiln__span *pieces;
	size_t npieces, piece; /* piece: the first that may still take bytes */
	kiln_fetch_fn sink;    /* instead of dst: bytes handed on as they come */
	void *sink_ctx;
	int open_end; /* to the object's end, not yet known: asked as "off-" */
	/* Where a redirect led (malloc'd; NULL: r->url), and whether one left the URL's origin
	 * since: then no credential goes with the request, whatever origin it leads to next. */
	char *url;
	int anonymous;
	uint32_t redirects;
	uint32_t attempts;
	uint64_t due; /* when the next attempt may start (ms) */
	int active, done;
	/* this attempt's response */
	long status;
	int has_range, unsatisfied, has_length, has_etag, has_modified, checked, stopped, fatal,
	    canceled;
	uint64_t range_from, range_to, range_total, length;
	uint32_t retry_after;
	char etag[256];
	char modified[64];
	char body[ERR_BODY];
	size_t body_len;
	int why_errno;
	char why[160];
	char curl_err[CURL_ERROR_SIZE];
};

static int parse_u64(const char **p, uint64_t *v)
{
	const char *s = *p;
	uint64_t x = 0;
	if (!isdigit((unsigned char)*s))
		return -1;
	while (isdigit((unsigned char)*s)) {
		if (x > (UINT64_MAX - 9) / 10)
			return -1;
		x = x * 10 + (uint64_t)(*s++ - '0');
	}
	*p = s;
	*v = x;
	return 0;
}

/* Content-Range: "bytes A-B/T", or "bytes * /T" (without the space) for a range not served. */
static void parse_range(struct xfer *x, const char *v)
{
	x->has_range = 0;
	if (strncasecmp(v, "bytes ", 6))
		return;
	v += 6;
	if (*v == '*') {
		v++;
		if (*v++ == '/' && !parse_u64(&v, &x->range_total) && !*v)
			x->has_range = x->unsatisfied = 1;
		return;
	}
	if (parse_u64(&v, &x->range_from) || *v++ != '-' || parse_u64(&v, &x->range_to) ||
	    *v++ != '/' || parse_u64(&v, &x->range_total) || *v)
		return;
	x->has_range = x->range_from <= x->range_to && x->range_to < x->range_total;
}

/* The status of a status line, "HTTP/1.1 206 Partial Content" (versions 1.0, 1.1, 2, 3); 0 for
 * anything else, which no check accepts. */
static long status_of(const char *line)
{
	static const char *const versions[] = {"HTTP/1.0 ", "HTTP/1.1 ", "HTTP/2 ", "HTTP/3 "};
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		size_t n = strlen(versions[i]);
		const char *c = line + n;
		if (!strncmp(line, versions[i], n) && isdigit((unsigned char)c[0]) &&
		    isdigit((unsigned char)c[1]) && isdigit((unsigned char)c[2]) &&
		    (c[3] == '\0' || c[3] == ' '))
			return (c[0] - '0') * 100 + (c[1] - '0') * 10 + (c[2] - '0');
	}
	return 0;
}

static size_t on_header(char *buf, size_t size, size_t n, void *arg)
{
	struct xfer *x = arg;
	size_t len = size * n;
	char line[512];
	size_t k = len < sizeof(line) - 1 ? len : sizeof(line) - 1;
	memcpy(line, buf, k);
	while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' '))
		k--;
	line[k] = '\0';
	if (!strncmp(line, "HTTP/", 5)) { /* a new response (after a redirect or 100) */
		x->status = status_of(line);
		x->has_range = x->unsatisfied = x->has_length = x->has_etag = x->has_modified = 0;
		x->retry_after = 0;
		return len;
	}
	char *colon = strchr(line, ':');
	if (!colon)
		return len;
	*colon = '\0';
	char *v = colon + 1;
	while (*v == ' ' || *v == '\t')
		v++;
	if (!strcasecmp(line, "content-range")) {
		parse_range(x, v);
	} else if (!strcasecmp(line, "content-length")) {
		const char *p = v;
		x->has_length = !parse_u64(&p, &x->length) && !*p;
	} else if (!strcasecmp(line, "etag")) {
		snprintf(x->etag, sizeof(x->etag), "%s", v);
		x->has_etag = 1;
	} else if (!strcasecmp(line, "last-modified")) {
		snprintf(x->modified, sizeof(x->modified), "%s", v);
		x->has_modified = 1;
	} else if (!strcasecmp(line, "retry-after")) {
		const char *p = v;
		uint64_t s;
		if (!parse_u64(&p, &s))
			x->retry_after = s > 60 ? 60 : (uint32_t)s;
	}
	return len;
}

static void fatal(struct xfer *x, int e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fatal(struct xfer *x, int e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->why, sizeof(x->why), fmt, ap);
	va_end(ap);
	x->why_errno = e;
	x->fatal = 1;
}

/* The first answer's size and validator become the object's; every later request asks for
 * that version: If-Match with a strong ETag; with a weak one (W/"...", which servers compare
 * strongly, so If-Match would fail every time) or none, If-Unmodified-Since with the
 * Last-Modified date, and each answer's ETag and date must be the pinned ones. A server that
 * gives neither cannot tell one version from another: such an object is read only when it came
 * whole in this first answer (kiln__remote_get refuses more). */
static int pin_object(struct xfer *x, uint64_t total)
{
	struct kiln__remote *r = x->r;
	r->size = total;
	if (x->has_etag)
		snprintf(r->etag, sizeof(r->etag), "%s", x->etag);
	if (x->has_modified)
		snprintf(r->modified, sizeof(r->modified), "%s", x->modified);
	r->pinned = 1;
	int weak = !strncmp(r->etag, "W/", 2), rc = 0;
	if (r->etag[0] && !weak)
		rc = add_header(&r->headers, "If-Match", r->etag) ||
		     add_header(&r->plain, "If-Match", r->etag);
	else if (r->modified[0])
		rc = add_header(&r->headers, "If-Unmodified-Since", r->modified) ||
		     add_header(&r->plain, "If-Unmodified-Since", r->modified);
	else if (!r->etag[0])
		r->unversioned = 1;
	if (rc) {
		fatal(x, ENOMEM, "cannot allocate the header that pins the version");
		return -1;
	}
	return 0;
}

/* A 2xx response, before its body is taken: is it the bytes asked for, of the object pinned? */
static int check_response(struct xfer *x)
{
	struct kiln__remote *r = x->r;
	uint64_t from = x->off + x->got, asked_end = x->off + x->len - 1, total;
	x->checked = 1;
	if (r->pinned && r->etag[0] && x->has_etag && strcmp(x->etag, r->etag)) {
		fatal(x, ESTALE, "the object changed since it was opened (ETag %.60s, was %.60s)",
		      x->etag, r->etag);
		return -1;
	}
	if (r->pinned && r->modified[0] && x->has_modified && strcmp(x->modified, r->modified)) {
		fatal(x, ESTALE,
		      "the object changed since it was opened (Last-Modified %.40s, was %.40s)",
		      x->modified, r->modified);
		return -1;
	}
	if (x->status == 206) {
		if (!x->has_range || x->unsatisfied) {
			fatal(x, EIO, "HTTP 206 without a valid Content-Range");
			return -1;
		}
		total = x->range_total;
	} else if (x->status == 200) {
		/* The whole object, Range ignored: usable only from byte 0. */
		if (from != 0 || !x->has_length) {
			fatal(x, EIO,
			      "HTTP 200 (the whole object%s) to a request for bytes %" PRIu64
			      "-%" PRIu64 ": the server does not serve ranges",
			      x->has_length ? "" : ", no Content-Length", from, asked_end);
			return -1;
		}
		total = x->length;
	} else {
		fatal(x, EIO, "unexpected HTTP %ld", x->status);
		return -1;
	}
	if (r->pinned && total != r->size) {
		fatal(x, ESTALE,
		      "the object is %" PRIu64 " bytes now, %" PRIu64 " when it was opened", total,
		      r->size);
		return -1;
	}
	/* The first GET (nothing received yet) may ask past a shorter object. */
	if (!r->pinned && x->len > total - (total < x->off ? total : x->off))
		x->len = total > x->off ? total - x->off : 0;
	if (x->status == 206 && (x->range_from != from || x->range_to + 1 != x->off + x->len)) {
		fatal(x, EIO,
		      "Content-Range bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64
		      " answers a request for bytes %" PRIu64 "-%" PRIu64,
		      x->range_from, x->range_to, x->range_total, from, asked_end);
		return -1;
	}
	return r->pinned ? 0 : pin_object(x, total);
}

/* len bytes of the body to their place; 0, or -1 with x failed. */
/* Bytes [pos, pos + len) of the object into the pieces they fall in. */
static void scatter(struct xfer *x, uint64_t pos, const char *buf, size_t len)
{
	uint64_t end = pos + len;
	if (!x->got)
		x->piece = 0; /* a fresh start */
	while (x->piece < x->npieces && x->pieces[x->piece].off + x->pieces[x->piece].len <= pos)
		x->piece++;
	for (size_t i = x->piece; i < x->npieces && x->pieces[i].off < end; i++) {
		const struct kiln__span *p = &x->pieces[i];
		uint64_t a = p->off > pos ? p->off : pos;
		uint64_t b = p->off + p->len < end ? p->off + p->len : end;
		if (a < b)
			memcpy(p->dst + (a - p->off), buf + (a - pos), (size_t)(b - a));
	}
}

static int take(struct xfer *x, const char *buf, size_t len)
{
	if (x->pieces) {
		scatter(x, x->off + x->got, buf, len);
	} else if (x->sink) {
		if (len && x->sink(x->sink_ctx, buf, len)) {
			x->canceled = 1;
			fatal(x, ECANCELED, "the sink stopped the fetch");
			return -1;
		}
	} else {
		memcpy(x->dst + x->got, buf, len);
	}
	x->got += len;
	return 0;
}

static size_t on_body(char *buf, size_t size, size_t n, void *arg)
{
	struct xfer *x = arg;
	size_t len = size * n;
	if (x->status < 200 || x->status >= 300) {
		size_t room = sizeof(x->body) - 1 - x->body_len;
		size_t k = len < room ? len : room;
		memcpy(x->body + x->body_len, buf, k);
		x->body_len += k;
		x->body[x->body_len] = '\0';
		if (k == len)
			return len;
		x->stopped =
		    1; /* enough of an error body: its status stands, the rest is dropped */
		return 0;
	}
	if (!x->checked && check_response(x))
		return 0;
	uint64_t room = x->len - x->got;
	if (len > room) {
		if (x->status == 200) { /* the whole object: the rest is not wanted */
			if (!take(x, buf, (size_t)room))
				x->stopped = 1;
			return 0;
		}
		fatal(x, EIO, "the server sent more than the %" PRIu64 " bytes asked for", x->len);
		return 0;
	}
	return take(x, buf, len) ? 0 : len;
}

void kiln__xml_field(const char *body, const char *tag, char *out, size_t cap)
{
	char open[32], close[32];
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	out[0] = '\0';
	const char *a = strstr(body, open);
	const char *b = a ? strstr(a, close) : NULL;
	if (!b)
		return;
	a += strlen(open);
	size_t n = (size_t)(b - a), k = 0;
	for (size_t i = 0; i < n && k + 1 < cap; i++)
		out[k++] = isprint((unsigned char)a[i]) ? a[i] : '?';
	out[k] = '\0';
}

static void http_failure(struct xfer *x)
{
	char code[64], msg[96];
	kiln__xml_field(x->body, "Code", code, sizeof(code));
	kiln__xml_field(x->body, "Message", msg, sizeof(msg));
	int e = x->status == 401 || x->status == 403 ? EACCES
		: x->status == 404                   ? ENOENT
		: x->status == 412                   ? ESTALE
						     : EIO;
	if (x->status == 412)
		fatal(x, e, "HTTP 412: the object changed since it was opened (%s %.60s)",
		      x->r->etag[0] && strncmp(x->r->etag, "W/", 2) ? "If-Match"
								    : "If-Unmodified-Since",
		      x->r->etag[0] && strncmp(x->r->etag, "W/", 2) ? x->r->etag : x->r->modified);
	else
		fatal(x, e, "HTTP %ld%s%s%s%s%s", x->status, code[0] ? " " : "", code,
		      msg[0] ? " (" : "", msg, msg[0] ? ")" : "");
}

static int retryable_curl(CURLcode c)
{
	switch (c) {
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_COULDNT_CONNECT:
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		return 1;
	default:
		return 0;
	}
}

static CURL *take_handle(struct kiln__remote *r)
{
	return r->nidle ? r->idle[--r->nidle] : curl_easy_init();
}

static void give_handle(struct kiln__remote *r, CURL *h)
{
	if (r->nidle < CONN_MAX)
		r->idle[r->nidle++] = h;
	else
		curl_easy_cleanup(h);
}

static int start(struct xfer *x)
{
	struct kiln__remote *r = x->r;
	CURL *h = take_handle(r);
	if (!h)
		return -1;
	curl_easy_reset(h);
	x->status = 0;
	x->checked = x->stopped = x->fatal = 0;
	x->has_range = x->has_length = x->has_etag = 0;
	x->body_len = 0;
	x->body[0] = '\0';
	x->curl_err[0] = '\0';
	char range[64];
	if (x->open_end && !r->pinned)
		snprintf(range, sizeof(range), "%" PRIu64 "-", x->off);
	else
		snprintf(range, sizeof(range), "%" PRIu64 "-%" PRIu64, x->off + x->got,
			 x->off + x->len - 1);
	curl_easy_setopt(h, CURLOPT_URL, x->url ? x->url : r->url);
	curl_easy_setopt(h, CURLOPT_RANGE, range);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->anonymous ? r->plain : r->headers);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	/* The path as given: an S3 key is a name, not a path (".." in it is part of the key). */
	curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
	/* Redirects are followed here (redirect()), not by libcurl, which would send the headers
	 * of the list (a session token) to whatever host a server names. */
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, KILN__REMOTE_CONNECT_MS);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)((r->stall_ms + 999) / 1000));
	/* The whole request's time: the stall limit and the bytes at the least rate (an open end
	 * has no length to scale by: the stall limit alone). */
	if (!x->open_end || r->pinned) {
		uint64_t ms = r->stall_ms + (x->len - x->got) / r->min_rate * 1000u +
			      (x->len - x->got) % r->min_rate * 1000u / r->min_rate;
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms > LONG_MAX ? LONG_MAX : (long)ms);
	}
	curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L << 10);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->curl_err);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(h, CURLOPT_PRIVATE, x);
	if (r->ca_bundle)
		curl_easy_setopt(h, CURLOPT_CAINFO, r->ca_bundle);
	if (r->userpwd && !x->anonymous) {
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, r->sigv4);
		curl_easy_setopt(h, CURLOPT_USERPWD, r->userpwd);
	}
	if (r->bearer && !x->anonymous) {
		curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
		curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, r->bearer);
	}
	if (r->cap_bps)
		curl_easy_setopt(
		    h, CURLOPT_MAX_RECV_SPEED_LARGE,
		    (curl_off_t)(r->cap_bps / r->connections ? r->cap_bps / r->connections : 1));
	if (curl_multi_add_handle(r->multi, h) != CURLM_OK) {
		give_handle(r, h);
		return -1;
	}
	x->h = h;
	x->active = 1;
	x->attempts++;
	return 0;
}

static uint64_t backoff(uint32_t attempt)
{
	uint64_t step = KILN__REMOTE_BACKOFF_MS;
	for (uint32_t i = 1; i < attempt && step < KILN__REMOTE_BACKOFF_CAP_MS; i++)
		step *= 2;
	if (step > KILN__REMOTE_BACKOFF_CAP_MS)
		step = KILN__REMOTE_BACKOFF_CAP_MS;
	uint64_t j = 0;
	if (getrandom(&j, sizeof(j), GRND_NONBLOCK) != (ssize_t)sizeof(j))
		j = now_ms() * 0x9E3779B97F4A7C15u;
	return step / 2 + j % (step / 2 + 1);
}

/* Scheme, host and port of a URL (the port a scheme implies when none is written), in out. */
static int origin_of(const char *url, char *out, size_t cap)
{
	CURLU *u = curl_url();
	char *scheme = NULL, *host = NULL, *port = NULL;
	int ok = u && !curl_url_set(u, CURLUPART_URL, url, 0) &&
		 !curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) &&
		 !curl_url_get(u, CURLUPART_HOST, &host, 0) &&
		 !curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
	if (ok)
		snprintf(out, cap, "%s://%s:%s", scheme, host, port);
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_url_cleanup(u);
	return ok ? 0 : -1;
}

#define REDIRECTS_MAX 8

/* A 3xx answer: the next attempt asks where it points (http or https, at most REDIRECTS_MAX
 * times), with no credential once it leaves the URL's origin. Not a retry. */
static void redirect(struct xfer *x)
{
	struct kiln__remote *r = x->r;
	char *to = NULL, shown[128], here[512], there[512];
	curl_easy_getinfo(x->h, CURLINFO_REDIRECT_URL, &to);
	if (!to) {
		fatal(x, EIO, "HTTP %ld without a Location to follow", x->status);
		return;
	}
	kiln__url_shown(to, shown, sizeof(shown));
	if (strncmp(to, "http://", 7) && strncmp(to, "https://", 8)) {
		fatal(x, EIO, "a redirect to %s: only http and https are followed", shown);
		return;
	}
	if (++x->redirects > REDIRECTS_MAX) {
		fatal(x, EIO, "more than %d redirects (the last to %s)", REDIRECTS_MAX, shown);
		return;
	}
	if (origin_of(r->url, here, sizeof(here)) || origin_of(to, there, sizeof(there)) ||
	    strcmp(here, there))
		x->anonymous = 1;
	char *next = strdup(to);
	if (!next) {
		fatal(x, ENOMEM, "cannot allocate a redirect's URL");
		return;
	}
	free(x->url);
	x->url = next;
	x->attempts--; /* a redirect is no failed attempt */
	x->due = 0;
}

/* The attempt of x finished with curl's `res`: done, to be retried, or failed (x->fatal). */
static void finished(struct xfer *x, CURLcode res)
{
	struct kiln__remote *r = x->r;
	char reason[160];
	reason[0] = '\0';
	if (x->fatal)
		return;
	if (res == CURLE_OK || (res == CURLE_WRITE_ERROR && x->stopped)) {
		if (x->status == 206 || x->status == 200) {
			if (!x->checked && check_response(x))
				return;
			if (x->got == x->len) {
				x->done = 1;
				return;
			}
			snprintf(reason, sizeof(reason),
				 "a short body (%" PRIu64 " of %" PRIu64 " bytes)", x->got, x->len);
		} else if (x->status == 301 || x->status == 302 || x->status == 303 ||
			   x->status == 307 || x->status == 308) {
			redirect(x);
			return;
		} else if (x->status == 416 && !r->pinned &&
			   (!x->has_range || (x->unsatisfied && x->range_total == 0))) {
			/* bytes=0-N is unsatisfiable only for an empty object (RFC 9110 14.1.1) */
			x->len = 0;
			x->done = !pin_object(x, 0);
			return;
		} else if (x->status == 429 || x->status == 500 || x->status == 502 ||
			   x->status == 503 || x->status == 504) {
			char code[64];
			kiln__xml_field(x->body, "Code", code, sizeof(code));
			snprintf(reason, sizeof(reason), "HTTP %ld%s%s", x->status,
				 code[0] ? " " : "", code);
		} else {
			http_failure(x);
			return;
		}
	} else if (retryable_curl(res)) {
		snprintf(reason, sizeof(reason), "%.150s",
			 x->curl_err[0] ? x->curl_err : curl_easy_strerror(res));
	} else {
		fatal(x, res == CURLE_COULDNT_RESOLVE_HOST ? EHOSTUNREACH : EIO, "%.150s",
		      x->curl_err[0] ? x->curl_err : curl_easy_strerror(res));
		return;
	}
	if (r->unversioned && x->got) {
		/* Resumed from the last byte received, it could go on in another version. */
		fatal(x, ESTALE,
		      "%s; the server gives neither an ETag nor a Last-Modified date, so the fetch "
		      "cannot resume",
		      reason);
		return;
	}
	if (x->attempts > r->retries) {
		fatal(x,
		      res == CURLE_COULDNT_CONNECT      ? ECONNREFUSED
		      : res == CURLE_OPERATION_TIMEDOUT ? ETIMEDOUT
							: EIO,
		      "%s, after %" PRIu32 " attempts", reason, x->attempts);
		return;
	}
	uint64_t wait = backoff(x->attempts);
	if (x->retry_after && (uint64_t)x->retry_after * 1000u > wait)
		wait = (uint64_t)x->retry_after * 1000u;
	x->due = now_ms() + wait;
}

static void stop_all(struct kiln__remote *r, struct xfer *xs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (xs[i].active) {
			curl_multi_remove_handle(r->multi, xs[i].h);
			give_handle(r, xs[i].h);
			xs[i].active = 0;
		}
		free(xs[i].url); /* where a redirect led: for the transfer's attempts only */
		xs[i].url = NULL;
	}
}

/* Run every transfer to the end, `connections` at a time. */
static int run(struct kiln__remote *r, struct xfer *xs, size_t n, int progress,
	       const _Atomic int *stop, kiln_error *err)
{
	uint64_t t0 = now_ms(), last_note = 0;
	size_t left = n, active = 0;
	struct xfer *bad = NULL;
	int canceled = 0, late = 0, halted = 0;
	while (left && !bad) {
		if (stop && atomic_load(stop)) { /* the load this fetch is for has stopped */
			halted = 1;
			break;
		}
		uint64_t now = now_ms(), next_due = UINT64_MAX;
		if (r->deadline_ms && now - t0 > r->deadline_ms) {
			late = 1;
			break;
		}
		for (size_t k = 0; k < n && active < r->connections; k++) {
			struct xfer *x = &xs[k];
			if (x->done || x->active || x->fatal)
				continue;
			if (x->due > now) {
				if (x->due < next_due)
					next_due = x->due;
				continue;
			}
			if (start(x)) {
				kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					       "%s: cannot start a transfer", r->shown);
				stop_all(r, xs, n);
				return KILN_NOMEM;
			}
			active++;
		}
		int running = 0, freed = 0;
		curl_multi_perform(r->multi, &running);
		CURLMsg *m;
		int q;
		while ((m = curl_multi_info_read(r->multi, &q))) {
			if (m->msg != CURLMSG_DONE)
				continue;
			struct xfer *x = NULL;
			curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
			CURLcode res = m->data.result;
			curl_multi_remove_handle(r->multi, x->h);
			give_handle(r, x->h);
			x->active = 0;
			active--;
			freed = 1;
			finished(x, res);
			if (x->fatal && !bad)
				bad = x;
			if (x->done)
				left--;
		}
		if (progress && r->progress) {
			uint64_t got = 0, total = 0, t = now_ms();
			for (size_t i = 0; i < n; i++) {
				got += xs[i].got;
				total += xs[i].open_end && !r->pinned ? 0 : xs[i].len;
			}
			if (!left || t - last_note >= 50) {
				last_note = t;
				if (r->progress(r->progress_ctx, got, total)) {
					canceled = 1;
					break;
				}
			}
		}
		if (left && !bad) {
			/* A connection freed with ranges still waiting: back to the top, which
			 * starts what is due, rather than a poll that has nothing to wake it (100
			 * ms per range over one connection). */
			if (freed && left > active)
				continue;
			int wait = 100;
			if (!active && next_due != UINT64_MAX) {
				uint64_t d = next_due > now_ms() ? next_due - now_ms() : 0;
				wait = d < 100 ? (int)d : 100;
			}
			curl_multi_poll(r->multi, NULL, 0, wait, NULL);
		}
	}
	stop_all(r, xs, n);
	if (canceled)
		return kiln__fail_sys(err, KILN_CANCELED, 0,
				      "%s: the progress callback stopped the fetch", r->shown);
	if (halted)
		return kiln__fail_sys(err, KILN_CANCELED, 0,
				      "%s: stopped with %zu of %zu ranges to go", r->shown, left,
				      n);
	if (late)
		return kiln__fail_sys(err, KILN_IO, ETIMEDOUT,
				      "%s: the deadline of %" PRIu64 " ms passed with %zu of %zu "
				      "ranges to go",
				      r->shown, r->deadline_ms, left, n);
	if (bad && bad->canceled)
		return kiln__fail_sys(err, KILN_CANCELED, 0, "%s (bytes %" PRIu64 "-): %s",
				      r->shown, bad->off + bad->got, bad->why);
	if (bad)
		return kiln__fail_sys(err, KILN_IO, bad->why_errno,
				      "%s (bytes %" PRIu64 "-%" PRIu64 "): %s", r->shown,
				      bad->off + bad->got, bad->off + bad->len - 1, bad->why);
	return 0;
}

int kiln__remote_pin(struct kiln__remote *r, uint64_t want, uint8_t *dst, uint64_t *got,
		     kiln_error *err)
{
	pthread_mutex_lock(&r->lock);
	struct xfer x;
	memset(&x, 0, sizeof(x));
	x.r = r;
	x.off = 0;
	x.len = want;
	x.dst = dst;
	int rc = run(r, &x, 1, 0, NULL, err);
	pthread_mutex_unlock(&r->lock);
	*got = x.got;
	return rc;
}

/* Spans [i, j) go in one GET when each starts at most this far past the one before's end and
 * all of them fit in a chunk: a request costs more than this many bytes on any link. */
#define GAP_MAX ((uint64_t)64 << 10)

/* The end of the run of spans from i that one GET can fetch together. */
static size_t run_end(const struct kiln__remote *r, const struct kiln__span *spans, size_t n,
		      size_t i)
{
	size_t j = i + 1;
	uint64_t end = spans[i].off + spans[i].len;
	while (j < n && spans[i].len && spans[j].len && spans[j].off >= end &&
	       spans[j].off - end <= GAP_MAX &&
	       spans[j].off + spans[j].len - spans[i].off <= r->chunk) {
		end = spans[j].off + spans[j].len;
		j++;
	}
	return j;
}

int kiln__remote_get(struct kiln__remote *r, const struct kiln__span *spans, size_t n, int progress,
		     const _Atomic int *stop, kiln_error *err)
{
	size_t count = 0;
	for (size_t i = 0, j; i < n; i = j) {
		j = run_end(r, spans, n, i);
		count += j - i > 1 ? 1 : (size_t)((spans[i].len + r->chunk - 1) / r->chunk);
	}
	if (!count)
		return 0;
	struct xfer *xs = calloc(count, sizeof(*xs));
	if (!xs)
		return kiln__nomem(err, 0, NULL);
	size_t k = 0;
	for (size_t i = 0, j; i < n; i = j) {
		j = run_end(r, spans, n, i);
		if (j - i > 1) { /* neighbours: one GET from the first's start to the last's end */
			xs[k].r = r;
			xs[k].off = spans[i].off;
			xs[k].len = spans[j - 1].off + spans[j - 1].len - spans[i].off;
			xs[k].pieces = &spans[i];
			xs[k].npieces = j - i;
			k++;
			continue;
		}
		for (uint64_t at = 0; at < spans[i].len; at += r->chunk, k++) {
			uint64_t len = spans[i].len - at < r->chunk ? spans[i].len - at : r->chunk;
			xs[k].r = r;
			xs[k].off = spans[i].off + at;
			xs[k].len = len;
			xs[k].dst = spans[i].dst + at;
		}
	}
	pthread_mutex_lock(&r->lock);
	int rc = !r->pinned ? kiln__fail_inval(err, KILN_NO_INDEX, NULL, "%s: not pinned", r->shown)
		 : r->unversioned
		     ? kiln__fail_sys(err, KILN_IO, ESTALE,
				      "%s: the server gives neither an ETag nor a Last-Modified "
				      "date, so a second range could be of another version of the "
				      "object: kiln reads such an object only when it comes whole "
				      "in the first answer (256 KiB)",
				      r->shown)
		     : run(r, xs, count, progress, stop, err);
	pthread_mutex_unlock(&r->lock);
	free(xs);
	return rc;
}

/* r's object, pinned and read into malloc'ed memory (with a byte to spare, for a NUL): all of
 * it when it has at most `cap` bytes, else its first min(head, size) bytes; *len says how many,
 * *size is the object's. */
static int read_object(struct kiln__remote *r, size_t cap, size_t head, uint8_t **out, size_t *len,
		       uint64_t *size, kiln_error *err)
{
	*out = NULL;
	*len = 0;
	size_t first = cap < KILN__REMOTE_FIRST_GET ? cap : (size_t)KILN__REMOTE_FIRST_GET;
	first = first > head ? first : head;
	uint8_t *buf = malloc(first + 1);
	uint64_t got = 0;
	int rc =
	    buf ? kiln__remote_pin(r, first, buf, &got, err) : kiln__nomem(err, first + 1, NULL);
	size_t n = !rc && r->size > cap ? (got < head ? (size_t)got : head) : (size_t)got;
	if (!rc && r->size <= cap && got < r->size) {
		uint8_t *more = realloc(buf, (size_t)r->size + 1);
		if (!more) {
			rc = kiln__nomem(err, (size_t)r->size + 1, NULL);
		} else {
			buf = more;
			struct kiln__span sp = {got, r->size - got, buf + got};
			rc = kiln__remote_get(r, &sp, 1, 0, NULL, err);
			n = (size_t)r->size;
		}
	}
	*size = r->size;
	if (rc) {
		free(buf);
		return rc;
	}
	*out = buf;
	*len = n;
	return 0;
}

int kiln__remote_read_small(const char *url, const kiln_remote_options *o, size_t cap, char **out,
			    size_t *len, kiln_error *err)
{
	struct kiln__remote *r;
	int rc = kiln__remote_new(url, o, &r, err);
	if (rc)
		return rc;
	uint8_t *buf;
	uint64_t size;
	rc = read_object(r, cap, 0, &buf, len, &size, err);
	if (!rc && size > cap) {
		free(buf);
		rc = kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "length", KILN_NO_OFFSET,
				"%s: %" PRIu64 " bytes, above the %zu-byte cap of an index",
				r->shown, size, cap);
	}
	kiln__remote_free(r);
	if (rc)
		return rc;
	buf[*len] = '\0';
	*out = (char *)buf;
	return 0;
}

/* A remote of r's settings for `url`, shown as `shown`: the validators r's pin added to its
 * headers left out (they name r's object's version). */
static int sibling(struct kiln__remote *r, const char *url, const char *shown,
		   struct kiln__remote **out, kiln_error *err)
{
	struct kiln__remote *s = calloc(1, sizeof(*s));
	if (!s)
		return kiln__nomem(err, 0, NULL);
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->shown, sizeof(s->shown), "%s", shown);
	pthread_mutex_lock(&r->lock);
	memcpy(s->sigv4, r->sigv4, sizeof(s->sigv4));
	s->url = strdup(url);
	s->userpwd = r->userpwd ? strdup(r->userpwd) : NULL;
	s->bearer = r->bearer ? strdup(r->bearer) : NULL;
	s->ca_bundle = r->ca_bundle ? strdup(r->ca_bundle) : NULL;
	int bad = !s->url || (r->userpwd && !s->userpwd) || (r->bearer && !s->bearer) ||
		  (r->ca_bundle && !s->ca_bundle);
	for (struct curl_slist *h = r->headers; h && !bad; h = h->next) {
		if (!strncasecmp(h->data, "If-Match:", 9) ||
		    !strncasecmp(h->data, "If-Unmodified-Since:", 20))
			continue;
		struct curl_slist *t = curl_slist_append(s->headers, h->data);
		bad = !t;
		s->headers = t ? t : s->headers;
	}
	s->connections = 1;
	s->chunk = r->chunk;
	s->retries = r->retries;
	s->stall_ms = r->stall_ms;
	s->min_rate = r->min_rate;
	s->deadline_ms = r->deadline_ms;
	s->cap_bps = r->cap_bps;
	pthread_mutex_unlock(&r->lock);
	if (!bad && !(s->multi = curl_multi_init()))
		bad = 1;
	if (bad) {
		kiln__remote_free(s);
		return kiln__nomem(err, 0, NULL);
	}
	curl_multi_setopt(s->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 1L);
	*out = s;
	return 0;
}

int kiln__remote_beside(struct kiln__remote *r, const char *suffix, size_t cap, size_t head,
			uint8_t **out, size_t *len, uint64_t *size, kiln_error *err)
{
	*out = NULL;
	*len = 0;
	*size = 0;
	if (r->url[kiln__url_name_len(r->url)])
		return kiln__fail_inval(err, KILN_NO_INDEX, "url",
					"%s: a URL with a query names one object; nothing beside "
					"it is looked for",
					r->shown);
	char *url = NULL, shown[sizeof(r->shown)];
	snprintf(shown, sizeof(shown), "%s%s", r->shown, suffix);
	if (asprintf(&url, "%s%s", r->url, suffix) < 0)
		return kiln__nomem(err, 0, NULL);
	struct kiln__remote *s = NULL;
	int rc = sibling(r, url, shown, &s, err);
	free(url);
	if (rc)
		return rc;
	kiln_error pinned;
	rc = read_object(s, cap, head, out, len, size, &pinned);
	if (rc && (pinned.sys_errno == ENOENT || pinned.sys_errno == EACCES)) {
		char why[sizeof(pinned.message)];
		snprintf(why, sizeof(why), "%s", pinned.message);
		rc = kiln__fail_named(&pinned, shown, KILN_NOTFOUND, KILN_NO_INDEX, NULL,
				      KILN_NO_OFFSET, "none on the server (%s)", why);
	}
	if (rc && err)
		*err = pinned;
	kiln__remote_free(s);
	return rc;
}

KILN_API int kiln_remote_fetch(const char *url, const kiln_remote_options *o, uint64_t offset,
			       uint64_t length, kiln_fetch_fn sink, void *ctx, uint64_t *size,
			       kiln_error *err)
{
	kiln__clear_error(err);
	if (size)
		*size = 0;
	if (!sink)
		return kiln__fail_inval(err, KILN_NO_INDEX, "sink", "no sink to hand the bytes to");
	if (!length || (length != KILN_FETCH_TO_END && length > UINT64_MAX - offset))
		return kiln__fail_inval(err, KILN_NO_INDEX, "length",
					"%" PRIu64 " bytes at %" PRIu64 " is not a range", length,
					offset);
	struct kiln__remote *r;
	int rc = kiln__remote_new(url, o, &r, err);
	if (rc)
		return rc;
	struct xfer x;
	memset(&x, 0, sizeof(x));
	x.r = r;
	x.off = offset;
	x.open_end = length == KILN_FETCH_TO_END;
	x.len = x.open_end ? UINT64_MAX - offset : length;
	x.sink = sink;
	x.sink_ctx = ctx;
	pthread_mutex_lock(&r->lock);
	rc = run(r, &x, 1, 1, NULL, err);
	pthread_mutex_unlock(&r->lock);
	if (!rc && size)
		*size = r->size;
	kiln__remote_free(r);
	return rc;
}
