/* SPDX-License-Identifier: MIT */
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
/*
 * Like kb_register, with a fixed iteration count and repetitions (for slow, cold runs): the body
 * is called once per iteration, so it can evict caches before each one. Timed in wall-clock
 * (real) time, since a run that waits for a disk uses little CPU; with more than one repetition
 * only the aggregates (mean, median, stddev, cv, min, max) are reported.
 */
void kb_register_fixed(const char *name, kb_body body, void *arg, uint64_t iters, int repetitions);

/* Exclude what follows from the timing (cache eviction, setup) until kb_resume(). */
void kb_pause(kb_state *st);
void kb_resume(kb_state *st);
/* Bytes processed per iteration: reported as bytes_per_second. */
void kb_set_bytes_per_iter(kb_state *st, uint64_t bytes);
/* A named counter (averaged over iterations when per_iter is set). */
void kb_counter(kb_state *st, const char *name, double value, int per_iter);
/* A free-form label printed after the row (for example, which kind of destination). */
void kb_label(kb_state *st, const char *label);
/*
 * Add one measured region to this run's totals in `slot` (0 .. KB_SLOTS-1; a run is one
 * repetition): `seconds` timed by the body itself, `bytes` moved in it. kb_run_rate() is then
 * bytes per second in that slot over the run so far, or 0 before the first call. Slots let a body
 * time a paired baseline next to its own work (with the timer paused) and set ratio counters
 * from both on every call; the run's final values stay.
 */
#define KB_SLOTS 5
void kb_account(kb_state *st, int slot, double seconds, double bytes);
double kb_run_rate(const kb_state *st, int slot);
/* Give up on this benchmark with a message (for example when a file cannot be made). */
void kb_skip(kb_state *st, const char *message);

/* Parse Google Benchmark's flags and run everything registered. Returns the exit status. */
int kb_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
