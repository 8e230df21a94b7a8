/* Exactly-once writes: remembers which (client_id, sequence) pairs have been applied.
 *
 * Per client it keeps the highest sequence seen and a window of KB_DEDUP_WINDOW sequences below it, so
 * requests that arrive out of order (many in flight, several worker threads) are still told apart. A
 * sequence older than the window is treated as a duplicate: a client never has that many writes in flight.
 * The state is persisted with the rows it protects (kb_bank commits both in one transaction).
 * Thread-safe. */
#ifndef KB_DEDUP_H
#define KB_DEDUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_DEDUP_WINDOW 1024u
#define KB_DEDUP_WINDOW_BYTES (KB_DEDUP_WINDOW / 8u)

typedef struct kb_dedup kb_dedup_t;

kb_dedup_t *kb_dedup_new(void);
void kb_dedup_destroy(kb_dedup_t **self_p);

/* true if (client_id, seq) was recorded before (a duplicate), else records it and returns false.
 * client_id and seq must be nonzero. */
bool kb_dedup_check_and_record(kb_dedup_t *self, uint64_t client_id, uint64_t seq);

/* Takes back a record made by kb_dedup_check_and_record for a write that then failed, so that its retry is
 * applied rather than answered as a duplicate. */
void kb_dedup_forget(kb_dedup_t *self, uint64_t client_id, uint64_t seq);

/* Restores one client's state from the store. window must be KB_DEDUP_WINDOW_BYTES long; returns -1 if not. */
int kb_dedup_restore(kb_dedup_t *self, uint64_t client_id, uint64_t max_seq, const uint8_t *window, size_t len);

/* One client's state as persisted. */
typedef struct {
    uint64_t client_id;
    uint64_t max_seq;
    uint8_t window[KB_DEDUP_WINDOW_BYTES];
} kb_dedup_record_t;

/* Copies the state of every client changed since the last call into *out (grown as needed), clears the
 * marks, and returns the count. Caller frees *out. */
size_t kb_dedup_take_dirty(kb_dedup_t *self, kb_dedup_record_t **out, size_t *capacity);

size_t kb_dedup_client_count(kb_dedup_t *self);

/* Heap bytes held (the slot table, as malloc sizes it): about 300 bytes per client id ever seen, since the
 * records are kept for good (kb_memory.h). */
size_t kb_dedup_memory(kb_dedup_t *self);

#endif
