/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the bytes are what a server sends. A thread of the target listens on 127.0.0.1
 * and answers every connection with the input (a status line, headers and a body, or anything),
 * then closes; kiln opens http://127.0.0.1:PORT/f.klnt through the REMOTE source, retries off,
 * loaded and directory-only, so libcurl's reading and kiln's checks of the response (status,
 * Content-Range, Content-Length, ETag, an error body's S3 code, bodies longer or shorter than
 * asked) all meet hostile bytes. The first input byte picks instead an AWS shared credentials
 * file (the rest of the input) for an s3:// URL: its reader meets them.
 *
 * Judged: no crash, leak or out-of-bounds access (the sanitizers), and an open that succeeds
 * was answered 200 or 206 (anything else must be an error).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "kiln/kiln.h"

static struct {
	int fd;
	int port;
	pthread_mutex_t lock;
	const uint8_t *data;
	size_t size;
} srv = {.fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};

static void *serve(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(srv.fd, NULL, NULL);
		if (c < 0)
			continue;
		char req[4096];
		(void)!recv(c, req, sizeof(req), 0); /* one request, whatever it says */
		pthread_mutex_lock(&srv.lock);
		size_t off = 0;
		while (off < srv.size) {
			ssize_t w = send(c, srv.data + off, srv.size - off, MSG_NOSIGNAL);
			if (w <= 0)
				break;
			off += (size_t)w;
		}
		pthread_mutex_unlock(&srv.lock);
		close(c);
	}
	return NULL;
}

static void start_server(void)
{
	if (srv.fd >= 0)
		return;
	srv.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	FUZZ_CHECK(srv.fd >= 0 && bind(srv.fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		       listen(srv.fd, 64) == 0 &&
		       getsockname(srv.fd, (struct sockaddr *)&a, &len) == 0,
		   "cannot listen on 127.0.0.1");
	srv.port = ntohs(a.sin_port);
	pthread_t t;
	FUZZ_CHECK(pthread_create(&t, NULL, serve, NULL) == 0, "cannot start the server thread");
	pthread_detach(t);
}

static int answered_2xx(const uint8_t *d, size_t n)
{
	return n >= 10 && !memcmp(d, "HTTP/1.", 7) && d[9] == '2';
}

static void open_url(const char *url, uint32_t flags, const uint8_t *resp, size_t n)
{
	kiln_remote_options r = {.size = sizeof(r),
				 .retries = KILN_REMOTE_NO_RETRY,
				 .stall_ms = 1000,
				 .deadline_ms = 3000,
				 .connections = 2,
				 .chunk_size = 64u << 10};
	kiln_open_options o = {.size = sizeof(o), .flags = flags, .remote = &r};
	kiln_model *m = NULL;
	kiln_error err;
	int rc = kiln_model_open(url, &o, &m, &err);
	if (!rc) {
		FUZZ_CHECK(!resp || answered_2xx(resp, n), "opened from a non-2xx answer");
		for (uint64_t i = 0; i < kiln_model_count(m) && i < 4; i++) {
			const kiln_tensor *t = kiln_model_tensor(m, i);
			uint8_t buf[256];
			if (t->byte_length <= sizeof(buf))
				(void)kiln_tensor_copy(m, i, buf, sizeof(buf), &err);
		}
		kiln_model_close(m);
	} else {
		FUZZ_CHECK(!m, "a failed open handed out a model");
		FUZZ_CHECK(err.message[0], "an error without a message (code %d)", rc);
	}
}

int kiln_fuzz_http(const uint8_t *data, size_t size)
{
	start_server();
	char url[64];
	if (size && data[0] == 'C') { /* an AWS credentials file */
		char path[64];
		snprintf(path, sizeof(path), "/tmp/kiln-fuzz-creds-%d", (int)getpid());
		FILE *f = fopen(path, "wb");
		FUZZ_CHECK(f != NULL, "cannot write %s", path);
		fwrite(data + 1, 1, size - 1, f);
		fclose(f);
		setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
		setenv("AWS_CONFIG_FILE", path, 1);
		setenv("AWS_PROFILE", "p", 1);
		unsetenv("AWS_ACCESS_KEY_ID");
		snprintf(url, sizeof(url), "http://127.0.0.1:%d", srv.port);
		setenv("AWS_ENDPOINT_URL", url, 1);
		pthread_mutex_lock(&srv.lock);
		srv.data = (const uint8_t *)"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n";
		srv.size = strlen((const char *)srv.data);
		pthread_mutex_unlock(&srv.lock);
		open_url("s3://bucket/f.klnt", 0, NULL, 0);
		unlink(path);
		return 0;
	}
	pthread_mutex_lock(&srv.lock);
	srv.data = data;
	srv.size = size;
	pthread_mutex_unlock(&srv.lock);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/f.klnt", srv.port);
	open_url(url, 0, data, size);
	open_url(url, KILN_OPEN_DIRECTORY_ONLY, data, size);
	pthread_mutex_lock(&srv.lock); /* the input is freed after this returns */
	srv.data = NULL;
	srv.size = 0;
	pthread_mutex_unlock(&srv.lock);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_http(data, size);
}
#endif
