/* Memory accounting for kb-server --max-memory (docs/RELIABILITY.md, "Memory limit").
 *
 * One kb_memory_t per bank holds the server's estimate of the memory its data takes: every table adds and
 * subtracts what it allocates (rows with keys, values, optimizer state, pending gradients and feature
 * records, row maps, the nearest-neighbour copy and index, sampling snapshots, admission filters), the bank
 * adds the de-duplication records and the rows it is committing. Sizes are counted as glibc's malloc takes
 * them (kb_memory_chunk), so the estimate follows the heap rather than the bytes asked for.
 *
 * The budget: a request that would create rows first reserves what they will take (kb_memory_reserve). A
 * reservation is refused when the estimate plus every reservation in flight plus this one would exceed the
 * limit, so concurrent requests cannot overshoot it together; a reservation of 0 bytes (a request that
 * creates nothing) always succeeds, also over the limit. The request releases its reservation once its rows
 * are in the estimate.
 *
 * Thread-safe (atomics); every function accepts self == NULL (no accounting: nothing counted, every
 * reservation succeeds), so tables used without a bank (unit tests) need none. */
#ifndef KB_MEMORY_H
#define KB_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kb_memory kb_memory_t;

/* limit: bytes the estimate may reach; 0 = unlimited. Caller owns the result. */
kb_memory_t *kb_memory_new(uint64_t limit);
void kb_memory_destroy(kb_memory_t **self_p);

/* Adds delta (negative: frees) to the estimate. */
void kb_memory_add(kb_memory_t *self, int64_t delta);

/* The estimate (bytes), never negative. */
uint64_t kb_memory_used(const kb_memory_t *self);
uint64_t kb_memory_limit(const kb_memory_t *self);
/* Bytes reserved by requests in flight. */
uint64_t kb_memory_reserved(const kb_memory_t *self);

/* Reserves bytes for rows about to be created. 0 on success, -1 when used + reserved + bytes would exceed the
 * limit (nothing reserved). bytes == 0 always succeeds. */
int kb_memory_reserve(kb_memory_t *self, uint64_t bytes);
/* Gives back a reservation made by kb_memory_reserve. */
void kb_memory_release(kb_memory_t *self, uint64_t bytes);

/* What malloc(size) takes from the heap on glibc x86-64/aarch64: the size plus an 8-byte header, rounded up
 * to 16, at least 32; a block of 128 KiB or more is its own mmap (size + 16 rounded up to the page). */
size_t kb_memory_chunk(size_t size);

/* Parses a byte count: digits with an optional suffix K, M, G or T (powers of 1024; "KiB", "MB" and the like
 * are read the same) or "0"/"none"/"unlimited" for no limit (0). Returns 0 and *out, or -1. */
int kb_memory_parse(const char *text, uint64_t *out);

/* This process's resident set size in bytes (/proc/self/statm), 0 when it cannot be read. */
uint64_t kb_memory_rss(void);

/* A field of another process's /proc/PID/status in kB ("VmRSS", "VmHWM"): how a benchmark or a test watches
 * a kb-server's memory from outside. 0 when unreadable. */
uint64_t kb_memory_proc_status_kb(pid_t pid, const char *field);

#endif
