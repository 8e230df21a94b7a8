#include "kb_term.h"

#include "files.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAGIC "carls-replication"

static const char *const s_roles[] = {"primary", "follower", "standby"};

const char *kb_term_role_name(kb_term_role_t role)
{
    return (unsigned)role < sizeof s_roles / sizeof s_roles[0] ? s_roles[role] : "unknown";
}

/* A new lineage id: random, never 0. */
static uint64_t s_new_lineage(void)
{
    uint64_t id = 0;
    while (id == 0) {
        if (carls_random_bytes(&id, sizeof id) != 0)
            id = (uint64_t)carls_wall_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    }
    return id;
}

void kb_term_init(kb_term_state_t *st, const char *member, uint64_t first_epoch)
{
    memset(st, 0, sizeof *st);
    st->lineage = s_new_lineage();
    st->term = 1;
    st->role = KB_TERM_PRIMARY;
    snprintf(st->member, sizeof st->member, "%s", member ? member : "");
    st->n_history = 1;
    st->history[0] = (kb_term_span_t){1, first_epoch};
}

/* The rules a state keeps, whether it was read or is about to be written; err says which one failed. */
static int s_check(const kb_term_state_t *st, char *err, size_t errlen)
{
    if (st->term == 0)
        return carls_errorf(err, errlen, -EINVAL, "term 0 (terms start at 1)");
    if ((unsigned)st->role > KB_TERM_STANDBY)
        return carls_errorf(err, errlen, -EINVAL, "role %d is not primary, follower or standby", (int)st->role);
    if (st->member[0] == '\0' || strpbrk(st->member, " \t\r\n"))
        return carls_errorf(err, errlen, -EINVAL, "member name '%s' is empty or holds blanks", st->member);
    if (st->n_history == 0 || st->n_history > KB_TERM_MAX_HISTORY)
        return carls_errorf(err, errlen, -EINVAL, "%zu history entries (1..%u)", st->n_history, KB_TERM_MAX_HISTORY);
    for (size_t i = 1; i < st->n_history; i++) {
        const kb_term_span_t *a = &st->history[i - 1], *b = &st->history[i];
        if (b->term <= a->term || b->first_epoch <= a->first_epoch)
            return carls_errorf(err, errlen, -EINVAL,
                                "history entry %zu (term %" PRIu64 " from epoch %" PRIu64 ") does not follow term "
                                "%" PRIu64 " from epoch %" PRIu64 ": both must grow",
                                i + 1, b->term, b->first_epoch, a->term, a->first_epoch);
    }
    if (st->history[st->n_history - 1].term > st->term)
        return carls_errorf(err, errlen, -EINVAL, "history has term %" PRIu64 " beyond the current term %" PRIu64,
                            st->history[st->n_history - 1].term, st->term);
    return 0;
}

static void s_path(const char *data_dir, char *path, size_t len) { snprintf(path, len, "%s/%s", data_dir, KB_TERM_FILE); }

int kb_term_save(const char *data_dir, const kb_term_state_t *st, char *err, size_t errlen)
{
    char path[4096], why[300];
    s_path(data_dir, path, sizeof path);
    if (s_check(st, why, sizeof why) != 0)
        return carls_errorf(err, errlen, -EINVAL, "%s: not written: %s", path, why);
    size_t cap = 512 + st->n_history * 48;
    char *text = carls_xmalloc(cap);
    size_t n = (size_t)snprintf(text, cap, "%s %u\nterm %" PRIu64 "\nrole %s\nmember %s\n", S_MAGIC,
                                KB_TERM_VERSION, st->term, kb_term_role_name(st->role), st->member);
    if (st->lineage)
        n += (size_t)snprintf(text + n, cap - n, "lineage %016" PRIx64 "\n", st->lineage);
    for (size_t i = 0; i < st->n_history; i++)
        n += (size_t)snprintf(text + n, cap - n, "history %" PRIu64 " %" PRIu64 "\n", st->history[i].term,
                              st->history[i].first_epoch);
    n += (size_t)snprintf(text + n, cap - n, "crc %08" PRIx32 "\n", carls_crc32(0, text, n));
    int rc = carls_write_file_atomic(path, text, n, 0644, 0, why, sizeof why);
    free(text);
    if (rc != 0)
        return carls_errorf(err, errlen, -EIO, "%s", why);
    return 0;
}

/* Parses one "KEY VALUE..." line of the file (line numbered no, NUL-terminated, without its newline). */
static int s_parse_line(const char *path, int no, char *line, kb_term_state_t *st, bool *have, char *err,
                        size_t errlen)
{
    char *rest = strchr(line, ' ');
    if (!rest)
        return carls_errorf(err, errlen, -EINVAL, "%s:%d: '%s' is not 'KEY VALUE'", path, no, line);
    *rest++ = '\0';
    if (strcmp(line, "term") == 0) {
        if (carls_parse_u64(rest, &st->term) != 0)
            return carls_errorf(err, errlen, -EINVAL, "%s:%d: term '%s' is not a number", path, no, rest);
        have[0] = true;
    } else if (strcmp(line, "role") == 0) {
        size_t r = 0;
        while (r < 3 && strcmp(rest, s_roles[r]) != 0)
            r++;
        if (r == 3)
            return carls_errorf(err, errlen, -EINVAL, "%s:%d: role '%s' is not primary, follower or standby", path,
                                no, rest);
        st->role = (kb_term_role_t)r;
        have[1] = true;
    } else if (strcmp(line, "member") == 0) {
        if (strlen(rest) > KB_TERM_MAX_MEMBER)
            return carls_errorf(err, errlen, -EINVAL, "%s:%d: member name longer than %u bytes", path, no,
                                KB_TERM_MAX_MEMBER);
        snprintf(st->member, sizeof st->member, "%s", rest);
        have[2] = true;
    } else if (strcmp(line, "lineage") == 0) {
        char *end = NULL;
        errno = 0;
        st->lineage = strtoull(rest, &end, 16);
        if (errno || end == rest || *end || strlen(rest) != 16 || st->lineage == 0)
            return carls_errorf(err, errlen, -EINVAL, "%s:%d: lineage '%s' is not 16 hex digits (nonzero)", path,
                                no, rest);
    } else if (strcmp(line, "history") == 0) {
        char *epoch = strchr(rest, ' ');
        kb_term_span_t span;
        if (epoch)
            *epoch++ = '\0';
        if (!epoch || carls_parse_u64(rest, &span.term) != 0 || carls_parse_u64(epoch, &span.first_epoch) != 0)
            return carls_errorf(err, errlen, -EINVAL, "%s:%d: history needs 'TERM FIRST_EPOCH'", path, no);
        if (st->n_history == KB_TERM_MAX_HISTORY)
            return carls_errorf(err, errlen, -EINVAL, "%s:%d: more than %u history entries", path, no,
                                KB_TERM_MAX_HISTORY);
        st->history[st->n_history++] = span;
    } else {
        return carls_errorf(err, errlen, -EINVAL, "%s:%d: unknown key '%s'", path, no, line);
    }
    return 0;
}

int kb_term_load(const char *data_dir, kb_term_state_t *st, char *err, size_t errlen)
{
    char path[4096];
    s_path(data_dir, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? carls_errorf(err, errlen, -ENOENT, "%s: no such file", path)
                               : carls_errorf(err, errlen, -EIO, "%s: %s", path, strerror(errno));
    char *text = carls_xmalloc(KB_TERM_MAX_FILE_BYTES + 1);
    size_t n = fread(text, 1, KB_TERM_MAX_FILE_BYTES + 1, f);
    int read_failed = ferror(f);
    fclose(f);
    int rc = 0;
    if (read_failed)
        rc = carls_errorf(err, errlen, -EIO, "%s: read failed", path);
    else if (n > KB_TERM_MAX_FILE_BYTES)
        rc = carls_errorf(err, errlen, -EINVAL, "%s: larger than %u bytes", path, KB_TERM_MAX_FILE_BYTES);
    else if (memchr(text, '\0', n))
        rc = carls_errorf(err, errlen, -EINVAL, "%s: holds a NUL byte: not a replication state file", path);
    text[n < KB_TERM_MAX_FILE_BYTES ? n : KB_TERM_MAX_FILE_BYTES] = '\0';
    /* The checksum covers every byte before the last line, which must be "crc XXXXXXXX\n". */
    char *crc_line = NULL;
    if (rc == 0) {
        crc_line = n >= 13 && text[n - 1] == '\n' ? text + n - 13 : NULL;
        uint32_t want = 0;
        char hex[9] = "";
        if (crc_line && crc_line > text && crc_line[-1] != '\n')
            crc_line = NULL;
        if (crc_line && sscanf(crc_line, "crc %8[0-9a-f]", hex) == 1 && strlen(hex) == 8)
            want = (uint32_t)strtoul(hex, NULL, 16);
        else
            rc = carls_errorf(err, errlen, -EINVAL, "%s: does not end with its 'crc' line (truncated?)", path);
        if (rc == 0 && carls_crc32(0, text, (size_t)(crc_line - text)) != want)
            rc = carls_errorf(err, errlen, -EINVAL, "%s: CRC-32 mismatch (the file was changed or damaged)", path);
    }
    kb_term_state_t *tmp = rc == 0 ? carls_xcalloc(1, sizeof *tmp) : NULL;
    bool have[3] = {false, false, false};
    int no = 0;
    char *save = NULL;
    if (rc == 0)
        *crc_line = '\0';
    for (char *line = rc == 0 ? strtok_r(text, "\n", &save) : NULL; line && rc == 0;
         line = strtok_r(NULL, "\n", &save)) {
        no++;
        if (no == 1) {
            unsigned version = 0;
            char tail;
            if (sscanf(line, S_MAGIC " %u%c", &version, &tail) != 1)
                rc = carls_errorf(err, errlen, -EINVAL, "%s:1: not a replication state file ('%s')", path, line);
            else if (version != KB_TERM_VERSION)
                rc = carls_errorf(err, errlen, -EINVAL, "%s:1: format version %u; this build reads %u", path,
                                  version, KB_TERM_VERSION);
            continue;
        }
        rc = s_parse_line(path, no, line, tmp, have, err, errlen);
    }
    if (rc == 0 && (!have[0] || !have[1] || !have[2] || tmp->n_history == 0))
        rc = carls_errorf(err, errlen, -EINVAL, "%s: needs term, role, member and a history line", path);
    char why[300];
    if (rc == 0 && s_check(tmp, why, sizeof why) != 0)
        rc = carls_errorf(err, errlen, -EINVAL, "%s: %s", path, why);
    if (rc == 0)
        *st = *tmp;
    free(tmp);
    free(text);
    return rc;
}

int kb_term_begin(kb_term_state_t *st, uint64_t term, uint64_t first_epoch)
{
    if (term <= st->term || st->n_history == 0)
        return -EINVAL;
    kb_term_span_t *last = &st->history[st->n_history - 1];
    if (first_epoch < last->first_epoch)
        return -EINVAL;
    if (first_epoch == last->first_epoch) {
        last->term = term; /* the last term wrote nothing: its span is empty */
    } else {
        if (st->n_history == KB_TERM_MAX_HISTORY)
            return -EINVAL;
        st->history[st->n_history++] = (kb_term_span_t){term, first_epoch};
    }
    st->term = term;
    return 0;
}

int kb_term_record(kb_term_state_t *st, uint64_t term, uint64_t epoch)
{
    if (st->n_history == 0)
        return -EINVAL;
    kb_term_span_t *last = &st->history[st->n_history - 1];
    if (term == last->term)
        return epoch >= last->first_epoch ? 0 : -EINVAL;
    if (term < last->term || epoch < last->first_epoch)
        return -EINVAL;
    if (epoch == last->first_epoch)
        last->term = term;
    else if (st->n_history == KB_TERM_MAX_HISTORY)
        return -EINVAL;
    else
        st->history[st->n_history++] = (kb_term_span_t){term, epoch};
    if (term > st->term)
        st->term = term;
    return 0;
}

uint64_t kb_term_of_epoch(const kb_term_state_t *st, uint64_t epoch)
{
    uint64_t term = 0;
    for (size_t i = 0; i < st->n_history && st->history[i].first_epoch <= epoch; i++)
        term = st->history[i].term;
    return term;
}

bool kb_term_diverged(const kb_term_state_t *mine, uint64_t last_epoch, const kb_term_state_t *primary)
{
    if (last_epoch == 0)
        return false;
    return kb_term_of_epoch(mine, last_epoch) != kb_term_of_epoch(primary, last_epoch);
}
