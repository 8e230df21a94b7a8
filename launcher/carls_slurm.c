/* Experiments as one Slurm job (see carls_slurm.h). */
#include "carls_slurm.h"

#include "carls_proc.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_MAX_NODES 64
#define S_MAX_OPTS 16
#define S_MAX_ARGS 160

/* Slurm mode's settings and what carls_slurm_begin found out about the job. */
typedef struct {
    bool on;                            /* --slurm */
    int nodes;                          /* --slurm-nodes: nodes salloc asks for */
    const char *opt[S_MAX_OPTS];        /* --slurm-opt: more salloc arguments */
    int n_opt;
    const char *step_opt[S_MAX_OPTS];   /* --slurm-step-opt: more srun arguments for every process's step */
    int n_step_opt;
    const char *scratch_root;           /* --slurm-scratch */
    char job[32];                       /* SLURM_JOB_ID */
    int k;                              /* the job's node count */
    char node[S_MAX_NODES][128];        /* their names, in the job's order */
    char addr[S_MAX_NODES][256];        /* their NodeAddr */
    int gpus;                           /* GPUs the job holds on each node (the fewest on any): 0 without */
    char run_dir[4200];                 /* runs/<name>, rewritten to scratch/<node> in arguments */
    char scratch[4400];                 /* SCRATCH/carls-<job>-<name> on every node */
} s_slurm_t;

static s_slurm_t s_sl = {.nodes = 2, .scratch_root = "/tmp"};

/* ---- small helpers -------------------------------------------------------------------------------------- */

/* snprintf that reports a result that does not fit (returns -1). */
static int s_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int s_fmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Runs the shell command cmd and reads its stdout into out (outlen bytes, cut), trailing newlines removed.
 * Returns the command's exit status (-1 when it could not run, 128 + N when a signal N ended it). */
static int s_capture(const char *cmd, char *out, size_t outlen)
{
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) {
        return -1;
    }
    size_t n = 0;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
        for (size_t i = 0; i < got && n + 1 < outlen; i++) {
            out[n++] = buf[i];
        }
    }
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r')) {
        out[--n] = '\0';
    }
    int st = pclose(p);
    return st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* The value of KEY= in one line of `scontrol show -o` output ("" when absent). */
static void s_field(const char *line, const char *key, char *out, size_t outlen)
{
    out[0] = '\0';
    size_t kl = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += kl) {
        if ((p == line || p[-1] == ' ') && p[kl] == '=') {
            p += kl + 1;
            size_t n = strcspn(p, " \n");
            if (n >= outlen) {
                n = outlen - 1;
            }
            memcpy(out, p, n);
            out[n] = '\0';
            return;
        }
    }
}

/* The prefix of every srun that moves files or looks at a file on node i: an overlapping step (it takes no
 * CPUs from the run's steps), quiet. */
static int s_aux(char *buf, size_t len, int i)
{
    return s_fmt(buf, len, "srun --jobid=%s --overlap --nodes=1 --ntasks=1 --nodelist=%s --job-name=carls-aux --quiet",
                 s_sl.job, s_sl.node[i]);
}

/* Whether the job still runs. squeue that cannot answer (slurmctld busy: "Socket timed out") is asked again a
 * few times; if it never answers the job counts as alive, so the trainer's files are still fetched (a failed
 * fetch says so) rather than silently left on its node. */
static bool s_job_alive(void)
{
    char cmd[256], out[256];
    s_fmt(cmd, sizeof cmd, "squeue -h -j %s -o %%T 2>&1", s_sl.job);
    for (int attempt = 0; attempt < 5; attempt++) {
        if (attempt > 0) {
            usleep(200 * 1000 * (unsigned)attempt);
        }
        int rc = s_capture(cmd, out, sizeof out);
        if (rc == 0) {
            return strncmp(out, "RUNNING", 7) == 0; /* empty: the job has ended */
        }
        if (strstr(out, "Invalid job id")) {
            return false;
        }
    }
    return true;
}

/* Whether a `sinfo` state ("idle", "mix*", "down*", "drain", ...) is a node that cannot run steps: not
 * responding ('*'), down, drained or failed. */
static bool s_state_lost(const char *state)
{
    return strchr(state, '*') || strncmp(state, "down", 4) == 0 || strncmp(state, "drain", 5) == 0 ||
           strncmp(state, "fail", 4) == 0;
}

/* Marks in lost[] (s_sl.k entries) the job's nodes Slurm says cannot run steps now. A sinfo that does not
 * answer marks none. */
static void s_lost_nodes(bool *lost)
{
    char out[8192];
    memset(lost, 0, (size_t)s_sl.k * sizeof *lost);
    if (s_capture("sinfo -h -N -o '%N %t' 2>/dev/null", out, sizeof out) != 0) {
        return;
    }
    for (char *save = NULL, *tok = strtok_r(out, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        char name[128], state[64];
        if (sscanf(tok, "%127s %63s", name, state) != 2) {
            continue;
        }
        for (int i = 0; i < s_sl.k; i++) {
            lost[i] |= strcmp(s_sl.node[i], name) == 0 && s_state_lost(state);
        }
    }
}

/* ---- options -------------------------------------------------------------------------------------------- */

void carls_slurm_print_help(FILE *out)
{
    fprintf(out,
            "Slurm (docs/SLURM.md): carls run --slurm CONFIG.ini [--set key=value]... runs the experiment as one\n"
            "Slurm job: the bank, the maker fleets and the trainer become job steps on the job's nodes.\n"
            "  --slurm                 run as Slurm job steps (inside salloc/sbatch: that job; else salloc one)\n"
            "  --slurm-nodes N         nodes to ask salloc for when not inside an allocation (default 2)\n"
            "  --slurm-opt ARG         one more salloc argument (repeatable), e.g. --slurm-opt=--partition=gpu\n"
            "                          --slurm-opt=--time=1:00:00 --slurm-opt=--gres=gpu:1\n"
            "  --slurm-step-opt ARG    one more srun argument for every process's step (repeatable), e.g.\n"
            "                          --slurm-step-opt=--mem-per-cpu=2G where memory is a consumable resource\n"
            "  --slurm-scratch DIR     node-local directory for the run's files on each node (default /tmp)\n");
}

/* The value of option name at argv[*i] ("--name value" or "--name=value"), advancing *i; NULL when argv[*i] is
 * not that option or its value is missing (*missing then set). */
static const char *s_opt_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    size_t len = strlen(name);
    if (strncmp(argv[*i], name, len) != 0) {
        return NULL;
    }
    if (argv[*i][len] == '=') {
        return argv[*i] + len + 1;
    }
    if (argv[*i][len] != '\0') {
        return NULL;
    }
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

/* Appends v to list (*n entries, at most S_MAX_OPTS); -1 after reporting when it is full. */
static int s_list_add(const char **list, int *n, const char *v, const char *flag)
{
    if (*n >= S_MAX_OPTS) {
        fprintf(stderr, "carls: more than %d %s\n", S_MAX_OPTS, flag);
        return -1;
    }
    list[(*n)++] = v;
    return 0;
}

int carls_slurm_take_args(int *argc, char **argv)
{
    int out = 1;
    bool other = false;
    for (int i = 1; i < *argc; i++) {
        bool missing = false;
        const char *v;
        if (strcmp(argv[i], "--slurm") == 0) {
            s_sl.on = true;
        } else if ((v = s_opt_value(*argc, argv, &i, "--slurm-nodes", &missing)) != NULL) {
            uint64_t n = 0;
            if (carls_parse_u64(v, &n) != 0 || n < 1 || n > S_MAX_NODES) {
                fprintf(stderr, "carls: --slurm-nodes '%s': need 1..%d\n", v, S_MAX_NODES);
                return 2;
            }
            s_sl.nodes = (int)n;
            other = true;
        } else if ((v = s_opt_value(*argc, argv, &i, "--slurm-opt", &missing)) != NULL) {
            if (s_list_add(s_sl.opt, &s_sl.n_opt, v, "--slurm-opt") != 0) {
                return 2;
            }
            other = true;
        } else if ((v = s_opt_value(*argc, argv, &i, "--slurm-step-opt", &missing)) != NULL) {
            if (s_list_add(s_sl.step_opt, &s_sl.n_step_opt, v, "--slurm-step-opt") != 0) {
                return 2;
            }
            other = true;
        } else if ((v = s_opt_value(*argc, argv, &i, "--slurm-scratch", &missing)) != NULL) {
            if (v[0] != '/' || strchr(v, '\'')) {
                fprintf(stderr, "carls: --slurm-scratch '%s': need an absolute path without quotes\n", v);
                return 2;
            }
            s_sl.scratch_root = v;
            other = true;
        } else if (missing) {
            fprintf(stderr, "carls: %s needs a value\n", argv[i]);
            return 2;
        } else {
            argv[out++] = argv[i];
        }
    }
    if (other && !s_sl.on) {
        fprintf(stderr, "carls: --slurm-nodes, --slurm-opt, --slurm-step-opt and --slurm-scratch need --slurm\n");
        return 2;
    }
    *argc = out;
    argv[out] = NULL;
    return s_sl.on ? 1 : 0;
}

bool carls_slurm_in_allocation(void)
{
    const char *job = getenv("SLURM_JOB_ID");
    return job && *job;
}

int carls_slurm_allocate(char **args)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "carls: cannot find this program's path: %s\n", strerror(errno));
        return 1;
    }
    self[n] = '\0';
    int nargs = 0;
    while (args[nargs]) {
        nargs++;
    }
    const char *config = "run";
    for (int i = 1; i < nargs; i++) {
        const char *prev = args[i - 1];
        const bool value = strcmp(prev, "--set") == 0 || strcmp(prev, "--slurm-nodes") == 0 ||
                           strcmp(prev, "--slurm-opt") == 0 || strcmp(prev, "--slurm-step-opt") == 0 ||
                           strcmp(prev, "--slurm-scratch") == 0;
        if (args[i][0] != '-' && !value) {
            config = args[i];
            break;
        }
    }
    const char *base = strrchr(config, '/') ? strrchr(config, '/') + 1 : config;
    char nodes[32], name[160];
    s_fmt(nodes, sizeof nodes, "--nodes=%d", s_sl.nodes);
    if (s_fmt(name, sizeof name, "--job-name=carls-%.*s", (int)strcspn(base, "."), base) != 0) {
        s_fmt(name, sizeof name, "--job-name=carls");
    }
    char **av = carls_xcalloc((size_t)(nargs + S_MAX_OPTS + 8), sizeof *av);
    int k = 0;
    av[k++] = "salloc";
    av[k++] = nodes;
    av[k++] = "--exclusive";
    av[k++] = "--no-kill"; /* a lost node ends only what ran there: the launcher moves or fails over it */
    av[k++] = name;
    for (int i = 0; i < s_sl.n_opt; i++) {
        av[k++] = (char *)s_sl.opt[i];
    }
    av[k++] = self;
    for (int i = 0; i < nargs; i++) {
        av[k++] = args[i];
    }
    av[k] = NULL;
    printf("[carls] not inside a Slurm allocation: asking for one (salloc %s --exclusive --no-kill %s", nodes, name);
    for (int i = 0; i < s_sl.n_opt; i++) {
        printf(" %s", s_sl.opt[i]);
    }
    printf(")\n");
    fflush(stdout);
    execvp("salloc", av);
    fprintf(stderr, "carls: cannot run salloc: %s (is slurm-client installed?)\n", strerror(errno));
    free(av);
    return 1;
}

/* ---- the job ---------------------------------------------------------------------------------------------- */

/* Fills s_sl's node list, addresses and GPU flag from the job. Returns 0, or -1 after reporting. */
static int s_discover(void)
{
    const char *job = getenv("SLURM_JOB_ID");
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!job || !*job || !list || !*list) {
        fprintf(stderr, "carls: --slurm: not inside a Slurm allocation (SLURM_JOB_ID / SLURM_JOB_NODELIST unset)\n");
        return -1;
    }
    if (strspn(job, "0123456789_") != strlen(job) || strlen(job) >= sizeof s_sl.job || strchr(list, '\'')) {
        fprintf(stderr, "carls: --slurm: SLURM_JOB_ID '%s' or SLURM_JOB_NODELIST '%s' is malformed\n", job, list);
        return -1;
    }
    s_fmt(s_sl.job, sizeof s_sl.job, "%s", job);
    char cmd[8192], out[16384];
    if (s_fmt(cmd, sizeof cmd, "scontrol show hostnames '%s'", list) != 0 || s_capture(cmd, out, sizeof out) != 0 ||
        !*out) {
        fprintf(stderr, "carls: --slurm: `scontrol show hostnames %s` failed\n", list);
        return -1;
    }
    s_sl.k = 0;
    for (char *save = NULL, *tok = strtok_r(out, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        if (s_sl.k >= S_MAX_NODES) {
            fprintf(stderr, "carls: --slurm: the job has more than %d nodes\n", S_MAX_NODES);
            return -1;
        }
        if (strlen(tok) >= sizeof s_sl.node[0] || strchr(tok, '\'')) {
            fprintf(stderr, "carls: --slurm: node name '%s' is malformed\n", tok);
            return -1;
        }
        s_fmt(s_sl.node[s_sl.k++], sizeof s_sl.node[0], "%s", tok);
    }
    for (int i = 0; i < s_sl.k; i++) {
        s_fmt(cmd, sizeof cmd, "scontrol show node -o '%s'", s_sl.node[i]);
        if (s_capture(cmd, out, sizeof out) != 0) {
            fprintf(stderr, "carls: --slurm: `scontrol show node %s` failed\n", s_sl.node[i]);
            return -1;
        }
        s_field(out, "NodeAddr", s_sl.addr[i], sizeof s_sl.addr[0]);
        if (!*s_sl.addr[i] || strchr(s_sl.addr[i], '\'')) {
            fprintf(stderr, "carls: --slurm: node %s has no usable NodeAddr ('%s')\n", s_sl.node[i], s_sl.addr[i]);
            return -1;
        }
    }
    /* GPUs per node: the detail lines "Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:2(IDX:0-1)" (or gpu:TYPE:2). */
    s_sl.gpus = 0;
    s_fmt(cmd, sizeof cmd, "scontrol show job -d %s", s_sl.job);
    if (s_capture(cmd, out, sizeof out) == 0) {
        int fewest = -1;
        for (char *save = NULL, *tok = strtok_r(out, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
            char gres[512];
            while (*tok == ' ') {
                tok++;
            }
            if (strncmp(tok, "Nodes=", 6) != 0) {
                continue;
            }
            s_field(tok, "GRES", gres, sizeof gres);
            int n = 0;
            if (strncmp(gres, "gpu:", 4) == 0) {
                gres[strcspn(gres, "(")] = '\0';
                n = atoi(strrchr(gres, ':') + 1);
            }
            fewest = fewest < 0 || n < fewest ? n : fewest;
        }
        s_sl.gpus = fewest > 0 ? fewest : 0;
    }
    return 0;
}

/* ---- one step: placement and arguments ---------------------------------------------------------------------- */

typedef enum { S_SERVER, S_TRAINER, S_MAKER } s_role_t;

/* The last "I/N" in name: I (0 when there is none). */
static int s_worker_index(const char *name)
{
    int idx = 0;
    for (const char *p = name; *p; p++) {
        if (*p == '/' && p > name && p[-1] >= '0' && p[-1] <= '9') {
            const char *q = p;
            while (q > name && q[-1] >= '0' && q[-1] <= '9') {
                q--;
            }
            idx = atoi(q);
        }
    }
    return idx;
}

/* A step being built: where it runs, its arguments on the node, the files that travel. */
typedef struct {
    s_role_t role;
    const char *name;             /* the process's name ("maker embed 1/2") */
    int node;                     /* index in s_sl.node */
    int cpus;
    char step_name[64];           /* --job-name of the step: carls-<proxy pid> */
    char root[4600];              /* scratch/<node> */
    char pool[S_MAX_ARGS][4800];  /* rewritten arguments */
    char *argv[S_MAX_ARGS + 1];
    int n_rewritten;
    int rewritten[S_MAX_ARGS];    /* indexes of the arguments that are paths under the run's directory */
    char ep_local[4800], ep_remote[4800]; /* kb-server --endpoint-file, on both sides */
    char ckpt_remote[4800];       /* trainer --ckpt-dir on its node */
    char ckpt_local[4800];        /* and on the launcher's node */
} s_step_t;

/* "'text'" for the shell; -1 when text holds a quote. */
static int s_quote(char *buf, size_t len, const char *text)
{
    return strchr(text, '\'') ? -1 : s_fmt(buf, len, "'%s'", text);
}

/* Plans step name (argv as the launcher built it) into st. Returns 0, or -1 after reporting. */
static int s_plan(s_step_t *st, const char *name, char *const argv[])
{
    memset(st, 0, sizeof *st);
    st->name = name;
    const int k = s_sl.k;
    if (strncmp(name, "kb-server", 9) == 0) {
        /* Member m of a replicated shard one node further on: a shard's members on different nodes. */
        const char *member = strstr(name, " member ");
        st->role = S_SERVER;
        st->node = (s_worker_index(name) + (member ? atoi(member + 8) : 0)) % k;
    } else if (strcmp(name, "trainer") == 0) {
        st->role = S_TRAINER;
        st->node = 0;
    } else {
        st->role = S_MAKER;
        st->node = k == 1 ? 0 : 1 + s_worker_index(name) % (k - 1);
    }
    /* A node Slurm has lost (`--no-kill` keeps the job): a maker, or a member of a replicated shard (its data
     * is on its shard's other members: it catches up from the primary), goes to the next node that runs; an
     * unreplicated kb-server's data is on its node, so it stays (and fails there), as does the trainer. */
    if (st->role == S_MAKER || (st->role == S_SERVER && strstr(name, " member "))) {
        bool lost[S_MAX_NODES];
        s_lost_nodes(lost);
        for (int j = 0; j < k && lost[st->node]; j++) {
            const int next = (st->node + 1) % k;
            fprintf(stderr, "carls-step: %s: node %s is lost (sinfo): placed on %s\n", name, s_sl.node[st->node],
                    s_sl.node[next]);
            st->node = next;
        }
    }
    st->cpus = 1;
    s_fmt(st->step_name, sizeof st->step_name, "carls-%d", (int)getpid());
    if (s_fmt(st->root, sizeof st->root, "%s/%s", s_sl.scratch, s_sl.node[st->node]) != 0) {
        fprintf(stderr, "carls-step: scratch path too long\n");
        return -1;
    }
    const size_t dl = strlen(s_sl.run_dir);
    int n = 0;
    for (; argv[n]; n++) {
        if (n >= S_MAX_ARGS) {
            fprintf(stderr, "carls-step: %s: too many arguments\n", name);
            return -1;
        }
        const char *a = argv[n];
        const char *prev = n > 0 ? argv[n - 1] : "";
        int rc = 0;
        if (strncmp(a, s_sl.run_dir, dl) == 0 && (a[dl] == '\0' || a[dl] == '/')) {
            rc = s_fmt(st->pool[n], sizeof st->pool[0], "%s%s", st->root, a + dl);
            st->rewritten[st->n_rewritten++] = n;
            if (strcmp(prev, "--endpoint-file") == 0) {
                s_fmt(st->ep_local, sizeof st->ep_local, "%s", a);
                s_fmt(st->ep_remote, sizeof st->ep_remote, "%s", st->pool[n]);
            }
            if (st->role == S_TRAINER && strcmp(prev, "--ckpt-dir") == 0) {
                s_fmt(st->ckpt_local, sizeof st->ckpt_local, "%s", a);
                s_fmt(st->ckpt_remote, sizeof st->ckpt_remote, "%s", st->pool[n]);
            }
        } else if (st->role == S_SERVER && (strcmp(prev, "--listen") == 0 || strcmp(prev, "--replication-listen") == 0) &&
                   strncmp(a, "tcp://", 6) == 0 && strrchr(a, ':') > a + 5) {
            /* The node's address when it is an IP address (what the others reach it at), else every interface. */
            struct in_addr ip;
            const char *bind = inet_pton(AF_INET, s_sl.addr[st->node], &ip) == 1 ? s_sl.addr[st->node] : "*";
            rc = s_fmt(st->pool[n], sizeof st->pool[0], "tcp://%s%s", bind, strrchr(a, ':'));
        } else {
            rc = s_fmt(st->pool[n], sizeof st->pool[0], "%s", a);
        }
        if (st->role == S_SERVER && strcmp(prev, "--threads") == 0) {
            st->cpus = atoi(a) < 1 ? 1 : atoi(a) > 256 ? 256 : atoi(a);
        }
        if (rc != 0 || strchr(a, '\'')) {
            fprintf(stderr, "carls-step: %s: argument '%s' is too long or holds a quote\n", name, a);
            return -1;
        }
        st->argv[n] = st->pool[n];
    }
    st->argv[n] = NULL;
    return 0;
}

/* Copies what st's rewritten arguments name and the launcher's node has when the process starts (a key file,
 * a directory of public keys) to the step's node, never readable by others on the way (umask 077, then the
 * file's own mode; tar keeps a directory's). The bank's data (--data) and checkpoint directories (--ckpt-dir)
 * are not inputs: the relays move those. Returns 0, or -1 after reporting. */
static int s_ship_inputs(const s_step_t *st, char *const argv[])
{
    for (int r = 0; r < st->n_rewritten; r++) {
        const int i = st->rewritten[r];
        struct stat sb;
        const char *prev = i > 0 ? argv[i - 1] : "";
        if (stat(argv[i], &sb) != 0 || strcmp(prev, "--data") == 0 || strcmp(prev, "--ckpt-dir") == 0 ||
            (!S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))) {
            continue;
        }
        char aux[512], cmd[12000], qlocal[4900], qremote[4900];
        s_aux(aux, sizeof aux, st->node);
        if (s_quote(qlocal, sizeof qlocal, argv[i]) != 0 || s_quote(qremote, sizeof qremote, st->pool[i]) != 0) {
            return -1;
        }
        int rc = S_ISREG(sb.st_mode)
                     ? s_fmt(cmd, sizeof cmd,
                             "%s sh -c 'umask 077 && mkdir -p \"$(dirname \"$1\")\" && cat > \"$1.carls-tmp\" && "
                             "chmod %o \"$1.carls-tmp\" && mv -f \"$1.carls-tmp\" \"$1\"' carls-ship %s < %s",
                             aux, (unsigned)(sb.st_mode & 0777), qremote, qlocal)
                     : s_fmt(cmd, sizeof cmd,
                             "tar -C %s -cf - . | %s sh -c 'umask 077 && mkdir -p \"$1\" && tar -C \"$1\" -xf -' "
                             "carls-ship %s",
                             qlocal, aux, qremote);
        char out[256];
        if (rc != 0 || s_capture(cmd, out, sizeof out) != 0) {
            fprintf(stderr, "carls-step: cannot copy %s to %s:%s\n", argv[i], s_sl.node[st->node], st->pool[i]);
            return -1;
        }
    }
    return 0;
}

/* ---- one step: the proxy ------------------------------------------------------------------------------------ */

static volatile sig_atomic_t s_stop_asked = 0, s_kill_asked = 0;

static void s_on_stop(int sig)
{
    if (sig == CARLS_PROC_KILL_SIGNAL) {
        s_kill_asked = 1; /* the launcher took the process for hung: SIGKILL to the step itself */
    }
    s_stop_asked = 1;
}

/* Starts srun for st; returns its pid, or -1. */
static pid_t s_start_srun(const s_step_t *st)
{
    static char args[S_MAX_ARGS + 32][4800];
    static char *av[S_MAX_ARGS + 40];
    int k = 0;
#define S_A(...) (s_fmt(args[k], sizeof args[0], __VA_ARGS__), av[k] = args[k], k++)
    S_A("srun");
    S_A("--jobid=%s", s_sl.job);
    S_A("--job-name=%s", st->step_name);
    S_A("--nodes=1");
    S_A("--ntasks=1");
    S_A("--cpus-per-task=%d", st->cpus);
    S_A("--nodelist=%s", s_sl.node[st->node]);
    S_A("--kill-on-bad-exit=1");
    bool cpu_device = false;
    for (int i = 1; st->argv[i]; i++) {
        cpu_device = cpu_device || (strcmp(st->argv[i - 1], "--device") == 0 && strcmp(st->argv[i], "cpu") == 0);
    }
    /* A GPU for maker i while the node has one for each of its fleet's makers up to i (fleets that run at
     * the same time share them: docs/SLURM.md). */
    const int per_node_rank = s_sl.k == 1 ? s_worker_index(st->name) : s_worker_index(st->name) / (s_sl.k - 1);
    if (st->role == S_MAKER && !cpu_device && per_node_rank < s_sl.gpus) {
        S_A("--gres=gpu:1");
    }
    for (int i = 0; i < s_sl.n_step_opt; i++) {
        S_A("%s", s_sl.step_opt[i]);
    }
    S_A("/bin/sh");
    S_A("-c");
    S_A("while [ \"$1\" != -- ]; do mkdir -p \"$1\" || exit 126; shift; done; shift; "
        "echo \"carls-step $SLURM_JOB_ID.$SLURM_STEP_ID on $SLURMD_NODENAME: $1\" >&2; exec \"$@\"");
    S_A("carls-step");
    S_A("%s", st->root);
    for (int r = 0; r < st->n_rewritten; r++) {
        /* The directory each path lives in (the path itself may be a directory the program makes). */
        char dir[4800];
        s_fmt(dir, sizeof dir, "%s", st->pool[st->rewritten[r]]);
        char *slash = strrchr(dir, '/');
        if (slash && slash > dir) {
            *slash = '\0';
            S_A("%s", dir);
        }
    }
    S_A("--");
    for (int i = 0; st->argv[i]; i++) {
        if (k >= S_MAX_ARGS + 38) {
            fprintf(stderr, "carls-step: too many arguments\n");
            return -1;
        }
        S_A("%s", st->argv[i]);
    }
#undef S_A
    av[k] = NULL;
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "carls-step: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0); /* a terminal's Ctrl-C reaches the launcher, which stops the run in order */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) {
            _exit(1);
        }
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        execvp("srun", av);
        fprintf(stderr, "carls-step: cannot run srun: %s\n", strerror(errno));
        _exit(127);
    }
    return pid;
}

/* The step's id (JOB.STEP) from squeue, by its name; "" while Slurm does not list it. */
static void s_step_id(const s_step_t *st, char *out, size_t outlen)
{
    char cmd[256], lines[16384];
    out[0] = '\0';
    s_fmt(cmd, sizeof cmd, "squeue -h -s -j %s -o '%%i %%j' 2>/dev/null", s_sl.job);
    if (s_capture(cmd, lines, sizeof lines) != 0) {
        return;
    }
    for (char *save = NULL, *tok = strtok_r(lines, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        char id[64], nm[128];
        if (sscanf(tok, "%63s %127s", id, nm) == 2 && strcmp(nm, st->step_name) == 0) {
            s_fmt(out, outlen, "%s", id);
            return;
        }
    }
}

/* Appends the step to runs/<name>/steps.tsv: process name, node, step id, program. */
static void s_record_step(const char *name, const s_step_t *st, const char *id)
{
    char path[4400], line[6000];
    if (s_fmt(path, sizeof path, "%s/steps.tsv", s_sl.run_dir) != 0 ||
        s_fmt(line, sizeof line, "%s\t%s\t%s\t%s\n", name, s_sl.node[st->node], id, st->argv[0]) != 0) {
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, line, strlen(line));
        (void)w;
        close(fd);
    }
}

/* Reads the endpoint the server wrote on its node; once there, writes it with the node's address to the
 * launcher's endpoint file. Returns true when done. */
static bool s_relay_endpoint(const s_step_t *st)
{
    char aux[512], cmd[6000], q[4900], ep[1024];
    s_aux(aux, sizeof aux, st->node);
    if (s_quote(q, sizeof q, st->ep_remote) != 0 || s_fmt(cmd, sizeof cmd, "%s cat %s 2>/dev/null", aux, q) != 0) {
        return false;
    }
    if (s_capture(cmd, ep, sizeof ep) != 0 || strncmp(ep, "tcp://", 6) != 0 || !strrchr(ep + 6, ':')) {
        return false;
    }
    char line[1400];
    s_fmt(line, sizeof line, "tcp://%s%s\n", s_sl.addr[st->node], strrchr(ep + 6, ':'));
    char err[512];
    if (carls_write_file_atomic(st->ep_local, line, strlen(line), 0644, 0, err, sizeof err) != 0) {
        fprintf(stderr, "carls-step: %s\n", err);
        return false;
    }
    return true;
}

/* Removes the endpoint file a previous server left on the node, so a stale one is never relayed. */
static void s_clear_endpoint(const s_step_t *st)
{
    char aux[512], cmd[6000], q[4900], out[256];
    s_aux(aux, sizeof aux, st->node);
    if (s_quote(q, sizeof q, st->ep_remote) == 0 && s_fmt(cmd, sizeof cmd, "%s rm -f %s", aux, q) == 0) {
        s_capture(cmd, out, sizeof out);
    }
}

/* Unpacks a tar of checkpoint files from stdin into the directory d (set by what precedes it) the way a
 * maker may watch it: into d/.relay first, then renamed in one by one, `latest` last and only when the file it
 * names is there (else exit 3: the trainer deleted it before tar read it; the next checkpoint will do). With
 * prune = 1 ($1) only the newest 3 checkpoints and the one `latest` names are kept. */
#define S_UNPACK_SH                                                                                            \
    "s=\"$d/.relay\"; rm -rf \"$s\" && mkdir -p \"$s\" && tar -C \"$s\" -xf - || exit 1; "                     \
    "for f in \"$s\"/*; do [ -e \"$f\" ] || continue; [ \"${f##*/}\" = latest ] || mv -f \"$f\" \"$d/\"; done; " \
    "n=$(cat \"$s/latest\" 2>/dev/null); "                                                                     \
    "if [ -n \"$n\" ] && [ -e \"$d/$n\" ]; then mv -f \"$s/latest\" \"$d/latest\"; else rm -rf \"$s\"; exit 3; fi; " \
    "rm -rf \"$s\"; "                                                                                          \
    "[ \"$1\" = 1 ] && ls \"$d\" | grep '^ckpt-.*\\.ckpt$' | sort | head -n -3 | "                              \
    "while read f; do [ \"$f\" = \"$n\" ] || rm -f \"$d/$f\"; done; exit 0"

/* The trainer's checkpoint directory to the launcher's node (runs/<name>/ckpt, every checkpoint kept) and to
 * the same directory on every other node of the job, when its `latest` (seen by the watcher; NULL: look
 * again) differs from the last one relayed (kept in last, len bytes). */
static void s_relay_checkpoints(const s_step_t *st, const char *seen, char *last, size_t len)
{
    if (seen && strcmp(seen, last) == 0) {
        return;
    }
    char aux[512], cmd[16000], qr[4900], ql[4900], qt[5000], tarfile[4900], out[1024];
    s_aux(aux, sizeof aux, st->node);
    s_fmt(tarfile, sizeof tarfile, "%s.relay.tar", st->ckpt_local);
    if (s_quote(qr, sizeof qr, st->ckpt_remote) != 0 || s_quote(ql, sizeof ql, st->ckpt_local) != 0 ||
        s_quote(qt, sizeof qt, tarfile) != 0) {
        return;
    }
    /* The trainer's directory as it is now, into the launcher's copy. */
    s_fmt(cmd, sizeof cmd,
          "%s tar -C %s --exclude='*.tmp*' --ignore-failed-read -cf - . > %s 2>/dev/null && mkdir -p %s && "
          "sh -c 'd=\"$2\"; " S_UNPACK_SH "' carls-relay 0 %s < %s",
          aux, qr, qt, ql, ql, qt);
    char latest[1024], path[4900];
    s_fmt(path, sizeof path, "%s/latest", st->ckpt_local);
    if (s_capture(cmd, out, sizeof out) != 0 || carls_read_first_line(path, latest, sizeof latest) != 0 ||
        strcmp(latest, last) == 0) {
        unlink(tarfile);
        return;
    }
    /* The same files to every other node that runs (a lost one would hold the copy up). */
    char others[S_MAX_NODES * 130] = "";
    int n_others = 0;
    bool lost[S_MAX_NODES];
    s_lost_nodes(lost);
    for (int i = 0; i < s_sl.k; i++) {
        if (i != st->node && !lost[i]) {
            size_t l = strlen(others);
            s_fmt(others + l, sizeof others - l, "%s%s", n_others ? "," : "", s_sl.node[i]);
            n_others++;
        }
    }
    int rc = 0;
    if (n_others) {
        char qscratch[4500], qrel[4900];
        s_quote(qscratch, sizeof qscratch, s_sl.scratch);
        s_quote(qrel, sizeof qrel, st->ckpt_remote + strlen(st->root)); /* "/ckpt" */
        s_fmt(cmd, sizeof cmd,
              "srun --jobid=%s --overlap --nodes=%d --ntasks=%d --ntasks-per-node=1 --nodelist=%s --job-name=carls-aux --quiet "
              "--input=all sh -c 'd=\"$2/$SLURMD_NODENAME$3\"; mkdir -p \"$d\" && " S_UNPACK_SH
              "' carls-relay 1 %s %s < %s",
              s_sl.job, n_others, n_others, others, qscratch, qrel, qt);
        rc = s_capture(cmd, out, sizeof out);
        if (rc != 0) {
            fprintf(stderr, "carls-step: copying checkpoint %s to %s failed (status %d); trying with the next one\n",
                    latest, others, rc);
        }
    }
    unlink(tarfile);
    if (rc == 0) {
        s_fmt(last, len, "%s", latest);
    }
}

/* Starts a step on the trainer's node that prints the text of its checkpoint directory's `latest` each time
 * it changes (one srun for the whole run, rather than one per look). Returns srun's pid with the read end of
 * its stdout (non-blocking) in *fd, or -1. */
static pid_t s_start_watcher(const s_step_t *st, int *fd)
{
    char aux[512], cmd[12000], qr[4900];
    s_aux(aux, sizeof aux, st->node);
    if (s_quote(qr, sizeof qr, st->ckpt_remote) != 0 ||
        s_fmt(cmd, sizeof cmd,
              "exec %s sh -c 'l=; while :; do n=$(cat \"$1/latest\" 2>/dev/null); "
              "if [ -n \"$n\" ] && [ \"$n\" != \"$l\" ]; then echo \"$n\"; l=$n; fi; sleep 0.5; done' carls-watch %s",
              aux, qr) != 0) {
        return -1;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        return -1;
    }
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) {
            _exit(1);
        }
        dup2(p[1], 1);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    *fd = p[0];
    return pid;
}

/* Reads what the watcher printed; the last whole line (a new `latest`) goes to out. Returns true when there
 * was one. buf (len bytes, used bytes in *used) keeps a partial line. */
static bool s_watch_read(int fd, char *buf, size_t len, size_t *used, char *out, size_t outlen)
{
    bool got = false;
    for (;;) {
        ssize_t n = read(fd, buf + *used, len - 1 - *used);
        if (n <= 0) {
            break;
        }
        *used += (size_t)n;
        buf[*used] = '\0';
        char *nl;
        while ((nl = strchr(buf, '\n')) != NULL) {
            *nl = '\0';
            if (*buf) {
                s_fmt(out, outlen, "%s", buf);
                got = true;
            }
            size_t rest = *used - (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, rest);
            *used = rest;
            buf[*used] = '\0';
        }
        if (*used >= len - 1) {
            *used = 0; /* a line longer than any pointer: drop it */
        }
    }
    return got;
}

/* The files the trainer wrote under the run's directory, back to the launcher's node. */
static void s_fetch_outputs(const s_step_t *st, char *const argv[])
{
    char aux[512], cmd[40000], q[4900], out[1024];
    s_aux(aux, sizeof aux, st->node);
    char qd[4900], qroot[4700];
    if (s_quote(qd, sizeof qd, s_sl.run_dir) != 0 || s_quote(qroot, sizeof qroot, st->root) != 0) {
        return;
    }
    size_t n = (size_t)snprintf(cmd, sizeof cmd, "%s tar -C %s --ignore-failed-read -cf -", aux, qroot);
    for (int r = 0; r < st->n_rewritten && n < sizeof cmd; r++) {
        const char *rel = argv[st->rewritten[r]] + strlen(s_sl.run_dir) + 1;
        if (s_quote(q, sizeof q, *rel ? rel : ".") == 0) {
            n += (size_t)snprintf(cmd + n, sizeof cmd - n, " %s", q);
        }
    }
    if (n < sizeof cmd) {
        snprintf(cmd + n, sizeof cmd - n, " 2>/dev/null | tar -C %s -xf -", qd);
    }
    if (n >= sizeof cmd) {
        fprintf(stderr, "carls-step: copying the trainer's files back from %s: too many paths\n", s_sl.node[st->node]);
        return;
    }
    /* A step can fail to start on a busy controller; the copy is asked again before the files are given up. */
    for (int attempt = 0; attempt < 3; attempt++) {
        if (s_capture(cmd, out, sizeof out) == 0) {
            return;
        }
        usleep(500 * 1000);
    }
    fprintf(stderr, "carls-step: copying the trainer's files back from %s failed (3 tries)\n", s_sl.node[st->node]);
}

/* Ends this proxy as the step ended: the same signal for 129..192 (what srun reports for a killed task), else
 * the same code. */
static void s_exit_as(int code)
{
    if (code > 128 && code <= 128 + 64) {
        int sig = code - 128;
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
    }
    _exit(code);
}

/* The runner (carls_proc.h): runs process name (argv) as a job step and relays what must travel. */
static void s_run_step(void *ctx, const char *name, char *const argv[])
{
    (void)ctx;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(CARLS_PROC_KILL_SIGNAL, &sa, NULL);
    signal(SIGINT, SIG_IGN);
    /* A launcher that dies (SIGKILL) takes its steps with it, politely, rather than leave them running in an
     * allocation that outlives it (an interactive salloc shell). */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1) {
        _exit(1);
    }
    static s_step_t st;
    if (s_plan(&st, name, argv) != 0 || s_ship_inputs(&st, argv) != 0) {
        _exit(126);
    }
    if (st.role == S_SERVER && *st.ep_remote) {
        s_clear_endpoint(&st);
    }
    pid_t srun = s_start_srun(&st);
    if (srun < 0) {
        _exit(126);
    }
    bool ep_done = st.role != S_SERVER || !*st.ep_local, asked = false;
    char id[64] = "", last_latest[1024] = "";
    int64_t started = carls_monotonic_ms();
    int watch_fd = -1;
    pid_t watcher = st.role == S_TRAINER && *st.ckpt_remote ? s_start_watcher(&st, &watch_fd) : -1;
    char watch_buf[2048], seen[1024];
    size_t watch_used = 0;
    int status = 0;
    int64_t next_node_check = carls_monotonic_ms() + 2000;
    bool node_lost = false;
    for (;;) {
        pid_t r = waitpid(srun, &status, WNOHANG);
        if (r == srun || (r < 0 && errno != EINTR)) {
            break;
        }
        /* srun itself notices a dead node only after SlurmdTimeout and then some (75 s with 60 s); Slurm marks
         * it not responding sooner ('*' in sinfo): the step is then lost, and the launcher may restart it on
         * another node. */
        if (!asked && carls_monotonic_ms() >= next_node_check) {
            next_node_check = carls_monotonic_ms() + 2000;
            bool lost[S_MAX_NODES];
            s_lost_nodes(lost);
            if (lost[st.node]) {
                fprintf(stderr, "carls-step: node %s stopped responding (sinfo): %s is lost\n", s_sl.node[st.node],
                        name);
                node_lost = true;
                kill(srun, SIGKILL);
                waitpid(srun, &status, 0);
                break;
            }
        }
        if (!*id && carls_monotonic_ms() - started > 300) {
            s_step_id(&st, id, sizeof id);
            if (*id) {
                s_record_step(name, &st, id);
            }
        }
        if (s_stop_asked && !asked) {
            asked = true;
            if (!*id) {
                s_step_id(&st, id, sizeof id);
            }
            /* scancel signals the step's processes even when it then reports "Invalid job id" (Slurm 22.05),
             * so its status is not looked at; a step that does not stop is ended by SIGKILL to this proxy. */
            char cmd[256], out[256];
            if (*id && s_fmt(cmd, sizeof cmd, "scancel --quiet --signal=%s %s 2>/dev/null",
                             s_kill_asked ? "KILL" : "TERM", id) == 0) {
                s_capture(cmd, out, sizeof out);
            } else {
                kill(srun, SIGTERM); /* no step yet: srun ends what there is */
            }
        }
        if (!ep_done && !asked) {
            ep_done = s_relay_endpoint(&st);
        }
        if (watcher > 0 && !asked && s_watch_read(watch_fd, watch_buf, sizeof watch_buf, &watch_used, seen, sizeof seen)) {
            s_relay_checkpoints(&st, seen, last_latest, sizeof last_latest);
        }
        usleep(100 * 1000);
    }
    if (watcher > 0) {
        kill(watcher, SIGTERM);
        waitpid(watcher, NULL, 0);
        close(watch_fd);
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    if (node_lost) {
        s_exit_as(128 + SIGKILL); /* seen by the launcher as a process killed with its node */
    }
    const bool alive = s_job_alive();
    if (st.role == S_TRAINER && alive) {
        if (*st.ckpt_remote) {
            s_relay_checkpoints(&st, NULL, last_latest, sizeof last_latest); /* the last one, however fast it came */
        }
        s_fetch_outputs(&st, argv);
    }
    if (code != 0 && !s_stop_asked && !alive) {
        fprintf(stderr, "carls-step: Slurm job %s is no longer running (cancelled or out of time): stopping the "
                        "launcher\n", s_sl.job);
        kill(getppid(), SIGTERM);
    }
    s_exit_as(code);
}

/* ---- begin / end ----------------------------------------------------------------------------------------------- */

int carls_slurm_begin(const char *run_dir, const char *name)
{
    if (!s_sl.on) {
        return 0;
    }
    if (s_discover() != 0) {
        return -1;
    }
    if (s_fmt(s_sl.run_dir, sizeof s_sl.run_dir, "%s", run_dir) != 0 || strchr(run_dir, '\'') || strchr(name, '\'') ||
        s_fmt(s_sl.scratch, sizeof s_sl.scratch, "%s/carls-%s-%s", s_sl.scratch_root, s_sl.job, name) != 0) {
        fprintf(stderr, "carls: --slurm: the run's directory '%s' is too long or holds a quote\n", run_dir);
        return -1;
    }
    const int k = s_sl.k;
    printf("[carls] slurm job %s on %d node%s:", s_sl.job, k, k == 1 ? "" : "s");
    for (int i = 0; i < k; i++) {
        printf(" %s (%s)", s_sl.node[i], s_sl.addr[i]);
    }
    printf("; bank shard I on node I mod %d, trainer on %s, makers on ", k, s_sl.node[0]);
    for (int i = k == 1 ? 0 : 1; i < k; i++) {
        printf("%s%s", s_sl.node[i], i + 1 < k ? "," : "");
    }
    if (s_sl.gpus) {
        printf(" (a GPU each, up to %d per node)", s_sl.gpus);
    }
    printf("; node-local files in %s/<node>; steps listed in %s/steps.tsv\n", s_sl.scratch, s_sl.run_dir);
    fflush(stdout);
    carls_proc_runner_t runner = {.run = s_run_step, .ctx = NULL};
    carls_proc_set_runner(&runner);
    return 0;
}

void carls_slurm_end(void)
{
    if (s_sl.on) {
        carls_proc_set_runner(NULL);
    }
}
