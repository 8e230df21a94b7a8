/* CURVE keys, key files and allow-lists. The formats and the contract are described in kb_keys.h;
 * docs/SECURITY.md is the operator's guide. */
#include "kb_keys.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <zmq.h>

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S_MAX_LINE 1024         /* longest line accepted in a key or allow-list file */

/* The Z85 digits (ZeroMQ RFC 32), value 0 first. */
static const char s_z85_digits[] = "0123456789abcdefghijklmnopqrstuvwxyz"
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* KB_AUTH_EZMQ with a message unless this libzmq can do CURVE (it needs libsodium or its own tweetnacl). */
int kb_auth_require_curve(char *err, size_t errlen)
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
    int rc = kb_auth_require_curve(err, errlen);
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

/* Writes len bytes of data to path with exactly `mode` (umask does not apply), atomically (files.h): the
 * temporary file is never more readable than mode, and without overwrite an existing path is refused by
 * the link that puts the file in place, so path is either absent/old or complete. */
static int s_write_file(const char *path, const char *data, size_t len, mode_t mode, bool overwrite, char *err,
                        size_t errlen)
{
    int flags = CARLS_FILE_EXACT_MODE | (overwrite ? 0 : CARLS_FILE_NO_OVERWRITE);
    int rc = carls_write_file_atomic(path, data, len, mode, flags, err, errlen);
    if (rc == CARLS_FILE_EEXIST)
        return carls_errorf(err, errlen, KB_AUTH_EIO, "cannot create %s: it already exists (kb-keygen --force replaces it)",
                            path);
    return rc == 0 ? KB_AUTH_OK : KB_AUTH_EIO;
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
    if (*p == '\0' || *p == '#') /* blank or comment; no valid key starts with '#' (see kb_keys.h) */
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
    int rc = kb_auth_require_curve(err, errlen);
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
    self->keys = carls_grow(self->keys, &self->capacity, self->count + 1, sizeof *self->keys);
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

/* ---- socket set-up ----------------------------------------------------------------------------------- */

int kb_auth_setup_client(void *socket, const kb_auth_keypair_t *client, const kb_auth_key_t *server_public,
                         char *err, size_t errlen)
{
    assert(socket && client && server_public);
    int rc = kb_auth_require_curve(err, errlen);
    if (rc != KB_AUTH_OK)
        return rc;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, server_public->bytes, KB_AUTH_KEY_BYTES) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, client->public_key.bytes, KB_AUTH_KEY_BYTES) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, client->secret_key.bytes, KB_AUTH_KEY_BYTES) != 0)
        return carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot make the socket a CURVE client: %s", zmq_strerror(errno));
    return KB_AUTH_OK;
}
