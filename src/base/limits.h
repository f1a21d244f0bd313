/* SPDX-License-Identifier: MIT */
/*
 * Every default and limit of the library, in one place: the defaults and maxima of the options
 * structs (the public headers state them to callers) and the caps that bound what a hostile file,
 * server or caller can make kiln allocate, read or wait for. Constants private to one algorithm
 * (how many windows KILN_SOURCE_AUTO samples, how many filled ranges a reader tracks) and the
 * rules of a format (GGUF's nesting depth, KLNT's field widths) stay beside their code.
 */
#ifndef KILN_BASE_LIMITS_H
#define KILN_BASE_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* The longest single request anywhere (a read, a staging buffer, a GET, a group's round):
 * io_uring's read lengths are 32-bit. */
#define KILN__REQUEST_MAX ((uint32_t)1 << 30)

/* --- reads (kiln_open_options, kiln_stream_options) -------------------------------------- */

#define KILN__CHUNK_DEFAULT    (4u << 20) /* bytes per read request */
#define KILN__QD_DEFAULT       32u        /* requests in flight */
#define KILN__QD_SMALL_RUNS    256u       /* in flight for slices of runs below 512 KiB */
#define KILN__QD_MAX           4096u
#define KILN__THREADS_MAX      64u /* threads reading one file at open (kiln_open_options) */
/* Payload parts of a threaded load start on multiples of this (huge-page and O_DIRECT friendly). */
#define KILN__THREAD_PART      ((uint64_t)2 << 20)
/* The runs of a slice or range go to the engine in batches of this many ranges, each batch's
 * reads in flight together, so memory stays small whatever the number of runs. */
#define KILN__RUN_BATCH        4096u
/* kiln_model_read_all without the caller's staging buffers: this many of chunk_size bytes,
 * enough requests in flight to keep a disk busy, little memory. */
#define KILN__READ_ALL_BUFFERS 4u

/* --- opening a file ------------------------------------------------------------------------ */

/* The first bytes of a file, read once: every format's header starts within them. */
#define KILN__FIRST_BYTES    64u
/* A file's directory is read this far ahead of the validator (into the block for READ/URING,
 * into the page cache for MMAP): a cold open is a few large reads, and a header claiming a huge
 * directory costs at most this much past the first bad byte. */
#define KILN__HEAD_READAHEAD ((uint64_t)4 << 20)
/* A mapped file's descriptors pass through one reused buffer of at most this size: small enough
 * to come from malloc's reused memory and stay in cache, so a large table is never faulted into
 * fresh pages. A multiple of the KLNT descriptor size. */
#define KILN__HEAD_WINDOW    ((uint64_t)128 << 10)
/* A cached directory up to this size past the header is read in one pread (src/source/map.c). */
#define KILN__HEAD_SMALL     ((uint64_t)64 << 10)
/* A safetensors header, and so a model.safetensors.index.json: the reference's
 * MAX_HEADER_SIZE. */
#define KILN__ST_HEADER_MAX  100000000u
/* Tensors of a model: slots of the name table hold an index in 40 bits. */
#define KILN__MODEL_MAX      (((uint64_t)1 << 40) - 2)
/* Shards of a series: five digits. */
#define KILN__SERIES_MAX     99999u

/* --- memory -------------------------------------------------------------------------------- */

/* Owned allocations from this size up get a mapping of their own with transparent huge pages. */
#define KILN__HUGE_MIN ((size_t)2 << 20)

/* --- the load pipeline (kiln_load_options) ------------------------------------------------ */

#define KILN__LOAD_THREADS_MAX    16u
/* A reader thread's piece when inflight_bytes is 0: a long run of the file per thread, which
 * read-ahead turns into the disk's largest requests; shorter pieces restart it at every
 * piece (docs/benchmarks.md, "Cold: kiln_load against plain pread"). */
#define KILN__LOAD_PIECE_DEFAULT  ((uint64_t)128 << 20)
#define KILN__LOAD_PINNED_DEFAULT ((uint64_t)256 << 20)
#define KILN__LOAD_STAGE_DEFAULT  (8u << 20)
/* Host memory: reads land in place, so requests are long: a warm read costs a system call per
 * request and little else. */
#define KILN__LOAD_HOST_CHUNK     (16u << 20)
/* ... unless each request's bytes are hashed after it lands (a verifying directory-only open of
 * local files): then short enough to be hashed from the reading core's cache
 * (docs/benchmarks.md, "Checked as they are read"). */
#define KILN__LOAD_CHECKED_CHUNK  (256u << 10)
#define KILN__LOAD_PIECE_MIN      ((uint64_t)1 << 20)

/* --- read once per group (kiln_group_options) ---------------------------------------------- */

#define KILN__GROUP_CHUNK_DEFAULT (8u << 20)

/* --- URLs (kiln_remote_options) ------------------------------------------------------------ */

#define KILN__REMOTE_CONNECTIONS_DEFAULT 8u
#define KILN__REMOTE_CONNECTIONS_MAX     64u
#define KILN__REMOTE_CHUNK_DEFAULT       ((uint32_t)8 << 20)
#define KILN__REMOTE_CHUNK_MIN           ((uint32_t)64 << 10)
#define KILN__REMOTE_RETRIES_DEFAULT     6u
#define KILN__REMOTE_STALL_MS_DEFAULT    30000u
/* A request for n bytes may take the stall limit and n at this rate: a server that drips a few
 * bytes a second makes progress, never stalls, and must still come to an end. */
#define KILN__REMOTE_MIN_RATE_DEFAULT    ((uint64_t)64 << 10)
#define KILN__REMOTE_CONNECT_MS          10000L
#define KILN__REMOTE_BACKOFF_MS          200u /* the first wait before a retry, doubling */
#define KILN__REMOTE_BACKOFF_CAP_MS      10000u
/* An error response's body is read this far, for the S3 error code in it. */
#define KILN__REMOTE_ERROR_BODY          1024u
/* An AWS shared credentials or config file is read this far. */
#define KILN__AWS_FILE_MAX               ((size_t)1 << 20)
/* The first GET of an object: it pins the size and ETag and holds most headers whole. */
#define KILN__REMOTE_FIRST_GET           ((uint64_t)256 << 10)
/* A header that runs past what is in hand grows by at least this much per GET. */
#define KILN__REMOTE_GROW_MIN            ((uint64_t)16 << 20)
/* Reads from a payload left on the server come a window of this size at a time. */
#define KILN__REMOTE_WINDOW              ((uint64_t)1 << 20)

/* --- writing ------------------------------------------------------------------------------- */

/* Payloads from a read callback are produced in chunks of this size. */
#define KILN__WRITE_CHUNK (1u << 20)

#endif
