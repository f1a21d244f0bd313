/* SPDX-License-Identifier: MIT */
/* GGUF (versions 2 and 3) in and out. Not written yet: both directions are UNSUPPORTED. */
#include "model.h"

int kc_gguf_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err)
{
	(void)m;
	(void)paths;
	(void)n;
	return kiln_error_set(err, KILN_UNSUPPORTED, 0, "GGUF import is not built yet");
}

int kc_gguf_write(const struct kc_model *m, const char *path, struct kc_progress *p,
		  kiln_error *err)
{
	(void)m;
	(void)p;
	return kiln_error_set(err, KILN_UNSUPPORTED, 0, "%s: GGUF export is not built yet", path);
}
