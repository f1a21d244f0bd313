/* SPDX-License-Identifier: MIT */
/* RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
#include <string.h>

#include "base/base.h"

size_t kiln__utf8_check(const uint8_t *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		/* Names are mostly ASCII: eight bytes at a time while no byte has its top bit set
		 * (a tenth of a 300-tensor open went to this loop one byte at a time). */
		if (len - i >= 8) {
			uint64_t v;
			memcpy(&v, s + i, 8);
			if (!(v & 0x8080808080808080ull)) {
				i += 8;
				continue;
			}
		}
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t need;
		uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
		if (c >= 0xC2 && c <= 0xDF) {
			need = 1;
		} else if (c >= 0xE0 && c <= 0xEF) {
			need = 2;
			if (c == 0xE0)
				lo = 0xA0; /* overlong below U+0800 */
			else if (c == 0xED)
				hi = 0x9F; /* surrogates U+D800..U+DFFF */
		} else if (c >= 0xF0 && c <= 0xF4) {
			need = 3;
			if (c == 0xF0)
				lo = 0x90; /* overlong below U+10000 */
			else if (c == 0xF4)
				hi = 0x8F; /* above U+10FFFF */
		} else {
			return i; /* continuation byte, C0/C1 overlong lead, or F5..FF */
		}
		if (len - i - 1 < need)
			return i;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (size_t k = 2; k <= need; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return i;
		i += need + 1;
	}
	return SIZE_MAX;
}

size_t kiln_utf8_check(const void *s, size_t len)
{
	return s || !len ? kiln__utf8_check(s, len) : 0;
}

const char *kiln__shown(const void *p, size_t len, char buf[KILN__SHOWN])
{
	const uint8_t *s = p;
	size_t n = len < 60 ? len : 60, k = 0;
	/* Cut before a character, not inside one: back over up to 3 continuation bytes (more
	 * is not UTF-8, shown as '?' below). */
	for (int b = 0; n < len && b < 3 && n > 0 && (s[n] & 0xC0) == 0x80; b++)
		n--;
	int utf8 = kiln__utf8_check(s, n) == SIZE_MAX;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		buf[k++] = c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8) ? '?' : (char)c;
	}
	if (n < len) {
		memcpy(buf + k, "...", 3);
		k += 3;
	}
	buf[k] = '\0';
	return buf;
}
