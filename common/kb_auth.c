/* CURVE keys, allow-lists, the ZAP handler and socket set-up for kb-server. The formats and the contract
 * are described in kb_auth.h; docs/SECURITY.md is the operator's guide.
 *
 * ZAP 1.0 (RFC 27) as libzmq speaks it: when a CURVE client has proved it holds the secret key of the
 * public key it presents, the server socket's session sends a request to "inproc://zeromq.zap.01" in its
 * context, as an envelope (empty delimiter) followed by
 *     version "1.0" | request id | domain | peer address | routing id | mechanism | credentials...
 * where CURVE has exactly one credentials frame, the client's 32-byte public key. The handler answers
 *     version "1.0" | request id | status code | status text | user id | metadata
 * and libzmq lets the connection deliver messages only on status "200". A REP socket strips and restores
 * the envelope for us. */
#include "kb_auth.h"

#include "log.h"
#include "util.h"

#include <zmq.h>

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S_ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define S_ZAP_MAX_FRAMES 8      /* CURVE requests have 7; more is malformed, and extra frames are drained */
#define S_POLL_MS 100           /* how often the handler thread looks at its stop flag */
#define S_MAX_LINE 1024         /* longest line accepted in a key or allow-list file */
#define S_DENIED_LOG_FIRST 20   /* log every refusal up to this many, then one in S_DENIED_LOG_EVERY, so a */
#define S_DENIED_LOG_EVERY 1000 /* client hammering the port cannot flood the log */

/* ZMQ_ZAP_ENFORCE_DOMAIN is a draft option of libzmq 4.3 (hidden from zmq.h unless ZMQ_BUILD_DRAFT_API).
 * With it set, a CURVE server refuses clients when no ZAP handler answers instead of admitting all of them.
 * The number is fixed in libzmq; a library without the option answers EINVAL and we rely on the handler
 * being started first (kb_auth_setup_server insists on it). */
#ifdef ZMQ_ZAP_ENFORCE_DOMAIN
#define S_ZAP_ENFORCE_DOMAIN ZMQ_ZAP_ENFORCE_DOMAIN
#else
#define S_ZAP_ENFORCE_DOMAIN 93
#endif

/* The Z85 digits (ZeroMQ RFC 32), value 0 first. */
static const char s_z85_digits[] = "0123456789abcdefghijklmnopqrstuvwxyz"
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* KB_AUTH_EZMQ with a message unless this libzmq can do CURVE (it needs libsodium or its own tweetnacl). */
static int s_require_curve(char *err, size_t errlen)
{
    if (!zmq_has("curve"))
        return carls_errorf(err, errlen, KB_AUTH_EZMQ, "this libzmq was built without CURVE support");
    return KB_AUTH_OK;
}

/* ---- Z85 --------------------------------------------------------------------------------------------- */

/* Value of one Z85 digit, or -1 for a character outside the alphabet (NUL included). */
static int s_z85_value(char c)
{
    if (c == '\0')
        return -1;
    const char *p = strchr(s_z85_digits, c);
    return p ? (int)(p - s_z85_digits) : -1;
}

int kb_auth_key_from_z85(const char *text, size_t len, kb_auth_key_t *out, char *err, size_t errlen)
{
    assert(text && out);
    if (len != KB_AUTH_Z85_LEN)
        return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "key is %zu characters long, expected %d (Z85 of 32 bytes)",
                      len, KB_AUTH_Z85_LEN);
    /* Checked here rather than left to zmq_z85_decode so the message can say what is wrong, and because
     * older libzmq versions decode an out-of-range group without complaint. */
    for (size_t group = 0; group < KB_AUTH_Z85_LEN; group += 5) {
        uint64_t value = 0;
        for (size_t i = group; i < group + 5; i++) {
            int digit = s_z85_value(text[i]);
            if (digit < 0)
                return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "key is not Z85: character %zu ('%c') is not a Z85 digit",
                              i + 1, (text[i] >= 0x20 && text[i] < 0x7f) ? text[i] : '?');
            value = value * 85 + (uint64_t)digit;
        }
        if (value > UINT32_MAX)
            return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "key is not Z85: characters %zu-%zu encode more than 32 bits",
                          group + 1, group + 5);
    }
    char z85[KB_AUTH_Z85_LEN + 1];
    memcpy(z85, text, KB_AUTH_Z85_LEN);
    z85[KB_AUTH_Z85_LEN] = '\0';
    uint8_t *decoded = zmq_z85_decode(out->bytes, z85);
    explicit_bzero(z85, sizeof z85); /* the text may be a secret key */
    if (!decoded)
        return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "key is not Z85 (libzmq refused to decode it)");
    return KB_AUTH_OK;
}

void kb_auth_key_to_z85(const kb_auth_key_t *key, char out[KB_AUTH_Z85_LEN + 1])
{
    assert(key && out);
    char *encoded = zmq_z85_encode(out, key->bytes, KB_AUTH_KEY_BYTES);
    assert(encoded); /* fails only for a length that is not a multiple of 4 */
    (void)encoded;
}

/* ---- key generation and files ------------------------------------------------------------------------ */

int kb_auth_keypair_generate(kb_auth_keypair_t *out, char *err, size_t errlen)
{
    assert(out);
    int rc = s_require_curve(err, errlen);
    if (rc != KB_AUTH_OK)
        return rc;
    char public_z85[KB_AUTH_Z85_LEN + 1], secret_z85[KB_AUTH_Z85_LEN + 1];
    if (zmq_curve_keypair(public_z85, secret_z85) != 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EZMQ, "zmq_curve_keypair failed: %s", zmq_strerror(errno));
        goto cleanup;
    }
    rc = kb_auth_key_from_z85(public_z85, KB_AUTH_Z85_LEN, &out->public_key, err, errlen);
    if (rc == KB_AUTH_OK)
        rc = kb_auth_key_from_z85(secret_z85, KB_AUTH_Z85_LEN, &out->secret_key, err, errlen);
cleanup:
    explicit_bzero(secret_z85, sizeof secret_z85);
    return rc;
}

/* Writes len bytes of data to path with exactly `mode` (umask does not apply): a temporary file beside it
 * is written, fsynced and then linked to path (refusing an existing path) or renamed over it (overwrite),
 * and the directory is fsynced, so path is either absent/old or complete. */
static int s_write_file(const char *path, const char *data, size_t len, mode_t mode, bool overwrite, char *err,
                        size_t errlen)
{
    int rc = KB_AUTH_OK;
    int fd = -1;
    size_t tmp_len = strlen(path) + sizeof ".tmp.XXXXXX";
    char *tmp = carls_xmalloc(tmp_len);
    snprintf(tmp, tmp_len, "%s.tmp.XXXXXX", path);
    bool tmp_exists = false;

    fd = mkstemp(tmp); /* created 0600, so a secret is never readable by others even for a moment */
    if (fd < 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot create a file beside %s: %s", path, strerror(errno));
        goto cleanup;
    }
    tmp_exists = true;
    if (fchmod(fd, mode) != 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot set the mode of %s: %s", tmp, strerror(errno));
        goto cleanup;
    }
    for (size_t done = 0; done < len;) {
        ssize_t n = write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot write %s: %s", tmp, strerror(errno));
            goto cleanup;
        }
        done += (size_t)n;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        fd = -1;
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot flush %s: %s", tmp, strerror(errno));
        goto cleanup;
    }
    fd = -1;
    if (overwrite) {
        if (rename(tmp, path) != 0) {
            rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
            goto cleanup;
        }
        tmp_exists = false;
    } else if (link(tmp, path) != 0) { /* link, unlike rename, fails when path exists: no race with a check */
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot create %s: %s", path,
                    errno == EEXIST ? "it already exists (kb-keygen --force replaces it)" : strerror(errno));
        goto cleanup;
    }

    /* Make the new directory entry durable too. */
    char *dir_copy = strdup(path);
    if (!dir_copy)
        CARLS_FATAL("out of memory");
    int dir_fd = open(dirname(dir_copy), O_RDONLY | O_DIRECTORY);
    free(dir_copy);
    if (dir_fd >= 0) {
        fsync(dir_fd);
        close(dir_fd);
    }

cleanup:
    if (fd >= 0)
        close(fd);
    if (tmp_exists)
        unlink(tmp);
    free(tmp);
    return rc;
}

/* Current UTC time as "2026-11-22T21:48:00Z", for the comment at the top of key files. */
static void s_utc_now(char *buf, size_t len)
{
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
    else
        snprintf(buf, len, "unknown time");
}

int kb_auth_keypair_write(const kb_auth_keypair_t *pair, const char *secret_path, const char *public_path,
                          bool overwrite, char *err, size_t errlen)
{
    assert(pair && secret_path && public_path);
    if (strcmp(secret_path, public_path) == 0)
        return carls_errorf(err, errlen, KB_AUTH_EINVAL, "secret and public key files must differ (%s)", secret_path);
    /* Checked up front so that a refusal writes nothing at all; the link in s_write_file still guards
     * against a file appearing in between. */
    if (!overwrite) {
        const char *paths[2] = {secret_path, public_path};
        for (int i = 0; i < 2; i++) {
            struct stat st;
            if (lstat(paths[i], &st) == 0)
                return carls_errorf(err, errlen, KB_AUTH_EIO, "%s already exists (kb-keygen --force replaces it)",
                              paths[i]);
        }
    }

    char when[32];
    s_utc_now(when, sizeof when);
    char public_z85[KB_AUTH_Z85_LEN + 1], secret_z85[KB_AUTH_Z85_LEN + 1];
    kb_auth_key_to_z85(&pair->public_key, public_z85);
    kb_auth_key_to_z85(&pair->secret_key, secret_z85);

    /* The layout of czmq's zcert files (sections "metadata" and "curve", children indented by 4), so the
     * files work with czmq and pyzmq tools as well. */
    char secret_text[512], public_text[512];
    snprintf(secret_text, sizeof secret_text,
             "#   carls-c CURVE secret key, written by kb-keygen at %s.\n"
             "#   Keep it private (mode 0600): whoever holds it can act as this client or server.\n"
             "#   The public key below may be shared; it is also in the matching .pub file.\n"
             "\n"
             "metadata\n"
             "curve\n"
             "    public-key = \"%s\"\n"
             "    secret-key = \"%s\"\n",
             when, public_z85, secret_z85);
    snprintf(public_text, sizeof public_text,
             "#   carls-c CURVE public key, written by kb-keygen at %s.\n"
             "#   Safe to share: put a client's on the server's allow-list, give the server's to clients.\n"
             "\n"
             "metadata\n"
             "curve\n"
             "    public-key = \"%s\"\n",
             when, public_z85);
    explicit_bzero(secret_z85, sizeof secret_z85);

    int rc = s_write_file(secret_path, secret_text, strlen(secret_text), 0600, overwrite, err, errlen);
    explicit_bzero(secret_text, sizeof secret_text);
    if (rc == KB_AUTH_OK)
        rc = s_write_file(public_path, public_text, strlen(public_text), 0644, overwrite, err, errlen);
    return rc;
}

/* ---- reading key and allow-list files ---------------------------------------------------------------- */

/* What a scan of one file collects. */
typedef struct {
    bool list_mode;           /* an allow-list file: bare keys allowed, public keys go to list, no secret */
    bool in_metadata;         /* after a "metadata" section line (until "curve"): other names are skipped */
    kb_auth_allow_t *list;    /* list mode: where keys go */
    bool has_public;          /* key-file mode: what was found */
    bool has_secret;
    kb_auth_key_t public_key;
    kb_auth_key_t secret_key;
} s_scan_t;

static bool s_is_blank(char c) { return c == ' ' || c == '\t'; }

/* The allow-list keeps its keys sorted (memcmp order) and distinct, for bsearch. */
struct kb_auth_allow {
    kb_auth_key_t *keys; /* count, sorted, distinct */
    size_t count;
    size_t capacity;
};

static void s_allow_append(kb_auth_allow_t *self, const kb_auth_key_t *key);

/* Handles one line (NUL-terminated, newline removed) of a key file or allow-list file. line_no and path
 * are for messages. */
static int s_scan_line(s_scan_t *scan, char *line, const char *path, int line_no, char *err, size_t errlen)
{
    char *p = line;
    while (s_is_blank(*p))
        p++;
    char *end = p + strlen(p);
    while (end > p && (s_is_blank(end[-1]) || end[-1] == '\r'))
        *--end = '\0';
    if (*p == '\0' || *p == '#') /* blank or comment; no valid key starts with '#' (see kb_auth.h) */
        return KB_AUTH_OK;

    /* czmq's section names carry no data, but name = value lines other than the two keys are only
     * accepted inside "metadata": elsewhere such a line is far more likely a mangled key line (Z85 has
     * '=' among its digits) that must not be skipped in silence. */
    if (strcmp(p, "metadata") == 0 || strcmp(p, "curve") == 0) {
        scan->in_metadata = p[0] == 'm';
        return KB_AUTH_OK;
    }

    kb_auth_key_t key;
    char reason[160];
    bool single_token = strpbrk(p, " \t\"") == NULL;
    if (scan->list_mode && single_token) {
        /* A bare key. Tested before name = value because '=' is a Z85 digit. */
        if (kb_auth_key_from_z85(p, strlen(p), &key, reason, sizeof reason) != KB_AUTH_OK)
            return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s:%d: %s", path, line_no, reason);
        s_allow_append(scan->list, &key);
        return KB_AUTH_OK;
    }

    /* name = value, the value optionally in double quotes (Z85 has no '"'). */
    char *name = p;
    while (*p && !s_is_blank(*p) && *p != '=')
        p++;
    size_t name_len = (size_t)(p - name);
    while (s_is_blank(*p))
        p++;
    if (name_len == 0 || *p != '=')
        return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s:%d: expected 'name = value'%s", path, line_no,
                      scan->list_mode ? " or a Z85 public key" : "");
    p++;
    while (s_is_blank(*p))
        p++;
    char *value = p;
    size_t value_len = strlen(value);
    if (value_len > 0 && value[0] == '"') {
        if (value_len < 2 || value[value_len - 1] != '"')
            return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s:%d: unterminated quoted value", path, line_no);
        value++;
        value_len -= 2;
    }

    bool is_public = name_len == 10 && memcmp(name, "public-key", 10) == 0;
    bool is_secret = name_len == 10 && memcmp(name, "secret-key", 10) == 0;
    if (!is_public && !is_secret) {
        if (scan->in_metadata)
            return KB_AUTH_OK; /* metadata from czmq or another tool */
        return carls_errorf(err, errlen, KB_AUTH_EFORMAT,
                      "%s:%d: unknown name '%.*s' (expected public-key or secret-key%s)", path, line_no,
                      (int)(name_len > 40 ? 40 : name_len), name, scan->list_mode ? " or a Z85 public key" : "");
    }
    if (is_secret && scan->list_mode)
        return carls_errorf(err, errlen, KB_AUTH_EFORMAT,
                      "%s:%d: an allow-list holds public keys only, this line is a secret key (a .key file given "
                      "where a .pub file belongs?)",
                      path, line_no);
    int rc = kb_auth_key_from_z85(value, value_len, &key, reason, sizeof reason);
    if (rc != KB_AUTH_OK) {
        explicit_bzero(&key, sizeof key);
        return carls_errorf(err, errlen, rc, "%s:%d: %s %s", path, line_no, is_public ? "public-key:" : "secret-key:",
                      reason);
    }
    if (scan->list_mode) {
        s_allow_append(scan->list, &key);
        return KB_AUTH_OK;
    }
    bool *seen = is_public ? &scan->has_public : &scan->has_secret;
    if (*seen)
        return carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s:%d: %s given twice", path, line_no,
                      is_public ? "public-key" : "secret-key");
    *seen = true;
    if (is_public)
        scan->public_key = key;
    else
        scan->secret_key = key;
    explicit_bzero(&key, sizeof key);
    return KB_AUTH_OK;
}

/* Reads path line by line into scan. If st_out is not NULL it receives the file's status (for the
 * permission check on secret files). */
static int s_scan_file(const char *path, s_scan_t *scan, struct stat *st_out, char *err, size_t errlen)
{
    int rc = KB_AUTH_OK;
    char *line = NULL;
    size_t cap = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, KB_AUTH_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "%s is not a regular file", path);
        goto cleanup;
    }
    if (st_out)
        *st_out = st;
    int line_no = 0;
    ssize_t n;
    errno = 0;
    /* getline rather than fgets: it reports the true length, so a NUL inside a line is caught instead of
     * silently cutting the line short. */
    while ((n = getline(&line, &cap, f)) >= 0) {
        line_no++;
        size_t len = (size_t)n;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        if (len > S_MAX_LINE) {
            rc = carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s:%d: line longer than %d characters", path, line_no,
                        S_MAX_LINE);
            goto cleanup;
        }
        if (strlen(line) != len) {
            rc = carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s:%d: NUL byte in a text file", path, line_no);
            goto cleanup;
        }
        rc = s_scan_line(scan, line, path, line_no, err, errlen);
        if (rc != KB_AUTH_OK)
            goto cleanup;
    }
    if (ferror(f))
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot read %s: %s", path, strerror(errno));
cleanup:
    if (line) {
        explicit_bzero(line, cap); /* it may have held a secret key */
        free(line);
    }
    fclose(f);
    return rc;
}

int kb_auth_load_secret(const char *path, kb_auth_keypair_t *out, char *err, size_t errlen)
{
    assert(path && out);
    int rc = s_require_curve(err, errlen);
    if (rc != KB_AUTH_OK)
        return rc;
    s_scan_t scan = {0};
    struct stat st;
    rc = s_scan_file(path, &scan, &st, err, errlen);
    if (rc != KB_AUTH_OK)
        goto cleanup;
    if (!scan.has_secret) {
        rc = carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s holds no secret-key (a public .pub file given where the "
                                                  "secret .key file belongs?)", path);
        goto cleanup;
    }

    /* The public key follows from the secret key; a stated one that differs means a file put together by
     * hand from two pairs, which would fail at the handshake with a far less helpful message. */
    char secret_z85[KB_AUTH_Z85_LEN + 1], derived_z85[KB_AUTH_Z85_LEN + 1];
    kb_auth_key_to_z85(&scan.secret_key, secret_z85);
    int zrc = zmq_curve_public(derived_z85, secret_z85);
    explicit_bzero(secret_z85, sizeof secret_z85);
    if (zrc != 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot derive the public key of %s: %s", path, zmq_strerror(errno));
        goto cleanup;
    }
    kb_auth_key_t derived;
    rc = kb_auth_key_from_z85(derived_z85, KB_AUTH_Z85_LEN, &derived, err, errlen);
    if (rc != KB_AUTH_OK)
        goto cleanup;
    if (scan.has_public && memcmp(derived.bytes, scan.public_key.bytes, KB_AUTH_KEY_BYTES) != 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s: public-key does not belong to secret-key", path);
        goto cleanup;
    }
    if ((st.st_mode & 077) != 0)
        LOG_WARN("secret key file %s is readable by others (mode %03o); chmod 600 it", path,
                 (unsigned)(st.st_mode & 0777));
    out->public_key = derived;
    out->secret_key = scan.secret_key;

cleanup:
    explicit_bzero(&scan, sizeof scan);
    return rc;
}

int kb_auth_load_public(const char *path, kb_auth_key_t *out, char *err, size_t errlen)
{
    assert(path && out);
    s_scan_t scan = {0};
    int rc = s_scan_file(path, &scan, NULL, err, errlen);
    if (rc == KB_AUTH_OK && !scan.has_public)
        rc = carls_errorf(err, errlen, KB_AUTH_EFORMAT, "%s holds no public-key", path);
    if (rc == KB_AUTH_OK)
        *out = scan.public_key;
    explicit_bzero(&scan, sizeof scan);
    return rc;
}

/* ---- allow-list -------------------------------------------------------------------------------------- */

static int s_key_cmp(const void *a, const void *b) { return memcmp(a, b, KB_AUTH_KEY_BYTES); }

kb_auth_allow_t *kb_auth_allow_new(void) { return carls_xcalloc(1, sizeof(kb_auth_allow_t)); }

void kb_auth_allow_destroy(kb_auth_allow_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_auth_allow_t *self = *self_p;
    free(self->keys);
    free(self);
    *self_p = NULL;
}

/* Appends without keeping the order; s_allow_sort restores it. Loading appends many keys, then sorts once. */
static void s_allow_append(kb_auth_allow_t *self, const kb_auth_key_t *key)
{
    if (self->count == self->capacity) {
        self->capacity = self->capacity ? self->capacity * 2 : 16;
        self->keys = carls_xrealloc(self->keys, self->capacity * sizeof *self->keys);
    }
    self->keys[self->count++] = *key;
}

/* Sorts the keys and drops duplicates. */
static void s_allow_sort(kb_auth_allow_t *self)
{
    if (self->count < 2)
        return;
    qsort(self->keys, self->count, sizeof *self->keys, s_key_cmp);
    size_t kept = 1;
    for (size_t i = 1; i < self->count; i++)
        if (s_key_cmp(&self->keys[i], &self->keys[kept - 1]) != 0)
            self->keys[kept++] = self->keys[i];
    self->count = kept;
}

void kb_auth_allow_add(kb_auth_allow_t *self, const kb_auth_key_t *key)
{
    assert(self && key);
    if (kb_auth_allow_contains(self, key))
        return;
    s_allow_append(self, key);
    s_allow_sort(self);
}

bool kb_auth_allow_contains(const kb_auth_allow_t *self, const kb_auth_key_t *key)
{
    assert(self && key);
    if (self->count == 0) /* keys may be NULL then, and bsearch wants a valid pointer */
        return false;
    return bsearch(key, self->keys, self->count, sizeof *self->keys, s_key_cmp) != NULL;
}

size_t kb_auth_allow_count(const kb_auth_allow_t *self)
{
    assert(self);
    return self->count;
}

/* Loads every "*.pub" regular file in dir into list. */
static int s_load_dir(const char *dir, kb_auth_allow_t *list, char *err, size_t errlen)
{
    int rc = KB_AUTH_OK;
    DIR *d = opendir(dir);
    if (!d)
        return carls_errorf(err, errlen, KB_AUTH_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        size_t len = strlen(entry->d_name);
        if (len <= 4 || strcmp(entry->d_name + len - 4, ".pub") != 0)
            continue;
        size_t path_len = strlen(dir) + 1 + len + 1;
        char *path = carls_xmalloc(path_len);
        snprintf(path, path_len, "%s/%s", dir, entry->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) { /* a dangling link or a directory named x.pub */
            rc = carls_errorf(err, errlen, KB_AUTH_EIO, "%s is not a readable regular file", path);
            free(path);
            goto cleanup;
        }
        kb_auth_key_t key;
        rc = kb_auth_load_public(path, &key, err, errlen);
        free(path);
        if (rc != KB_AUTH_OK)
            goto cleanup;
        s_allow_append(list, &key);
    }
cleanup:
    closedir(d);
    return rc;
}

int kb_auth_allow_load(const char *path, kb_auth_allow_t **out, char *err, size_t errlen)
{
    assert(path && out);
    kb_auth_allow_t *list = kb_auth_allow_new();
    int rc = KB_AUTH_OK;
    struct stat st;
    if (stat(path, &st) != 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EIO, "cannot open allow-list %s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = s_load_dir(path, list, err, errlen);
    } else {
        s_scan_t scan = {.list_mode = true, .list = list};
        rc = s_scan_file(path, &scan, NULL, err, errlen);
    }
    if (rc != KB_AUTH_OK)
        goto cleanup;
    s_allow_sort(list);
    if (list->count == 0) {
        rc = carls_errorf(err, errlen, KB_AUTH_EFORMAT, "allow-list %s names no public key (%s); no client could connect",
                    path, S_ISDIR(st.st_mode) ? "no *.pub file in it" : "no key line in it");
        goto cleanup;
    }
    *out = list;
    list = NULL;
cleanup:
    kb_auth_allow_destroy(&list);
    return rc;
}

/* ---- the ZAP handler --------------------------------------------------------------------------------- */

struct kb_auth {
    void *socket;                  /* REP bound to S_ZAP_ENDPOINT; only the thread touches it after start */
    kb_auth_allow_t *allow;        /* owned; read-only once the thread runs */
    pthread_t thread;
    atomic_bool stop;              /* set by kb_auth_destroy */
    atomic_uint_fast64_t allowed;  /* requests answered 200 */
    atomic_uint_fast64_t denied;   /* requests answered anything else */
};

/* True when msg holds exactly the bytes of the C string text. */
static bool s_frame_is(zmq_msg_t *msg, const char *text)
{
    size_t len = strlen(text);
    return zmq_msg_size(msg) == len && memcmp(zmq_msg_data(msg), text, len) == 0;
}

/* Copies a frame into buf as printable text (others as '?'), for log lines about a peer. */
static void s_frame_text(zmq_msg_t *msg, char *buf, size_t len)
{
    size_t n = zmq_msg_size(msg);
    if (n > len - 1)
        n = len - 1;
    const unsigned char *data = zmq_msg_data(msg);
    for (size_t i = 0; i < n; i++)
        buf[i] = (data[i] >= 0x20 && data[i] < 0x7f) ? (char)data[i] : '?';
    buf[n] = '\0';
}

/* Decides one request of `total` frames (the first `kept` of them in frames). Sets *code and *text to the
 * status to answer and fills user_id (empty unless 200) with the client key in Z85, which libzmq then
 * attaches to every message of the connection as the "User-Id" property. */
static void s_decide(kb_auth_t *self, zmq_msg_t *frames, int kept, int total, const char **code, const char **text,
                     char user_id[KB_AUTH_Z85_LEN + 1])
{
    user_id[0] = '\0';
    if (total < 6 || !s_frame_is(&frames[0], "1.0")) {
        *code = "500";
        *text = "malformed ZAP request";
        return;
    }
    if (!s_frame_is(&frames[2], KB_AUTH_DOMAIN)) {
        *code = "400";
        *text = "unknown ZAP domain";
        return;
    }
    if (!s_frame_is(&frames[5], "CURVE")) {
        *code = "400";
        *text = "only CURVE clients are accepted";
        return;
    }
    if (total != 7 || kept != 7 || zmq_msg_size(&frames[6]) != KB_AUTH_KEY_BYTES) {
        *code = "500";
        *text = "malformed CURVE credentials";
        return;
    }
    kb_auth_key_t key;
    memcpy(key.bytes, zmq_msg_data(&frames[6]), KB_AUTH_KEY_BYTES);
    if (kb_auth_allow_contains(self->allow, &key)) {
        *code = "200";
        *text = "OK";
        kb_auth_key_to_z85(&key, user_id);
        return;
    }
    *code = "400";
    *text = "client key not on the allow-list";
}

/* Sends the six reply frames. 0, or -1 when the socket failed (context terminating). */
static int s_reply(void *socket, zmq_msg_t *request_id, const char *code, const char *text, const char *user_id)
{
    struct {
        const void *data;
        size_t len;
    } parts[6] = {
        {"1.0", 3},
        {request_id ? zmq_msg_data(request_id) : "", request_id ? zmq_msg_size(request_id) : 0},
        {code, strlen(code)},
        {text, strlen(text)},
        {user_id, strlen(user_id)},
        {"", 0}, /* metadata: none */
    };
    for (int i = 0; i < 6; i++) {
        while (zmq_send(socket, parts[i].data, parts[i].len, i < 5 ? ZMQ_SNDMORE : 0) < 0) {
            if (errno != EINTR)
                return -1;
        }
    }
    return 0;
}

/* Receives one request, answers it and counts the answer. 0, or -1 when the socket failed (context
 * terminating), which ends the thread. */
static int s_handle_request(kb_auth_t *self)
{
    zmq_msg_t frames[S_ZAP_MAX_FRAMES];
    int kept = 0, total = 0, rc = 0;
    bool more = true;
    while (more) {
        /* Frames past S_ZAP_MAX_FRAMES are received into a scratch message and dropped: REP must read the
         * whole request before it may answer. */
        zmq_msg_t scratch;
        zmq_msg_t *msg = kept < S_ZAP_MAX_FRAMES ? &frames[kept] : &scratch;
        zmq_msg_init(msg);
        while (zmq_msg_recv(msg, self->socket, 0) < 0) {
            if (errno != EINTR) {
                zmq_msg_close(msg);
                rc = -1;
                goto cleanup;
            }
        }
        more = zmq_msg_more(msg);
        total++;
        if (msg == &scratch)
            zmq_msg_close(&scratch);
        else
            kept++;
    }

    const char *code, *text;
    char user_id[KB_AUTH_Z85_LEN + 1];
    s_decide(self, frames, kept, total, &code, &text, user_id);
    /* Counted before answering, so whoever has seen the outcome of a handshake also sees it counted. */
    if (strcmp(code, "200") == 0) {
        atomic_fetch_add(&self->allowed, 1);
        LOG_DEBUG("ZAP: accepted client %s", user_id);
    } else {
        uint64_t denied = atomic_fetch_add(&self->denied, 1) + 1;
        if (denied <= S_DENIED_LOG_FIRST || denied % S_DENIED_LOG_EVERY == 0) {
            char address[64] = "?", client[KB_AUTH_Z85_LEN + 1] = "?";
            if (kept >= 4)
                s_frame_text(&frames[3], address, sizeof address);
            if (kept >= 7 && zmq_msg_size(&frames[6]) == KB_AUTH_KEY_BYTES) {
                kb_auth_key_t key;
                memcpy(key.bytes, zmq_msg_data(&frames[6]), KB_AUTH_KEY_BYTES);
                kb_auth_key_to_z85(&key, client);
            }
            LOG_WARN("ZAP: refused client %s from %s: %s %s (%" PRIu64 " refused so far)", client, address, code,
                     text, denied);
        }
    }
    rc = s_reply(self->socket, kept >= 2 ? &frames[1] : NULL, code, text, user_id);
cleanup:
    for (int i = 0; i < kept; i++)
        zmq_msg_close(&frames[i]);
    return rc;
}

/* The handler thread: answers requests until the stop flag is set or the context terminates, then closes
 * the socket (a context cannot finish terminating while the socket is open). */
static void *s_thread(void *arg)
{
    kb_auth_t *self = arg;
    zmq_pollitem_t item = {.socket = self->socket, .events = ZMQ_POLLIN};
    while (!atomic_load(&self->stop)) {
        int n = zmq_poll(&item, 1, S_POLL_MS);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != ETERM)
                LOG_ERROR("ZAP handler: zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (n > 0 && (item.revents & ZMQ_POLLIN) && s_handle_request(self) != 0) {
            if (errno != ETERM)
                LOG_ERROR("ZAP handler: %s", zmq_strerror(errno));
            break;
        }
    }
    zmq_close(self->socket);
    self->socket = NULL;
    return NULL;
}

kb_auth_t *kb_auth_new(void *zmq_ctx, kb_auth_allow_t **allow_p, char *err, size_t errlen)
{
    assert(zmq_ctx && allow_p && *allow_p);
    kb_auth_t *self = carls_xcalloc(1, sizeof *self);
    self->allow = *allow_p;
    *allow_p = NULL;
    atomic_init(&self->stop, false);
    atomic_init(&self->allowed, 0);
    atomic_init(&self->denied, 0);

    if (s_require_curve(err, errlen) != KB_AUTH_OK)
        goto fail;
    self->socket = zmq_socket(zmq_ctx, ZMQ_REP);
    if (!self->socket) {
        carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot create the ZAP socket: %s", zmq_strerror(errno));
        goto fail;
    }
    int linger = 0;
    zmq_setsockopt(self->socket, ZMQ_LINGER, &linger, sizeof linger);
    /* Bound here, before the thread exists, so the handler is in place when this function returns. */
    if (zmq_bind(self->socket, S_ZAP_ENDPOINT) != 0) {
        carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot bind %s: %s%s", S_ZAP_ENDPOINT, zmq_strerror(errno),
               errno == EADDRINUSE ? " (another ZAP handler runs in this context)" : "");
        goto fail;
    }
    /* pthread_create is a full barrier, so handing the socket to the thread is safe. */
    int prc = pthread_create(&self->thread, NULL, s_thread, self);
    if (prc != 0) {
        carls_errorf(err, errlen, KB_AUTH_EIO, "cannot start the ZAP thread: %s", strerror(prc));
        goto fail;
    }
    LOG_INFO("ZAP handler: %zu client key(s) allowed", self->allow->count);
    return self;

fail:
    if (self->socket)
        zmq_close(self->socket);
    kb_auth_allow_destroy(&self->allow);
    free(self);
    return NULL;
}

void kb_auth_destroy(kb_auth_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_auth_t *self = *self_p;
    atomic_store(&self->stop, true);
    pthread_join(self->thread, NULL);
    kb_auth_allow_destroy(&self->allow);
    free(self);
    *self_p = NULL;
}

uint64_t kb_auth_allowed(const kb_auth_t *self)
{
    assert(self);
    return atomic_load(&self->allowed);
}

uint64_t kb_auth_denied(const kb_auth_t *self)
{
    assert(self);
    return atomic_load(&self->denied);
}

/* ---- socket set-up ----------------------------------------------------------------------------------- */

int kb_auth_setup_server(void *socket, const kb_auth_keypair_t *server, const kb_auth_t *auth, char *err,
                         size_t errlen)
{
    assert(socket && server);
    if (!auth)
        return carls_errorf(err, errlen, KB_AUTH_EINVAL,
                      "a CURVE server needs its ZAP handler running first (without one every client key would be "
                      "accepted)");
    int rc = s_require_curve(err, errlen);
    if (rc != KB_AUTH_OK)
        return rc;
    int one = 1;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, server->secret_key.bytes, KB_AUTH_KEY_BYTES) != 0 ||
        zmq_setsockopt(socket, ZMQ_ZAP_DOMAIN, KB_AUTH_DOMAIN, strlen(KB_AUTH_DOMAIN)) != 0)
        return carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot make the socket a CURVE server: %s", zmq_strerror(errno));
    /* Defence in depth: should the handler ever be gone, refuse clients rather than admit them all. */
    if (zmq_setsockopt(socket, S_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0)
        LOG_DEBUG("libzmq has no ZMQ_ZAP_ENFORCE_DOMAIN (%s); relying on the running ZAP handler",
                  zmq_strerror(errno));
    return KB_AUTH_OK;
}

int kb_auth_setup_client(void *socket, const kb_auth_keypair_t *client, const kb_auth_key_t *server_public,
                         char *err, size_t errlen)
{
    assert(socket && client && server_public);
    int rc = s_require_curve(err, errlen);
    if (rc != KB_AUTH_OK)
        return rc;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, server_public->bytes, KB_AUTH_KEY_BYTES) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, client->public_key.bytes, KB_AUTH_KEY_BYTES) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, client->secret_key.bytes, KB_AUTH_KEY_BYTES) != 0)
        return carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot make the socket a CURVE client: %s", zmq_strerror(errno));
    return KB_AUTH_OK;
}
