/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the AWS shared credentials and config files (~/.aws/credentials, ~/.aws/config,
 * or whatever AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE name: anyone who can set the
 * environment or write the file chooses these bytes), through kiln__aws_ini_value, the INI
 * reader behind every key, region and endpoint kiln takes from them. The input's first line is
 * the section, its second the key, the rest the file (up to its first NUL).
 *
 * Judged against the target's own reading of the format, line by line: the value is that of the
 * first line `KEY = VALUE` (key compared ignoring ASCII case, both trimmed) under a `[SECTION]`
 * header (name trimmed; a line starting with '#' or ';' is a comment), and found_section says
 * whether such a header came before it (or anywhere, when there is no value).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "fuzz.h"
#include "net/aws.h"

static void trim(const char **a, const char **b)
{
	while (*a < *b && isspace((unsigned char)**a))
		(*a)++;
	while (*b > *a && isspace((unsigned char)(*b)[-1]))
		(*b)--;
}

/* The reference: the value (malloc'ed) or NULL, and whether the section is there. */
static char *reference(const char *text, const char *section, const char *key, int *found)
{
	int in = 0;
	*found = 0;
	for (const char *p = text; *p;) {
		const char *eol = strchrnul(p, '\n'), *a = p, *b = eol;
		trim(&a, &b);
		if (a < b && *a == '[') {
			const char *c = memchr(a, ']', (size_t)(b - a)), *s = a + 1, *e = c ? c : b;
			trim(&s, &e);
			in = (size_t)(e - s) == strlen(section) &&
			     !memcmp(s, section, strlen(section));
			*found |= in;
		} else if (in && a < b && *a != '#' && *a != ';') {
			const char *eq = memchr(a, '=', (size_t)(b - a));
			if (eq) {
				const char *ka = a, *kb = eq, *va = eq + 1, *vb = b;
				trim(&ka, &kb);
				trim(&va, &vb);
				if ((size_t)(kb - ka) == strlen(key) &&
				    !strncasecmp(ka, key, strlen(key)))
					return strndup(va, (size_t)(vb - va));
			}
		}
		p = *eol ? eol + 1 : eol;
	}
	return NULL;
}

int kiln_fuzz_awsconfig(const uint8_t *data, size_t size)
{
	char *in = kiln__fuzz_cstr(data, size);
	if (!in)
		return 0;
	char *section = in, *key = strchr(section, '\n'), *text;
	if (!key) {
		free(in);
		return 0;
	}
	*key++ = '\0';
	text = strchr(key, '\n');
	if (!text) {
		free(in);
		return 0;
	}
	*text++ = '\0';
	int found = -1, rfound;
	char *v = kiln__aws_ini_value(text, section, key, &found);
	char *r = reference(text, section, key, &rfound);
	FUZZ_CHECK(found == -1 ? !rfound : found == rfound, "section [%s]: found %d, expected %d",
		   section, found, rfound);
	FUZZ_CHECK(!v == !r, "key %s: %s, expected %s", key, v ? v : "(none)", r ? r : "(none)");
	if (v) {
		FUZZ_CHECK(!strcmp(v, r), "key %s: '%s', expected '%s'", key, v, r);
		FUZZ_CHECK(!strchr(v, '\n'), "a value spans lines");
	}
	free(v);
	free(r);
	free(in);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_awsconfig(data, size);
}
#endif
