/* kb-server: the knowledge bank's server program. See `kb-server --help` and docs/PROTOCOL.md. */
#include "carls_args.h"
#include "files.h"
#include "kb_bank.h"
#include "kb_metrics.h"
#include "kb_knn.h"
#include "kb_memory.h"
#include "kb_replica.h"
#include "kb_server.h"
#include "kb_service.h"
#include "kb_snapshot.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t s_stop = 0;     /* the server loop returns: a signal, or a replica's catch-up */
static volatile sig_atomic_t s_signalled = 0;

static void s_on_signal(int sig)
{
    (void)sig;
    s_signalled = 1;
    s_stop = 1;
}

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kb-server [options]\n"
            "\n"
            "The carls-c knowledge bank: string-keyed embedding tables with lazy-averaged gradient updates,\n"
            "server-side optimizers and SQLite persistence, served over ZeroMQ (protocol: docs/PROTOCOL.md).\n"
            "\n"
            "options:\n"
            "  --listen ENDPOINT          ZeroMQ endpoint to bind (default tcp://127.0.0.1:7070;\n"
            "                             tcp://127.0.0.1:* picks a free port, see --endpoint-file)\n"
            "  --data DIR                 data directory, created 0700 if missing (default ./kb-data;\n"
            "                             with --read-only it must exist)\n"
            "  --durability MODE          sync: a write is committed (journal append + fdatasync) before it is\n"
            "                             acknowledged (concurrent writes share commits); interval:MS: commit\n"
            "                             every MS ms, so up to MS ms of acknowledged writes can be lost in a\n"
            "                             crash\n"
            "                             (default sync)\n"
            "  --compact-delay-ms N       how long committed epochs may wait in the journal before the\n"
            "                             compactor writes them into SQLite (5000): longer writes a hot row\n"
            "                             once for many epochs; shorter keeps the journal and replay short\n"
            "  --journal-segment-bytes N  the journal is a series of files of about N bytes (16 MiB); in sync\n"
            "                             durability two compacted ones are kept and written over again,\n"
            "                             which makes each commit's fdatasync cheaper\n"
            "  --frequency-period-ms N    use counts changed by lookups (never a value: reads do not rewrite\n"
            "                             rows) are written in bulk this often, at a checkpoint and at\n"
            "                             shutdown; a crash loses at most this period's counts (default 10000)\n"
            "  --threads N                worker threads for knn, sample, scan, stats, checkpoint, create and\n"
            "                             drop (default 2); lookups and writes are answered by the thread\n"
            "                             that receives them\n"
            "  --knn-threads N            OpenMP threads per nearest-neighbour search (default 1; OpenBLAS\n"
            "                             stays at 1: their product must not oversubscribe the cores, and\n"
            "                             the worker threads already search in parallel)\n"
            "  --knn-slice-us N           idle workers help with a knn request of many queries, in slices of\n"
            "                             about N us of search each (default 250: short beside a round\n"
            "                             trip, so a helper is soon free for its own next request; 0: a\n"
            "                             request is searched by one worker; a Flat request of 20\n"
            "                             queries or more is cut in slices of 256 or more, at most one\n"
            "                             per worker, so that it keeps FAISS's BLAS product)\n"
            "  --read-only                serve an existing bank without changing its files: every write\n"
            "                             (and checkpoint) is refused, the files are opened read-only, the\n"
            "                             journal is replayed into memory only, pending gradients stay\n"
            "                             pending (lookups answer the stored value) and use counts are not\n"
            "                             kept; --data must hold a bank (docs/STATE.md)\n"
            "  --restore NAME             before serving, replace the data directory's store and journal with\n"
            "                             snapshot NAME (DIR/snapshots/NAME, from `kbctl snapshot NAME`), after\n"
            "                             checking its manifest, every file's CRC-32 and its shard (--shard must\n"
            "                             match); the snapshot is kept. A damaged or incomplete one is refused\n"
            "                             naming the file, and nothing is changed\n"
            "  --shard I/N                this server is shard I of N (0-based): it refuses keys that belong\n"
            "                             to other shards (clients route keys with the same hash)\n"
            "\n"
            "replicated shards (docs/REPLICATION.md):\n"
            "  --replication-listen EP    be a shard's primary: followers connect to EP (default: the host of\n"
            "                             --listen, a free port; `kbctl replica status` shows it)\n"
            "  --replication-advertise EP  tell followers to connect to EP (tcp://HOST:PORT) instead of the\n"
            "                             bound replication endpoint: a primary reached through a relay, a\n"
            "                             NAT or a tunnel\n"
            "  --min-replicas K           with --durability sync: acknowledge a write once K followers applied\n"
            "                             it too (followers in --durability sync, which fdatasync before they\n"
            "                             acknowledge), so losing this machine loses no acknowledged write\n"
            "                             (default 0: followers may lag; `kbctl replica set` changes it)\n"
            "  --lease-ms L               as primary (now or once promoted), acknowledge writes only while\n"
            "                             max(K, 1) followers answered within L ms; else refuse them\n"
            "                             (UNAVAILABLE). A partitioned primary then stops acknowledging L ms\n"
            "                             after its followers were cut off: a coordinator that cannot reach it\n"
            "                             waits 1.1 L after fencing them before it promotes one (default 0: none)\n"
            "  --replica-of ENDPOINT      be a follower of the primary whose client endpoint this is: apply its\n"
            "                             rounds, serve reads, refuse writes (NOT_PRIMARY names the primary)\n"
            "  --replication-buffer-bytes N  rounds a primary keeps in memory for followers that fall behind\n"
            "                             (256M); one further behind (or new, or diverged) is sent a snapshot,\n"
            "                             restores it and continues from there\n"
            "  --member NAME              this member's name in the shard (default: its bound endpoint)\n"
            "                             A member whose DATA/REPLICATION exists, started without --replica-of,\n"
            "                             is a standby: it refuses writes until `kbctl replica promote`\n"
            "  --replica-curve-key FILE   with --replica-of and --curve-secret (needed then): this follower's\n"
            "                             client secret key (kb-keygen NAME.key), whose public key must be on\n"
            "                             the primary's --curve-allow list. With --curve-secret the replication\n"
            "                             socket is encrypted and admits the --curve-allow keys, as the client\n"
            "                             socket; a shard's members share one --curve-secret pair, whose public\n"
            "                             key a follower trusts (docs/SECURITY.md, replicated shards)\n"
            "  --max-message-bytes N      largest request frame (default %u)\n"
            "  --max-key-bytes N          longest key (default %u)\n"
            "  --max-dim N                largest table dimension (default %u)\n"
            "  --max-keys-per-request N   most keys in one request (default %u)\n"
            "  --commit-timeout-ms N      sync mode: answer INTERNAL if a commit takes longer (default 30000)\n"
            "  --max-memory BYTES         memory budget for the bank's data (suffixes K, M, G: powers of 1024;\n"
            "                             default unlimited). Once the server's estimate of its tables (rows,\n"
            "                             keys, optimizer state, pending gradients, feature records, indexes)\n"
            "                             would go over it, requests that create rows or tables are refused\n"
            "                             whole with RESOURCE_EXHAUSTED; reads and updates of existing rows go\n"
            "                             on. Dropped tables and evicted rows give budget back. The process's\n"
            "                             resident size is this plus its own overhead (docs/RELIABILITY.md)\n"
            "  --cache-bytes BYTES        tables larger than memory (suffixes K, M, G; default: every row in\n"
            "                             memory): keep about this much of the tables in memory, the\n"
            "                             recently used rows, and the rest only in storage, read back on\n"
            "                             demand (a lookup of a cold row costs a storage read, never a wrong\n"
            "                             value). Rows are not loaded at start-up. Tables with a knn index\n"
            "                             or an eviction policy stay wholly in memory; sample is refused on\n"
            "                             the others, scan reads storage too. SQLite's caches and the\n"
            "                             compaction queue are sized from it. --max-memory stays the hard limit\n"
            "                             (docs/STATE.md, tables larger than memory)\n"
            "  --endpoint-file FILE       write the bound endpoint to FILE once listening\n"
            "  --metrics-port P           serve Prometheus metrics (what `stats` answers) over HTTP on\n"
            "                             http://ADDRESS:P/metrics (0: a free port, logged)\n"
            "  --metrics-address ADDR     IPv4 address for --metrics-port (default 127.0.0.1; no auth)\n"
            "  --curve-secret FILE        encrypt with CURVE using this server key (from kb-keygen) ...\n"
            "  --curve-allow PATH         ... and admit only these client public keys (a directory of\n"
            "                             *.pub files, or a file with one key per line); docs/SECURITY.md\n"
            "  --log-level LEVEL          debug, info, warn, error (default info; or CARLS_LOG_LEVEL)\n"
            "  -h, --help                 this help\n"
            "\n"
            "SIGINT or SIGTERM stops the server cleanly: requests in progress are answered and everything\n"
            "is committed before it exits. Exit status 1 when it could not start, or when its journal failed\n"
            "while it served (a full disk: writes after that were refused and are not saved).\n",
            CARLS_DEFAULT_MAX_MESSAGE_BYTES, CARLS_DEFAULT_MAX_KEY_BYTES, CARLS_DEFAULT_MAX_DIM,
            CARLS_DEFAULT_MAX_KEYS_PER_REQUEST);
}

/* --durability: the text as given (logged, and handed to the service) and what it sets in the bank's options. */
typedef struct {
    const char *text;
    kb_bank_options_t *bank;
} s_durability_t;

/* "sync" or "interval:MS" with MS >= 1. */
static int s_arg_durability(const char *prog, const char *name, const char *text, void *out)
{
    s_durability_t *d = out;
    uint64_t ms = 0;
    if (strcmp(text, "sync") == 0) {
        d->bank->sync = true;
        d->bank->interval_ms = 0;
    } else if (strncmp(text, "interval:", 9) == 0 && carls_parse_u64(text + 9, &ms) == 0 && ms >= 1 &&
               ms <= UINT32_MAX) {
        d->bank->sync = false;
        d->bank->interval_ms = (uint32_t)ms;
    } else {
        fprintf(stderr, "%s: --%s: '%s' is not sync or interval:MS with MS >= 1\n", prog, name, text);
        return -1;
    }
    d->text = text;
    return 0;
}

/* "I/N" into the limits' shard. */
static int s_arg_shard(const char *prog, const char *name, const char *text, void *out)
{
    kb_limits_t *limits = out;
    return carls_args_part_value(prog, name, text, 65536, &limits->shard_index, &limits->shard_count);
}

/* A byte count (kb_memory_parse) into a uint64_t. */
static int s_arg_bytes(const char *prog, const char *name, const char *text, void *out)
{
    if (kb_memory_parse(text, out) != 0) {
        fprintf(stderr, "%s: --%s: '%s' is not a byte count such as 536870912, 512M or 4G (or 'unlimited')\n",
                prog, name, text);
        return -1;
    }
    return 0;
}

/* --cache-bytes: a byte count (kb_memory_parse) of at least 1 MiB into the bank's options. */
static int s_arg_cache_bytes(const char *prog, const char *name, const char *text, void *out)
{
    kb_bank_options_t *bank = out;
    if (kb_memory_parse(text, &bank->cache_bytes) != 0 || bank->cache_bytes < ((uint64_t)1 << 20)) {
        fprintf(stderr, "%s: --%s: '%s' is not a byte count of at least 1M such as 268435456, 256M or 2G\n", prog,
                name, text);
        return -1;
    }
    return 0;
}

/* Writes text and a newline to path atomically (files.h) so a reader never sees half of it. -1 with errno. */
static int s_write_file(const char *path, const char *text)
{
    char line[1024];
    if ((size_t)snprintf(line, sizeof line, "%s\n", text) >= sizeof line) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return carls_write_file_atomic(path, line, strlen(line), 0666, 0, NULL, 0) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    const char *listen = "tcp://127.0.0.1:7070";
    const char *endpoint_file = NULL;
    const char *restore = NULL; /* --restore NAME (kb_snapshot.h) */
    const char *curve_secret = NULL, *curve_allow = NULL, *replica_curve_key = NULL;
    uint32_t threads = 2;
    int knn_threads = 1;
    int metrics_port = -1; /* -1: no metrics server */
    const char *metrics_address = "127.0.0.1";
    kb_limits_t limits;
    kb_limits_defaults(&limits);
    kb_bank_options_t bank_opts = {.data_dir = "./kb-data", .sync = true};
    kb_replica_options_t replica_opts = {0};
    uint64_t replication_buffer = 0;
    s_durability_t durability = {.text = "sync", .bank = &bank_opts};

    const carls_arg_t args[] = {
        carls_arg_string("listen", &listen),
        carls_arg_string("data", &bank_opts.data_dir),
        carls_arg_custom("durability", &durability, s_arg_durability),
        carls_arg_u32("frequency-period-ms", &bank_opts.frequency_period_ms, 1, UINT32_MAX),
        carls_arg_u32("compact-delay-ms", &bank_opts.compact_delay_ms, 1, 3600000),
        carls_arg_u32("journal-segment-bytes", &bank_opts.journal_segment_bytes, 4096, 1u << 30),
        carls_arg_u32("threads", &threads, 1, 256),
        carls_arg_set("read-only", &limits.read_only),
        carls_arg_custom("shard", &limits, s_arg_shard),
        carls_arg_int("knn-threads", &knn_threads, 1, INT_MAX),
        carls_arg_u32("knn-slice-us", &limits.knn_slice_us, 0, 10000000),
        carls_arg_int("metrics-port", &metrics_port, 0, 65535),
        carls_arg_string("metrics-address", &metrics_address),
        carls_arg_string("curve-secret", &curve_secret),
        carls_arg_string("curve-allow", &curve_allow),
        carls_arg_u32("max-message-bytes", &limits.max_message_bytes, 1024, UINT32_MAX),
        carls_arg_u32("max-key-bytes", &limits.max_key_bytes, 1, UINT32_MAX),
        carls_arg_u32("max-dim", &limits.max_dim, 1, UINT32_MAX),
        carls_arg_u32("max-keys-per-request", &limits.max_keys_per_request, 1, UINT32_MAX),
        carls_arg_int("commit-timeout-ms", &limits.commit_timeout_ms, 1, INT_MAX),
        carls_arg_custom("max-memory", &bank_opts.max_memory, s_arg_bytes),
        carls_arg_custom("cache-bytes", &bank_opts, s_arg_cache_bytes),
        carls_arg_string("endpoint-file", &endpoint_file),
        carls_arg_string("restore", &restore),
        carls_arg_string("replica-of", &replica_opts.replica_of),
        carls_arg_string("replication-listen", &replica_opts.listen),
        carls_arg_string("replication-advertise", &replica_opts.advertise),
        carls_arg_u32("min-replicas", &replica_opts.min_replicas, 0, 15),
        carls_arg_u32("lease-ms", &replica_opts.lease_ms, 0, 600000),
        carls_arg_custom("replication-buffer-bytes", &replication_buffer, s_arg_bytes),
        carls_arg_string("member", &replica_opts.member),
        carls_arg_string("replica-curve-key", &replica_curve_key),
        carls_arg_log_level(),
        {0},
    };
    int parsed = carls_args_parse("kb-server", argc, argv, args, s_usage);
    if (parsed != 0) {
        return parsed > 0 ? 0 : 2; /* --help, or bad usage (reported) */
    }
    if (!curve_secret != !curve_allow) {
        fprintf(stderr, "kb-server: --curve-secret and --curve-allow go together\n");
        return 2;
    }
    bool replicating = replica_opts.replica_of || replica_opts.listen || replica_opts.advertise ||
                       replica_opts.min_replicas || replica_opts.lease_ms;
    if (replicating && (limits.read_only || bank_opts.cache_bytes)) {
        fprintf(stderr, "kb-server: --replica-of, --replication-listen and --min-replicas cannot be used with %s\n",
                limits.read_only ? "--read-only" : "--cache-bytes");
        return 2;
    }
    if (replica_curve_key && (!replica_opts.replica_of || !curve_secret)) {
        fprintf(stderr, "kb-server: --replica-curve-key is a follower's key (--replica-of) towards a primary that "
                        "uses CURVE, and goes with --curve-secret and --curve-allow (a shard's members all use "
                        "CURVE or none does)\n");
        return 2;
    }
    if (replica_opts.replica_of && curve_secret && !replica_curve_key) {
        fprintf(stderr, "kb-server: --replica-of with --curve-secret needs --replica-curve-key FILE: this "
                        "follower's client secret key, whose public key is on the primary's --curve-allow list\n");
        return 2;
    }
    if (replica_opts.min_replicas && !bank_opts.sync) {
        fprintf(stderr, "kb-server: --min-replicas needs --durability sync (interval durability waits for nobody)\n");
        return 2;
    }
    if (replica_opts.replica_of && (replica_opts.listen || replica_opts.advertise || replica_opts.min_replicas)) {
        fprintf(stderr, "kb-server: --replica-of starts a follower; --replication-listen, --replication-advertise "
                        "and --min-replicas are a primary's (a promoted follower binds the host of --listen)\n");
        return 2;
    }
    const char *port = replica_opts.advertise ? strrchr(replica_opts.advertise, ':') : NULL;
    if (replica_opts.advertise &&
        (strncmp(replica_opts.advertise, "tcp://", 6) != 0 || !port || port - replica_opts.advertise < 7 ||
         strlen(port + 1) == 0 || strspn(port + 1, "0123456789") != strlen(port + 1))) {
        fprintf(stderr, "kb-server: --replication-advertise '%s' is not tcp://HOST:PORT\n", replica_opts.advertise);
        return 2;
    }
    if (bank_opts.cache_bytes && bank_opts.max_memory && bank_opts.cache_bytes > bank_opts.max_memory) {
        fprintf(stderr, "kb-server: --cache-bytes (%llu) must not exceed --max-memory (%llu), the hard limit\n",
                (unsigned long long)bank_opts.cache_bytes, (unsigned long long)bank_opts.max_memory);
        return 2;
    }
    /* A read-only server loads every row and the journal into memory (kb_bank.h); rows the cache would drop
     * could only be read back from SQLite, which does not hold the journal's newer epochs. */
    if (bank_opts.cache_bytes && limits.read_only) {
        fprintf(stderr, "kb-server: --cache-bytes cannot be used with --read-only (a read-only server keeps "
                        "every row in memory)\n");
        return 2;
    }
    /* The estimate --max-memory limits also holds the compaction queue (up to a quarter of --cache-bytes) and
     * the rows a request brings in before older ones leave: near the limit even lookups of cold rows (which
     * count as new rows there) would be refused. */
    if (bank_opts.cache_bytes && bank_opts.max_memory && bank_opts.max_memory / 3 < bank_opts.cache_bytes / 2)
        LOG_WARN("--cache-bytes %llu MiB leaves little room under --max-memory %llu MiB: lookups of rows only in "
                 "storage count as new rows there and may be refused near it (give it 3/2 of --cache-bytes)",
                 (unsigned long long)(bank_opts.cache_bytes >> 20), (unsigned long long)(bank_opts.max_memory >> 20));

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A file size limit (ulimit -f) reached by the journal or SQLite is then a failed write (EFBIG), which the
     * bank reports and refuses further writes over, instead of a signal that kills the server. */
    signal(SIGXFSZ, SIG_IGN);

    bank_opts.read_only = limits.read_only;
    kb_knn_set_threads(knn_threads, 1);
    char err[1024];
    kb_bank_t *bank = NULL;
    if (restore && kb_snapshot_restore(bank_opts.data_dir, restore, limits.shard_index, limits.shard_count, err,
                                       sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return 1;
    }
    if (kb_snapshot_check_interrupted(bank_opts.data_dir, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return 1;
    }
    replica_opts.data_dir = bank_opts.data_dir;
    replica_opts.shard_index = limits.shard_index;
    replica_opts.shard_count = limits.shard_count;
    replica_opts.buffer_bytes = replication_buffer;
    replica_opts.curve_secret = curve_secret;
    replica_opts.curve_allow = curve_allow;
    replica_opts.curve_replica_key = replica_curve_key;
    bool bank_replica = false;
    if (!limits.read_only && kb_replica_bank_mode(&replica_opts, &bank_replica, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return 1;
    }
    replicating |= bank_replica; /* a member with DATA/REPLICATION replicates, as a standby without flags */
    bank_opts.replica = bank_replica;
    bank_opts.min_replicas = replica_opts.min_replicas;
    if (bank_replica && bank_opts.cache_bytes) {
        LOG_ERROR("%s holds a replicated member (REPLICATION): --cache-bytes cannot be used", bank_opts.data_dir);
        return 1;
    }
    replica_opts.server_stop = &s_stop;
    char bound[256] = "", member[256] = ""; /* kept across a follower's restart on a snapshot (kb_replica.h) */
serve:
    if (kb_bank_open(&bank_opts, &bank, err, sizeof err) != 0) {
        LOG_ERROR("cannot open the bank: %s", err);
        return 1;
    }
    kb_service_t *service = kb_service_new(bank, &limits, threads, durability.text);
    if (bank_replica) /* no write is taken before the member knows its role (kb_replica_new) */
        kb_service_set_role(service, 0, false, replica_opts.replica_of);
    kb_server_options_t server_opts = {
        .endpoint = listen,
        .threads = threads,
        .max_message_bytes = limits.max_message_bytes,
        .curve_secret_file = curve_secret,
        .curve_allow_path = curve_allow,
    };
    kb_server_t *server = NULL;
    kb_metrics_server_t *metrics = NULL;
    kb_replica_t *replica = NULL;
    int rc = 0;
    if (kb_server_new(service, &server_opts, &server, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        rc = 1;
        goto done;
    }
    snprintf(bound, sizeof bound, "%s", kb_server_endpoint(server));
    replica_opts.client_endpoint = bound;
    if (replicating) {
        if (!replica_opts.member) {
            snprintf(member, sizeof member, "%s", bound);
            replica_opts.member = member;
        }
        if (kb_replica_new(bank, service, &replica_opts, &replica, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            rc = 1;
            goto done;
        }
    }
    /* Before the endpoint file is written, so whoever waits for that file finds the metrics up too. */
    if (metrics_port >= 0) {
        if (kb_metrics_server_start(service, metrics_address, (uint16_t)metrics_port, &metrics, err, sizeof err) !=
            0) {
            LOG_ERROR("%s", err);
            rc = 1;
            goto done;
        }
        LOG_INFO("metrics: http://%s:%u/metrics", metrics_address, kb_metrics_server_port(metrics));
    }
    char memory_note[64] = "";
    if (bank_opts.max_memory)
        snprintf(memory_note, sizeof memory_note, ", max memory %llu MiB",
                 (unsigned long long)(bank_opts.max_memory >> 20));
    LOG_INFO("kb-server: data %s, durability %s%s, shard %u/%u%s", bank_opts.data_dir, durability.text,
             limits.read_only ? ", read-only" : "", limits.shard_index, limits.shard_count ? limits.shard_count : 1,
             memory_note);
    if (endpoint_file && s_write_file(endpoint_file, kb_server_endpoint(server)) != 0) {
        LOG_ERROR("cannot write %s: %s", endpoint_file, strerror(errno));
        rc = 1;
        goto done;
    }
    kb_server_run(server, &s_stop);
done:;
    kb_replica_catch_up_t *catch_up = replica && !s_signalled ? kb_replica_take_catch_up(replica) : NULL;
    kb_metrics_server_stop(&metrics);
    kb_server_destroy(&server);
    kb_replica_destroy(&replica);
    kb_service_destroy(&service);
    /* A journal that failed while serving refused every write after it: say so in the exit status too. */
    bool refused = bank && kb_commit_broken(kb_bank_commit(bank)) && !kb_commit_fenced(kb_bank_commit(bank));
    kb_bank_close(&bank);
    if (refused) {
        LOG_ERROR("the journal failed while serving (see above): writes after that were refused and not saved");
        rc = 1;
    }
    if (catch_up && rc == 0) {
        /* A follower too far behind its primary received a snapshot: restore it and serve again, on the same
         * endpoint, from the snapshot's cut. */
        int crc = kb_replica_catch_up_apply(catch_up, err, sizeof err);
        kb_replica_catch_up_free(&catch_up);
        if (crc != 0) {
            LOG_ERROR("%s", err);
            return 1;
        }
        s_stop = 0;
        listen = bound;
        endpoint_file = NULL; /* written once; the endpoint is the same */
        goto serve;
    }
    kb_replica_catch_up_free(&catch_up);
    LOG_INFO("kb-server stopped%s", refused ? " (exit status 1)" : "");
    return rc;
}
