/* `carls run` with a sharded, authenticated bank (shards = 2, curve = on), on a small configuration (1,000
 * items, 2 makers, the graph term and pseudo-labels from the bank):
 *   1. bad settings are refused before anything starts: shards = 0, 1.5 or 17, curve = maybe (exit 2, the
 *      message names the key);
 *   2. a run to the end: the result line says shards=2 curve=1 and no restarts, report.md names the bank,
 *      processes.tsv lists kb-server 0/2 and 1/2, the key files are private (0700 directories, 0600 secret
 *      keys) with one client key per client process; each shard's data directory holds rows of every table,
 *      only rows of its own shard (carls_shard_of), and together every item;
 *   3. a run interrupted while its trainer trains: its servers refuse kbctl without a key and with a key that
 *      is not the run's (both see only silence: exit 2) and answer kbctl with the trainer's key; shard 1,
 *      killed with SIGKILL, is restarted on its endpoint with the same keys (the trainer's key gets answers
 *      again, no key still none); Ctrl-C stops everything (exit 130).
 * Exits 77 (skipped) without dataset-fashion-mnist. */
#include "launcher_testlib.h"
#include "maker_testlib.h"

#include "files.h"
#include "protocol.h"
#include "test_util.h"
#include "util.h"

#include <dirent.h>
#include <signal.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_ITEMS 1000

static void s_write_ini(const char *path)
{
    FILE *f = fopen(path, "w");
    fprintf(f, "name = shards\nruns_dir = unset\nitems = %d\nlabels_per_class = 10\nlabel_seed = 0\n"
               "validation = 0\nmakers = 2\nmaker_device = cpu\ngraph_k = 5\nlabel_maker = 1\n"
               "label_model_weight = 0\nhidden = 64,32\nsteps = 60\nbatch_labelled = 100\n"
               "batch_unlabelled = 64\nalpha = 0.1\nneighbors = 5\nneighbors_from = bank\nbeta = 1\n"
               "ckpt_every = 20\neval_every = 20\ntrainer_device = cpu\ntimeout_s = 300\nshards = 2\ncurve = on\n",
            S_ITEMS);
    fclose(f);
}

/* The file's permission bits, or -1. */
static int s_mode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 0777) : -1;
}

/* Files in dir whose name ends with suffix. */
static int s_count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name), sl = strlen(suffix);
        n += len > sl && strcmp(e->d_name + len - sl, suffix) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

/* Lines of path containing text. */
static int s_count_lines(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return n;
}

/* Rows of table in shard `shard`'s data directory run/kb-SHARD; *misplaced counts rows whose key belongs to
 * another of the 2 shards. */
static long s_shard_rows(const char *run, int shard, const char *table, long *misplaced)
{
    char path[600];
    snprintf(path, sizeof path, "%s/kb-%d/bank.sqlite", run, shard);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    long n = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "SELECT r.key FROM rows r JOIN tables t ON r.table_id = t.id WHERE t.name = ?", -1,
                           &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
        n = 0;
        while (sqlite3_step(st) == SQLITE_ROW) {
            n++;
            *misplaced += carls_shard_of(sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0), 2) !=
                          (uint32_t)shard;
        }
    } else {
        fprintf(stderr, "%s: %s\n", path, db ? sqlite3_errmsg(db) : "cannot open");
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* The pid of the running process `name` in processes.tsv (the row whose exit column says "running"), or -1. */
static int s_pid_of(const char *ptab, const char *name)
{
    FILE *f = fopen(ptab, "r");
    char line[1024];
    int pid = -1;
    while (f && fgets(line, sizeof line, f)) {
        char role[32], who[64], started[64], ended[64], exit_text[64];
        int p = 0;
        if (sscanf(line, "%31[^\t]\t%63[^\t]\t%d\t%63[^\t]\t%63[^\t]\t%63[^\t]", role, who, &p, started, ended,
                   exit_text) == 6 &&
            strcmp(who, name) == 0 && strcmp(exit_text, "running") == 0)
            pid = p;
    }
    if (f)
        fclose(f);
    return pid;
}

/* kbctl list-tables against endpoints with the extra options (NULL-terminated); its exit status. */
static int s_kbctl(const char *endpoints, const char *const *extra, const char *log)
{
    char *argv[16] = {"kbctl", "--kb", (char *)endpoints, "--timeout-ms", "1000", "--retries", "0"};
    int n = 7;
    for (int i = 0; extra[i]; i++)
        argv[n++] = (char *)extra[i];
    argv[n++] = "list-tables";
    argv[n] = NULL;
    return mt_wait(mt_spawn("kbctl", argv, log), 30000);
}

int main(void)
{
    lt_scratch_t sc;
    if (lt_scratch(&sc, "shards") != 0) {
        return 77;
    }
    char ini[128], path[600], line[4096];
    snprintf(ini, sizeof ini, "%s/shards.ini", sc.dir);
    s_write_ini(ini);

    /* 1. Bad settings. */
    const char *bad[][2] = {{"shards=0", "shards = 0"}, {"shards=1.5", "shards = 1.5"}, {"shards=17", "shards = 17"},
                            {"curve=maybe", "curve = 'maybe'"}};
    for (int i = 0; i < 4; i++) {
        char bad_log[160];
        snprintf(bad_log, sizeof bad_log, "%s/bad-%d.log", sc.dir, i);
        char *argv[] = {"carls", "run", ini, "--set", sc.set_runs, "--set", (char *)bad[i][0], NULL};
        MT_CHECK(mt_wait(mt_spawn("carls", argv, bad_log), 10000) == 2, "--set %s was accepted", bad[i][0]);
        MT_CHECK(mt_file_contains(bad_log, bad[i][1]), "no message naming %s (see %s)", bad[i][1], bad_log);
    }

    /* 2. A run to the end. */
    char *argv[] = {"carls", "run", ini, "--set", sc.set_runs, "--quiet", NULL};
    int st = mt_wait(mt_spawn("carls", argv, sc.log), 300000);
    mt_check_run_result(st, sc.log, line, sizeof line);
    MT_CHECK(strstr(line, " shards=2 curve=1 bank_restarts=0 maker_deaths=0 "), "result line: %s", line);
    char run[300];
    snprintf(run, sizeof run, "%s/shards", sc.runs);
    snprintf(path, sizeof path, "%s/report.md", run);
    MT_CHECK(mt_file_contains(path, "| bank: 2 kb-servers (shards), CURVE (a key per process) |"),
             "report.md does not name the bank (see %s)", path);
    snprintf(path, sizeof path, "%s/processes.tsv", run);
    MT_CHECK(mt_file_contains(path, "kb-server 0/2") && mt_file_contains(path, "kb-server 1/2"),
             "processes.tsv lacks a shard (see %s)", path);
    const int clients = s_count_lines(path, "maker\t") + s_count_lines(path, "trainer\t");
    char keys[400], clients_dir[420];
    snprintf(keys, sizeof keys, "%s/keys", run);
    snprintf(clients_dir, sizeof clients_dir, "%s/clients", keys);
    MT_CHECK(s_count_files(clients_dir, ".key") == clients && s_count_files(clients_dir, ".pub") == clients &&
                 clients >= 8,
             "%d client keys for %d client processes", s_count_files(clients_dir, ".key"), clients);
    snprintf(path, sizeof path, "%s/server.key", keys);
    MT_CHECK(s_mode(keys) == 0700 && s_mode(clients_dir) == 0700 && s_mode(path) == 0600,
             "key modes: keys %o, clients %o, server.key %o", s_mode(keys), s_mode(clients_dir), s_mode(path));
    snprintf(path, sizeof path, "%s/trainer.key", clients_dir);
    MT_CHECK(s_mode(path) == 0600, "trainer.key mode %o", s_mode(path));
    const char *tables[] = {"fmnist.pixels", "fmnist.graph", "fmnist.emb"};
    for (int t = 0; t < 3; t++) {
        long misplaced = 0, r0 = s_shard_rows(run, 0, tables[t], &misplaced),
             r1 = s_shard_rows(run, 1, tables[t], &misplaced);
        MT_CHECK(r0 > 0 && r1 > 0 && r0 + r1 == S_ITEMS && misplaced == 0,
                 "%s: shard 0 holds %ld rows, shard 1 %ld (want %d in all), %ld on the wrong shard", tables[t], r0,
                 r1, S_ITEMS, misplaced);
    }
    printf("sharded run: %s\n", line);

    /* 3. A run interrupted while it trains: only the run's keys get in. */
    char log2[160], kb_log[160], stranger[160];
    snprintf(log2, sizeof log2, "%s/carls-int.log", sc.dir);
    snprintf(kb_log, sizeof kb_log, "%s/kbctl.log", sc.dir);
    snprintf(stranger, sizeof stranger, "%s/stranger", sc.dir);
    char *keygen[] = {"kb-keygen", stranger, NULL};
    MT_CHECK(mt_wait(mt_spawn("kb-keygen", keygen, kb_log), 10000) == 0, "kb-keygen");
    char *argv2[] = {"carls", "run", ini, "--set", sc.set_runs, "--set", "steps=100000", "--set", "name=int", NULL};
    pid_t pid = mt_spawn("carls", argv2, log2);
    int64_t deadline = carls_monotonic_ms() + 120000;
    while (!mt_file_contains(log2, "[trainer]") && carls_monotonic_ms() < deadline)
        usleep(100 * 1000);
    MT_CHECK(mt_file_contains(log2, "[trainer]"), "the trainer never reported (see %s)", log2);
    char ep0[256] = "", ep1[256] = "", endpoints[600], key[400], server_pub[400], stranger_key[200];
    snprintf(path, sizeof path, "%s/int/kb-0.endpoint", sc.runs);
    carls_read_first_line(path, ep0, sizeof ep0);
    snprintf(path, sizeof path, "%s/int/kb-1.endpoint", sc.runs);
    carls_read_first_line(path, ep1, sizeof ep1);
    snprintf(endpoints, sizeof endpoints, "%s,%s", ep0, ep1);
    snprintf(key, sizeof key, "%s/int/keys/clients/trainer.key", sc.runs);
    snprintf(server_pub, sizeof server_pub, "%s/int/keys/server.pub", sc.runs);
    snprintf(stranger_key, sizeof stranger_key, "%s.key", stranger);
    const char *no_key[] = {NULL};
    const char *run_key[] = {"--curve-key", key, "--curve-server-key", server_pub, NULL};
    const char *other_key[] = {"--curve-key", stranger_key, "--curve-server-key", server_pub, NULL};
    MT_CHECK(*ep0 && *ep1, "no endpoints in %s/int", sc.runs);
    MT_CHECK(s_kbctl(endpoints, no_key, kb_log) == 2, "a client without a key got an answer (see %s)", kb_log);
    MT_CHECK(s_kbctl(endpoints, other_key, kb_log) == 2, "a client with a foreign key got an answer (see %s)",
             kb_log);
    MT_CHECK(s_kbctl(endpoints, run_key, kb_log) == 0, "the trainer's key was refused (see %s)", kb_log);
    MT_CHECK(mt_file_contains(kb_log, "fmnist.graph"), "list-tables with the run's key shows no table (see %s)",
             kb_log);
    /* A shard killed mid-run comes back on its endpoint, with its keys: the run's client gets answers again. */
    snprintf(path, sizeof path, "%s/int/processes.tsv", sc.runs);
    int shard_pid = s_pid_of(path, "kb-server 1/2");
    MT_CHECK(shard_pid > 0, "no kb-server 1/2 in %s", path);
    if (shard_pid > 0)
        kill(shard_pid, SIGKILL);
    deadline = carls_monotonic_ms() + 60000;
    while (!mt_file_contains(log2, "kb-server 1/2 listening again") && carls_monotonic_ms() < deadline)
        usleep(100 * 1000);
    MT_CHECK(mt_file_contains(log2, "kb-server 1/2 listening again"), "shard 1 was not restarted (see %s)", log2);
    MT_CHECK(s_kbctl(endpoints, run_key, kb_log) == 0, "the restarted shard refused the trainer's key (see %s)",
             kb_log);
    MT_CHECK(s_kbctl(endpoints, no_key, kb_log) == 2, "the restarted shard answered a client without a key");
    kill(pid, SIGINT);
    st = mt_wait(pid, 60000);
    MT_CHECK(st == 130, "interrupted run exited with %d (see %s)", st, log2);
    MT_CHECK(mt_file_contains(log2, "every process stopped"), "no clean stop reported (see %s)", log2);
    return mt_finish("test_launcher_shards", sc.dir);
}
