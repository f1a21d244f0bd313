/* SPDX-License-Identifier: MIT */
/* safetensors (shards and model.safetensors.index.json) in and out. Not written yet. */
#include "model.h"

int kc_st_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err)
{
	(void)m;
	(void)paths;
	(void)n;
	return kiln_error_set(err, KILN_UNSUPPORTED, 0, "safetensors import is not built yet");
}

int kc_st_write(const struct kc_model *m, const char *path, struct kc_progress *p, kiln_error *err)
{
	(void)m;
	(void)p;
	return kiln_error_set(err, KILN_UNSUPPORTED, 0, "%s: safetensors export is not built yet",
			      path);
}
