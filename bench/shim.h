/*
 * The C side of the Google Benchmark shim. Benchmark bodies are C; bench/shim.cc registers them
 * and forwards state calls. A body runs a whole batch of iterations per call, so there is no
 * cross-language call per iteration.
 */
#ifndef KILN_BENCH_SHIM_H
#define KILN_BENCH_SHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kb_state kb_state;

/* Run `iters` iterations of the measured work. */
typedef void (*kb_body)(kb_state *st, uint64_t iters, void *arg);

/* Register a benchmark. `arg` is passed to every call. */
void kb_register(const char *name, kb_body body, void *arg);
/* Like kb_register, with a fixed iteration count and repetitions (for slow, cold runs). */
void kb_register_fixed(const char *name, kb_body body, void *arg, uint64_t iters, int repetitions);

/* Exclude what follows from the timing (cache eviction, setup) until kb_resume(). */
void kb_pause(kb_state *st);
void kb_resume(kb_state *st);
/* Bytes processed per iteration: reported as bytes_per_second. */
void kb_set_bytes_per_iter(kb_state *st, uint64_t bytes);
/* A named counter (averaged over iterations when per_iter is set). */
void kb_counter(kb_state *st, const char *name, double value, int per_iter);
/* Give up on this benchmark with a message (for example when a file cannot be made). */
void kb_skip(kb_state *st, const char *message);

/* Parse Google Benchmark's flags and run everything registered. Returns the exit status. */
int kb_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
