/* A fake kb-server for the client tests: a thread with a ROUTER socket on a free loopback port that records
 * every frame it receives and answers according to a mode the test sets (normal answers, silence, garbage,
 * duplicates, reordering, bad lookup sizes, error statuses, a replicated shard member's NOT_PRIMARY and
 * terms). It keeps a small table list so kbctl can be driven against it. Setup failures abort: they are bugs in the test environment, not results. */
#ifndef FAKE_KB_SERVER_H
#define FAKE_KB_SERVER_H

#include "carls.pb-c.h"
#include "kb_zap.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    FAKE_ANSWER,           /* answer every request as a server would */
    FAKE_SILENT,           /* answer nothing */
    FAKE_IGNORE_FIRST,     /* ignore the first attempt of each request id, answer the later ones */
    FAKE_GARBAGE,          /* answer with bytes that do not decode as a Response */
    FAKE_DUPLICATE,        /* answer every request twice */
    FAKE_STATUS,           /* answer with the status and text given to fake_kb_server_set_status */
    FAKE_REVERSE_PAIRS,    /* hold a request until the next arrives, then answer the later one first */
    FAKE_LOOKUP_BAD_DIM,   /* lookup answers claim dim+1 (with (dim+1)*n values) */
    FAKE_LOOKUP_EXTRA,     /* lookup answers hold one value more than n*dim */
    FAKE_LOOKUP_SHORT,     /* lookup answers hold one value less than n*dim */
    FAKE_LOOKUP_BAD_META,  /* lookup answers hold metadata for one row fewer */
    FAKE_WRONG_VERSION,    /* OK answers carrying protocol_version 99 */
} fake_mode_t;

typedef struct fake_kb_server fake_kb_server_t;

/* Binds tcp://127.0.0.1:* and starts the thread, in mode FAKE_ANSWER with no tables. */
fake_kb_server_t *fake_kb_server_new(void);
/* fake_kb_server_new as a CURVE server with key pair `server` that admits only the client whose public key
 * is allowed_client (others never get a frame through). */
fake_kb_server_t *fake_kb_server_new_curve(const kb_auth_keypair_t *server, const kb_auth_key_t *allowed_client);
/* Stops the thread and frees everything; nulls *self_p. */
void fake_kb_server_destroy(fake_kb_server_t **self_p);

/* "tcp://127.0.0.1:PORT". */
const char *fake_kb_server_endpoint(const fake_kb_server_t *self);

void fake_kb_server_set_mode(fake_kb_server_t *self, fake_mode_t mode);
/* Sets mode FAKE_STATUS answering with status and text. */
void fake_kb_server_set_status(fake_kb_server_t *self, Carls__StatusCode status, const char *text);

/* Sets mode FAKE_STATUS answering STATUS_NOT_PRIMARY, naming primary (NULL or "": none) in Response.primary,
 * as a follower of a replicated shard refuses a write. */
void fake_kb_server_set_not_primary(fake_kb_server_t *self, const char *primary);
/* Every answer from now on carries this term (0, the default: not a replicated shard). */
void fake_kb_server_set_term(fake_kb_server_t *self, uint64_t term);

/* Adds (or replaces) a table that list_tables, lookup and stats report. create_table adds one too. */
void fake_kb_server_add_table(fake_kb_server_t *self, const char *name, uint32_t dim, uint64_t rows);

/* Frames received so far (every attempt, answered or not). */
size_t fake_kb_server_count(fake_kb_server_t *self);
/* Waits up to timeout_ms until at least n frames were received; returns the count then. */
size_t fake_kb_server_wait_count(fake_kb_server_t *self, size_t n, int timeout_ms);
/* Frame i decoded (caller frees with carls__request__free_unpacked(r, NULL)); NULL if it did not decode. */
Carls__Request *fake_kb_server_request(fake_kb_server_t *self, size_t i);
/* Frame i's raw bytes: copies at most cap bytes to buf, returns the frame's length. */
size_t fake_kb_server_request_bytes(fake_kb_server_t *self, size_t i, uint8_t *buf, size_t cap);

/* The value the fake answers for element j of key's row: a function of the key bytes and j only, with
 * fractional parts that need all of a float's digits. */
float fake_kb_value(const void *key, size_t key_len, uint32_t j);

#endif
