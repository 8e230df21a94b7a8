/* The replication transport's state and what its files share (kb_replica.c, kb_replica_catchup.c). Private:
 * only knowledge_bank/kb_replica*.c include it. */
#ifndef KB_REPLICA_INTERNAL_H
#define KB_REPLICA_INTERNAL_H

#include "kb_replica.h"
#include "kb_snapshot.h"
#include "kb_term.h"
#include "kb_zap.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#define S_MAX_FOLLOWERS 16
#define S_HEARTBEAT_MS 100
#define S_FOLLOWER_SILENT_MS 3000 /* a follower not heard from this long is no longer counted live */
#define S_PRIMARY_SILENT_MS 1000  /* a follower that hears nothing this long says hello again */
#define S_DEFAULT_BUFFER_BYTES ((uint64_t)256 << 20)
#define S_REPLICA_WAIT_MS 2000    /* fewer than --min-replicas followers this long: writes are refused */
#define S_CHUNK_BYTES ((size_t)1 << 20)
#define S_CHUNK_WINDOW 8u          /* snapshot chunks sent and not yet acknowledged */
#define S_MAX_SNAPSHOT_FILES 64

/* One round kept for the followers: shared by the ring and every message that sends it (zero-copy). */
typedef struct {
    atomic_int refs;
    uint64_t epoch;
    uint32_t crc;
    int64_t shipped_us;
    size_t len;
    uint8_t data[];
} s_round_t;

typedef struct {
    char member[KB_TERM_MAX_MEMBER + 1];
    uint8_t id[256]; /* the ROUTER's routing id of its connection */
    size_t id_len;
    uint64_t sent_epoch, acked_epoch;
    int64_t heard_ms;
    int64_t echo_us;  /* the newest of this primary's send times (monotonic) it acknowledged: the lease */
    bool live;
    bool sync; /* it runs --durability sync: its ack means its journal holds the round */
} s_follower_t;

/* A snapshot on its way to one follower (one at a time). */
typedef struct {
    bool active;        /* a follower needs one */
    bool taking;        /* the snapshot thread runs */
    bool ready;         /* taken: files and cut known */
    char member[KB_TERM_MAX_MEMBER + 1];
    uint8_t id[256];
    size_t id_len;
    char name[KB_SNAPSHOT_MAX_NAME + 1];
    uint64_t cut_epoch, bytes;
    char files[S_MAX_SNAPSHOT_FILES][300]; /* relative to the snapshot's directory, MANIFEST last */
    size_t n_files, file_at;
    uint64_t offset;
    uint32_t next_chunk, acked_chunks;
    bool begun;
    pthread_t thread;
    bool thread_joinable;
} s_transfer_t;

/* What a follower received and checked, to restore once the server has stopped (kb_replica_take_catch_up). */
struct kb_replica_catch_up {
    char *data_dir;
    char name[KB_SNAPSHOT_MAX_NAME + 1];
    uint32_t shard_index, shard_count;
    kb_term_state_t state; /* the primary's history up to the cut, as this member's */
};

struct kb_replica {
    kb_commit_t *commit;    /* the bank's pipeline: ships rounds, applies a primary's, holds the durable point */
    kb_service_t *service;
    char *data_dir, *member, *replica_of, *listen, *advertise;
    char *client_endpoint; /* the bound one, whose host a promoted follower binds */
    uint32_t min_replicas, shard_index, shard_count;
    uint32_t lease_ms;      /* --lease-ms (0: none) */
    uint64_t buffer_bytes;

    pthread_mutex_t op_mutex; /* replica ops (promote, fence, set) one at a time */
    pthread_mutex_t mutex; /* the state below, the ring and the followers */
    kb_term_state_t *state;
    bool have_state;        /* DATA/REPLICATION exists (a fresh follower has none before its first round) */
    bool fenced;
    void *zctx;
    /* CURVE (kb_replica.h): the server's key pair and the ZAP handler of zctx for the replication socket; a
     * follower's own key pair for its connections to the primary. */
    bool curve;
    kb_auth_keypair_t curve_server;
    kb_auth_t *auth;
    bool curve_follow;
    kb_auth_keypair_t curve_client;

    /* primary */
    void *router;
    char endpoint[256];
    int event_fd;
    pthread_t primary_thread;
    bool primary_running;
    atomic_bool primary_stop;
    s_round_t **ring;       /* recent rounds, oldest first, from ring_first on */
    size_t ring_first, ring_count, ring_cap;
    uint64_t ring_bytes;
    uint64_t ring_base;     /* every round after this epoch is in the ring */
    bool ring_ready;        /* ring_base is known (kb_commit_set_ship_hook answered) */
    uint64_t shipped_epoch;
    s_follower_t followers[S_MAX_FOLLOWERS];
    size_t n_followers;
    int64_t short_since_ms; /* since when fewer than --min-replicas followers are live (0: enough) */
    kb_snapshots_t *snapshots;
    s_transfer_t transfer;

    /* follower */
    pthread_t follower_thread;
    bool follower_running;
    atomic_bool follower_stop;
    volatile sig_atomic_t *server_stop;
    /* Read bounds (mutex): what the follower thread knows of how far behind it is. */
    uint64_t through;       /* every round up to it received, records applied */
    uint64_t hb_shipped;    /* the primary's newest round at its last heartbeat */
    int64_t hb_ms;          /* when that heartbeat came (this machine's monotonic clock) */
    int64_t caught_up_ms;   /* the newest heartbeat time whose announced rounds were all received */
    uint64_t pending_shipped;
    int64_t pending_ms;     /* a heartbeat not yet caught up with */
    void *ack_dealer;       /* follower thread: the socket and echo s_journaled acknowledges with */
    int64_t ack_echo;
    kb_replica_catch_up_t *catch_up; /* a received snapshot waiting for the server to stop */
};

/* A snapshot a follower is receiving (kb_replica_catchup.c). */
typedef struct {
    bool active;
    char name[KB_SNAPSHOT_MAX_NAME + 1];
    char dir[1200];
    uint32_t next_chunk;
    kb_replica_catch_up_t pending; /* what Begin said */
} kb_replica_receive_t;

char *kb_replica_dup(const char *s);

/* A follower's handling of a snapshot's messages: Begin and Chunk return 0, or -1 when the stream must start
 * again; End returns 1 when the snapshot is checked and waits for the server to restart on it. */
int kb_replica_on_snapshot_begin(kb_replica_t *self, kb_replica_receive_t *rx, const Carls__ReplSnapshotBegin *b);
int kb_replica_on_snapshot_chunk(kb_replica_receive_t *rx, const Carls__ReplSnapshotChunk *c, zmq_msg_t *data);
int kb_replica_on_snapshot_end(kb_replica_t *self, kb_replica_receive_t *rx, const Carls__ReplSnapshotEnd *e);

#endif
