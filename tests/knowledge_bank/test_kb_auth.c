/* Unit tests for kb_auth: key files (round trip, modes, czmq layout, every kind of malformed file),
 * allow-lists (directory and file), the ZAP handler spoken to directly (every answer it can give), and
 * real CURVE connections over loopback TCP: a client on the allow-list gets through and is answered, an
 * unlisted client, a client without CURVE and a client trusting the wrong server key deliver nothing, and a
 * byte-recording relay between client and server shows that the payload never crosses the wire in clear
 * (with a plain-text control run showing that the relay does see clear payloads). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "kb_zap.h"
#include "log.h"
#include "util.h"

#define S_SILENCE_MS 500  /* how long "receives nothing" waits */
#define S_ARRIVAL_MS 5000 /* how long an expected message may take */

/* ---- helpers ----------------------------------------------------------------------------------------- */

static int s_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* A fresh private directory under /tmp; the caller removes it with s_rmdir. */
static char *s_tmpdir(void)
{
    char *dir = strdup("/tmp/test_kb_auth.XXXXXX");
    assert_non_null(dir);
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void s_rmdir(char *dir)
{
    nftw(dir, s_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

/* Writes dir/name into out. */
static void s_join(char *out, size_t len, const char *dir, const char *name) { snprintf(out, len, "%s/%s", dir, name); }

static void s_write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void s_write_text(const char *path, const char *text) { s_write_bytes(path, text, strlen(text)); }

static kb_auth_keypair_t s_pair(void)
{
    kb_auth_keypair_t pair;
    char err[256];
    assert_int_equal(kb_auth_keypair_generate(&pair, err, sizeof err), KB_AUTH_OK);
    return pair;
}

static void s_z85(const kb_auth_key_t *key, char out[KB_AUTH_Z85_LEN + 1]) { kb_auth_key_to_z85(key, out); }

static bool s_key_eq(const kb_auth_key_t *a, const kb_auth_key_t *b)
{
    return memcmp(a->bytes, b->bytes, KB_AUTH_KEY_BYTES) == 0;
}

/* Asserts that rc is the expected code and the message mentions `needle`. */
static void s_expect_error(int rc, int expected, const char *err, const char *needle)
{
    if (rc != expected || !strstr(err, needle))
        fprintf(stderr, "expected %d mentioning '%s', got %d: %s\n", expected, needle, rc, err);
    assert_int_equal(rc, expected);
    assert_non_null(strstr(err, needle));
}

/* A ROUTER bound to a free loopback port; CURVE server when server/auth are given. endpoint receives the
 * bound endpoint. */
static void *s_router(void *ctx, const kb_auth_keypair_t *server, const kb_auth_t *auth, char *endpoint, size_t len)
{
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    assert_non_null(router);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    if (server) {
        char err[256];
        assert_int_equal(kb_auth_setup_server(router, server, auth, err, sizeof err), KB_AUTH_OK);
    }
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &len), 0);
    return router;
}

/* A DEALER connected to endpoint; CURVE client when client is given. libzmq 4.3 does not retry after a
 * refused handshake; the long reconnect interval keeps refusals countable exactly on versions that do. */
static void *s_dealer(void *ctx, const kb_auth_keypair_t *client, const kb_auth_key_t *server_public,
                      const char *endpoint)
{
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(dealer);
    int linger = 0, reconnect_ms = 60000;
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(dealer, ZMQ_RECONNECT_IVL, &reconnect_ms, sizeof reconnect_ms);
    if (client) {
        char err[256];
        assert_int_equal(kb_auth_setup_client(dealer, client, server_public, err, sizeof err), KB_AUTH_OK);
    }
    assert_int_equal(zmq_connect(dealer, endpoint), 0);
    return dealer;
}

/* True when socket has a message within ms. */
static bool s_readable(void *socket, int ms)
{
    zmq_pollitem_t item = {.socket = socket, .events = ZMQ_POLLIN};
    return zmq_poll(&item, 1, ms) > 0 && (item.revents & ZMQ_POLLIN);
}

/* Receives [identity, body] on a router; asserts body equals text. Returns the identity (caller closes)
 * and, if user_id is not NULL, copies the message's "User-Id" property (empty when none) into it. */
static zmq_msg_t s_router_expect(void *router, const char *text, char *user_id, size_t user_id_len)
{
    assert_true(s_readable(router, S_ARRIVAL_MS));
    zmq_msg_t identity, body;
    zmq_msg_init(&identity);
    zmq_msg_init(&body);
    assert_true(zmq_msg_recv(&identity, router, 0) >= 0);
    assert_true(zmq_msg_more(&identity));
    assert_true(zmq_msg_recv(&body, router, 0) >= 0);
    assert_false(zmq_msg_more(&body));
    assert_int_equal(zmq_msg_size(&body), strlen(text));
    assert_memory_equal(zmq_msg_data(&body), text, strlen(text));
    if (user_id) {
        const char *uid = zmq_msg_gets(&body, "User-Id");
        snprintf(user_id, user_id_len, "%s", uid ? uid : "");
    }
    zmq_msg_close(&body);
    return identity;
}

/* Waits up to S_ARRIVAL_MS for the handler's refusal count to reach n. */
static void s_wait_denied(const kb_auth_t *auth, uint64_t n)
{
    int64_t deadline = carls_monotonic_ms() + S_ARRIVAL_MS;
    while (kb_auth_denied(auth) < n && carls_monotonic_ms() < deadline)
        usleep(5000);
    assert_int_equal(kb_auth_denied(auth), n);
}

/* ---- keys and key files ------------------------------------------------------------------------------ */

static void test_z85_round_trip(void **state)
{
    (void)state;
    for (int i = 0; i < 50; i++) {
        kb_auth_keypair_t pair = s_pair();
        char text[KB_AUTH_Z85_LEN + 1];
        s_z85(&pair.secret_key, text);
        assert_int_equal(strlen(text), KB_AUTH_Z85_LEN);
        assert_true(text[0] != '#'); /* the comment rule relies on this */
        kb_auth_key_t back;
        char err[256];
        assert_int_equal(kb_auth_key_from_z85(text, KB_AUTH_Z85_LEN, &back, err, sizeof err), KB_AUTH_OK);
        assert_true(s_key_eq(&back, &pair.secret_key));
    }
    /* The largest possible first digit of a group is '%' (82): "%nSc0" is 0xFFFFFFFF. */
    kb_auth_key_t max;
    char err[256];
    const char *all_ones = "%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0";
    assert_int_equal(kb_auth_key_from_z85(all_ones, 40, &max, err, sizeof err), KB_AUTH_OK);
    for (int i = 0; i < KB_AUTH_KEY_BYTES; i++)
        assert_int_equal(max.bytes[i], 0xFF);
    s_expect_error(kb_auth_key_from_z85("%nSc1%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0", 40, &max, err, sizeof err),
                   KB_AUTH_EFORMAT, err, "more than 32 bits");
    s_expect_error(kb_auth_key_from_z85(all_ones, 39, &max, err, sizeof err), KB_AUTH_EFORMAT, err, "39");
    s_expect_error(kb_auth_key_from_z85("%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc,", 40, &max, err, sizeof err),
                   KB_AUTH_EFORMAT, err, "character 40");
}

static void test_key_files_round_trip(void **state)
{
    (void)state;
    char *dir = s_tmpdir();
    char secret_path[512], public_path[512], err[512];
    s_join(secret_path, sizeof secret_path, dir, "alice.key");
    s_join(public_path, sizeof public_path, dir, "alice.pub");

    /* A restrictive umask must not change the modes: they are set explicitly. */
    mode_t old_umask = umask(0277);
    kb_auth_keypair_t pair = s_pair();
    assert_int_equal(kb_auth_keypair_write(&pair, secret_path, public_path, false, err, sizeof err), KB_AUTH_OK);
    umask(old_umask);

    struct stat st;
    assert_int_equal(stat(secret_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(public_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);

    kb_auth_keypair_t loaded;
    assert_int_equal(kb_auth_load_secret(secret_path, &loaded, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&loaded.secret_key, &pair.secret_key));
    assert_true(s_key_eq(&loaded.public_key, &pair.public_key));
    kb_auth_key_t pub;
    assert_int_equal(kb_auth_load_public(public_path, &pub, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&pub, &pair.public_key));
    /* The public key can also be read from the secret file. */
    assert_int_equal(kb_auth_load_public(secret_path, &pub, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&pub, &pair.public_key));
    /* The public file holds no secret. */
    char secret_z85[KB_AUTH_Z85_LEN + 1], text[1024];
    s_z85(&pair.secret_key, secret_z85);
    FILE *f = fopen(public_path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    assert_null(strstr(text, secret_z85));
    assert_null(strstr(text, "secret-key"));

    /* Existing files are refused, and left alone, unless overwriting. */
    kb_auth_keypair_t other = s_pair();
    s_expect_error(kb_auth_keypair_write(&other, secret_path, public_path, false, err, sizeof err), KB_AUTH_EIO, err,
                   "already exists");
    assert_int_equal(kb_auth_load_secret(secret_path, &loaded, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&loaded.secret_key, &pair.secret_key));
    assert_int_equal(kb_auth_keypair_write(&other, secret_path, public_path, true, err, sizeof err), KB_AUTH_OK);
    assert_int_equal(kb_auth_load_secret(secret_path, &loaded, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&loaded.secret_key, &other.secret_key));
    assert_int_equal(stat(secret_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* No temporary files are left behind. */
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *entry;
    int entries = 0;
    while ((entry = readdir(d)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        entries++;
        assert_true(strcmp(entry->d_name, "alice.key") == 0 || strcmp(entry->d_name, "alice.pub") == 0);
    }
    closedir(d);
    assert_int_equal(entries, 2);
    /* One path for both files is a caller error. */
    assert_int_equal(kb_auth_keypair_write(&other, secret_path, secret_path, true, err, sizeof err), KB_AUTH_EINVAL);
    s_rmdir(dir);
}

/* Hand-written files in czmq's layout and looser variants load. */
static void test_key_file_variants(void **state)
{
    (void)state;
    char *dir = s_tmpdir();
    char path[512], err[512], text[1024];
    kb_auth_keypair_t pair = s_pair();
    char pub[KB_AUTH_Z85_LEN + 1], sec[KB_AUTH_Z85_LEN + 1];
    s_z85(&pair.public_key, pub);
    s_z85(&pair.secret_key, sec);

    /* czmq layout with metadata, CRLF line ends, tabs, an unquoted value. */
    s_join(path, sizeof path, dir, "czmq.key");
    snprintf(text, sizeof text,
             "#   ****  Generated by some tool  ****\r\n"
             "#   ZeroMQ CURVE **Secret** Certificate\r\n"
             "\r\n"
             "metadata\r\n"
             "    name = \"alice\"\r\n"
             "    email = \"alice@example.org\"\r\n"
             "curve\r\n"
             "\tpublic-key = \"%s\"\r\n"
             "    secret-key =   %s   \r\n",
             pub, sec);
    s_write_text(path, text);
    chmod(path, 0600);
    kb_auth_keypair_t loaded;
    assert_int_equal(kb_auth_load_secret(path, &loaded, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&loaded.public_key, &pair.public_key));
    assert_true(s_key_eq(&loaded.secret_key, &pair.secret_key));

    /* A secret file without its public key: the public key is derived. */
    s_join(path, sizeof path, dir, "bare.key");
    snprintf(text, sizeof text, "secret-key=\"%s\"\n", sec);
    s_write_text(path, text);
    chmod(path, 0600);
    assert_int_equal(kb_auth_load_secret(path, &loaded, err, sizeof err), KB_AUTH_OK);
    assert_true(s_key_eq(&loaded.public_key, &pair.public_key));
    /* ... but then it is not a public key file. */
    kb_auth_key_t key;
    s_expect_error(kb_auth_load_public(path, &key, err, sizeof err), KB_AUTH_EFORMAT, err, "no public-key");

    /* A readable secret file still loads (with a warning in the log). */
    chmod(path, 0644);
    assert_int_equal(kb_auth_load_secret(path, &loaded, err, sizeof err), KB_AUTH_OK);
    s_rmdir(dir);
}

/* One malformed file: its content, which loader, and the expected code and message fragment. */
typedef struct {
    const char *content; /* {P}: a valid public key, {S}: its secret key, {Q}: another public key */
    int loader;          /* 0 load_public, 1 load_secret, 2 allow_load */
    int code;
    const char *needle;
} s_bad_file_t;

/* Copies content into out with {P}, {S} and {Q} replaced by p, s and q. */
static void s_expand(char *out, size_t len, const char *content, const char *p, const char *s, const char *q)
{
    size_t n = 0;
    for (const char *c = content; *c; c++) {
        const char *insert = NULL;
        if (c[0] == '{' && c[1] && c[2] == '}')
            insert = c[1] == 'P' ? p : c[1] == 'S' ? s : c[1] == 'Q' ? q : NULL;
        if (insert) {
            size_t k = strlen(insert);
            assert_true(n + k < len);
            memcpy(out + n, insert, k);
            n += k;
            c += 2;
        } else {
            assert_true(n + 1 < len);
            out[n++] = *c;
        }
    }
    out[n] = '\0';
}

static void test_malformed_files_refused(void **state)
{
    (void)state;
    char *dir = s_tmpdir();
    char path[512], err[512], text[2048];
    kb_auth_keypair_t pair = s_pair(), other = s_pair();
    char pub[KB_AUTH_Z85_LEN + 1], sec[KB_AUTH_Z85_LEN + 1], pub2[KB_AUTH_Z85_LEN + 1];
    s_z85(&pair.public_key, pub);
    s_z85(&pair.secret_key, sec);
    s_z85(&other.public_key, pub2);

    static const s_bad_file_t cases[] = {
        {"", 0, KB_AUTH_EFORMAT, "no public-key"},
        {"# only a comment\n", 1, KB_AUTH_EFORMAT, "no secret-key"},
        {"public-key = \"abc\"\n", 0, KB_AUTH_EFORMAT, "3 characters long, expected 40"},
        {"public-key = \"{P}0\"\n", 0, KB_AUTH_EFORMAT, "41 characters long"},
        {"public-key = \"abcdefghijklmnopqrstuvwxyz,ABCDEFGHIJKLM\"\n", 0, KB_AUTH_EFORMAT, "not a Z85 digit"},
        {"public-key = \"%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%\"\n", 0, KB_AUTH_EFORMAT, "more than 32 bits"},
        {"public-key = \"{P}\n", 0, KB_AUTH_EFORMAT, "unterminated"},
        {"hello world\n", 0, KB_AUTH_EFORMAT, ":1: expected 'name = value'"},
        {"curve\n    public-key\n", 0, KB_AUTH_EFORMAT, ":2: expected"},
        {"public-key = \"{P}\"\npublic-key = \"{P}\"\n", 0, KB_AUTH_EFORMAT, ":2: public-key given twice"},
        {"public-key = \"{Q}\"\nsecret-key = \"{S}\"\n", 1, KB_AUTH_EFORMAT, "does not belong"},
        {"public-key = \"{P}\"\n", 1, KB_AUTH_EFORMAT, "no secret-key"},
        {"secret-key = \"{S}\"\n", 1, KB_AUTH_OK, ""},
        /* allow-list files */
        {"# nobody\n\n", 2, KB_AUTH_EFORMAT, "names no public key"},
        {"{P}\n{S}\nsecret-key = \"{S}\"\n", 2, KB_AUTH_EFORMAT, ":3: an allow-list holds public keys only"},
        {"{P}\n{P}0\n", 2, KB_AUTH_EFORMAT, ":2: key is 41 characters"},
        {"{P}\nnot-a-key\n", 2, KB_AUTH_EFORMAT, ":2: key is 9 characters"},
        {"{P} {Q}\n", 2, KB_AUTH_EFORMAT, ":1: "},
        {"{P}\nname = \"alice\"\n", 2, KB_AUTH_EFORMAT, ":2: unknown name 'name'"},
        {"metadata\n    name = \"alice\"\ncurve\n    public-key = \"{P}\"\n", 2, KB_AUTH_OK, ""},
        {"metadata\n    name = \"alice\"\ncurve\n    public-kee = \"{P}\"\n", 0, KB_AUTH_EFORMAT,
         ":4: unknown name 'public-kee'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/case%zu", dir, i);
        s_expand(text, sizeof text, cases[i].content, pub, sec, pub2);
        s_write_text(path, text);
        chmod(path, 0600);
        err[0] = '\0';
        int rc;
        kb_auth_key_t key;
        kb_auth_keypair_t loaded;
        kb_auth_allow_t *list = NULL;
        if (cases[i].loader == 0)
            rc = kb_auth_load_public(path, &key, err, sizeof err);
        else if (cases[i].loader == 1)
            rc = kb_auth_load_secret(path, &loaded, err, sizeof err);
        else
            rc = kb_auth_allow_load(path, &list, err, sizeof err);
        if (rc != cases[i].code || !strstr(err, cases[i].needle))
            fprintf(stderr, "case %zu: expected %d '%s', got %d '%s'\n", i, cases[i].code, cases[i].needle, rc, err);
        assert_int_equal(rc, cases[i].code);
        assert_non_null(strstr(err, cases[i].needle));
        if (rc != KB_AUTH_OK)
            assert_null(list);
        kb_auth_allow_destroy(&list);
    }

    /* A NUL byte inside a line, and an over-long line. */
    kb_auth_key_t key;
    s_join(path, sizeof path, dir, "nul.pub");
    s_write_bytes(path, "public-key = \"ab\0cd\"\n", 21);
    s_expect_error(kb_auth_load_public(path, &key, err, sizeof err), KB_AUTH_EFORMAT, err, "NUL byte");
    s_join(path, sizeof path, dir, "long.pub");
    char *long_line = carls_xmalloc(5000);
    memset(long_line, 'x', 4999);
    long_line[4999] = '\0';
    s_write_text(path, long_line);
    free(long_line);
    s_expect_error(kb_auth_load_public(path, &key, err, sizeof err), KB_AUTH_EFORMAT, err, "longer than");

    /* Missing files and a directory given as a key file. */
    kb_auth_keypair_t loaded;
    s_join(path, sizeof path, dir, "missing.key");
    s_expect_error(kb_auth_load_secret(path, &loaded, err, sizeof err), KB_AUTH_EIO, err, "cannot open");
    s_expect_error(kb_auth_load_public(path, &key, err, sizeof err), KB_AUTH_EIO, err, "missing.key");
    kb_auth_allow_t *list = NULL;
    s_expect_error(kb_auth_allow_load(path, &list, err, sizeof err), KB_AUTH_EIO, err, "cannot open allow-list");
    assert_null(list);
    s_expect_error(kb_auth_load_public(dir, &key, err, sizeof err), KB_AUTH_EIO, err, "not a regular file");
    s_rmdir(dir);
}

/* ---- allow-lists ------------------------------------------------------------------------------------- */

static void test_allow_list_api(void **state)
{
    (void)state;
    kb_auth_keypair_t a = s_pair(), b = s_pair(), c = s_pair();
    kb_auth_allow_t *list = kb_auth_allow_new();
    assert_int_equal(kb_auth_allow_count(list), 0);
    assert_false(kb_auth_allow_contains(list, &a.public_key));
    kb_auth_allow_add(list, &b.public_key);
    kb_auth_allow_add(list, &a.public_key);
    kb_auth_allow_add(list, &b.public_key);
    assert_int_equal(kb_auth_allow_count(list), 2);
    assert_true(kb_auth_allow_contains(list, &a.public_key));
    assert_true(kb_auth_allow_contains(list, &b.public_key));
    assert_false(kb_auth_allow_contains(list, &c.public_key));
    assert_false(kb_auth_allow_contains(list, &a.secret_key));
    kb_auth_allow_destroy(&list);
    assert_null(list);
    kb_auth_allow_destroy(&list);
    kb_auth_allow_destroy(NULL);
}

static void test_allow_list_dir_and_file(void **state)
{
    (void)state;
    char *dir = s_tmpdir();
    char path[600], secret[600], err[512], text[1024];
    kb_auth_keypair_t a = s_pair(), b = s_pair(), c = s_pair();

    /* A directory: a.pub and b.pub count; c's .key (and a stray text file) do not. */
    char keys[256];
    s_join(keys, sizeof keys, dir, "clients");
    assert_int_equal(mkdir(keys, 0700), 0);
    kb_auth_allow_t *list = NULL;
    s_expect_error(kb_auth_allow_load(keys, &list, err, sizeof err), KB_AUTH_EFORMAT, err, "no *.pub file");
    const kb_auth_keypair_t *pairs[3] = {&a, &b, &c};
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        snprintf(secret, sizeof secret, "%s/%s.key", keys, names[i]);
        snprintf(path, sizeof path, "%s/%s.pub", keys, names[i]);
        assert_int_equal(kb_auth_keypair_write(pairs[i], secret, path, false, err, sizeof err), KB_AUTH_OK);
    }
    snprintf(path, sizeof path, "%s/c.pub", keys);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/README.txt", keys);
    s_write_text(path, "not a key\n");
    assert_int_equal(kb_auth_allow_load(keys, &list, err, sizeof err), KB_AUTH_OK);
    assert_int_equal(kb_auth_allow_count(list), 2);
    assert_true(kb_auth_allow_contains(list, &a.public_key));
    assert_true(kb_auth_allow_contains(list, &b.public_key));
    assert_false(kb_auth_allow_contains(list, &c.public_key));
    kb_auth_allow_destroy(&list);

    /* A bad .pub file in the directory fails the whole load. */
    snprintf(path, sizeof path, "%s/bad.pub", keys);
    s_write_text(path, "public-key = \"short\"\n");
    s_expect_error(kb_auth_allow_load(keys, &list, err, sizeof err), KB_AUTH_EFORMAT, err, "bad.pub:1");
    assert_null(list);

    /* A file: bare keys, a public-key line, duplicates, comments and czmq section names. */
    char pa[KB_AUTH_Z85_LEN + 1], pb[KB_AUTH_Z85_LEN + 1];
    s_z85(&a.public_key, pa);
    s_z85(&b.public_key, pb);
    s_join(path, sizeof path, dir, "clients.allow");
    snprintf(text, sizeof text,
             "# clients allowed to talk to kb-server\n"
             "\n"
             "%s\n"
             "   %s   \n"
             "metadata\n"
             "curve\n"
             "    public-key = \"%s\"\n",
             pa, pa, pb);
    s_write_text(path, text);
    assert_int_equal(kb_auth_allow_load(path, &list, err, sizeof err), KB_AUTH_OK);
    assert_int_equal(kb_auth_allow_count(list), 2);
    assert_true(kb_auth_allow_contains(list, &a.public_key));
    assert_true(kb_auth_allow_contains(list, &b.public_key));
    kb_auth_allow_destroy(&list);

    /* A single .pub file is an allow-list of one; a .key file is refused. */
    snprintf(path, sizeof path, "%s/a.pub", keys);
    assert_int_equal(kb_auth_allow_load(path, &list, err, sizeof err), KB_AUTH_OK);
    assert_int_equal(kb_auth_allow_count(list), 1);
    assert_true(kb_auth_allow_contains(list, &a.public_key));
    kb_auth_allow_destroy(&list);
    snprintf(path, sizeof path, "%s/a.key", keys);
    s_expect_error(kb_auth_allow_load(path, &list, err, sizeof err), KB_AUTH_EFORMAT, err, "secret key");
    s_rmdir(dir);
}

/* ---- the ZAP handler, spoken to directly ------------------------------------------------------------- */

/* Sends a ZAP request of n frames (data/len pairs) through req and checks the 6-frame answer: the request
 * id echoed, the status code, and (for 200) the user id. */
static void s_zap_exchange(void *req, const void *const *data, const size_t *len, int n, const char *code,
                           const char *user_id)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(zmq_send(req, data[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0), (int)len[i]);
    char frames[6][128];
    int sizes[6];
    for (int i = 0; i < 6; i++) {
        assert_true(s_readable(req, S_ARRIVAL_MS));
        sizes[i] = zmq_recv(req, frames[i], sizeof frames[i] - 1, 0);
        assert_true(sizes[i] >= 0 && sizes[i] < (int)sizeof frames[i]);
        frames[i][sizes[i]] = '\0';
        int more = 0;
        size_t more_len = sizeof more;
        zmq_getsockopt(req, ZMQ_RCVMORE, &more, &more_len);
        assert_int_equal(more, i < 5);
    }
    assert_string_equal(frames[0], "1.0");
    if (n >= 2) {
        assert_int_equal(sizes[1], (int)len[1]);
        assert_memory_equal(frames[1], data[1], len[1]);
    }
    assert_string_equal(frames[2], code);
    assert_true(sizes[3] > 0); /* a status text */
    assert_string_equal(frames[4], user_id);
    assert_int_equal(sizes[5], 0);
}

/* A ZAP handler in ctx whose allow list holds only client's public key (the handler takes the list). */
static kb_auth_t *s_auth_allowing(void *ctx, const kb_auth_keypair_t *client)
{
    kb_auth_allow_t *allow = kb_auth_allow_new();
    kb_auth_allow_add(allow, &client->public_key);
    char err[256];
    kb_auth_t *auth = kb_auth_new(ctx, &allow, err, sizeof err);
    if (!auth)
        fail_msg("kb_auth_new: %s", err);
    assert_null(allow);
    return auth;
}

static void test_zap_handler_answers(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    assert_non_null(ctx);
    kb_auth_keypair_t a = s_pair(), b = s_pair();
    kb_auth_t *auth = s_auth_allowing(ctx, &a);
    char err[256];

    /* A second handler in the same context cannot bind; it still takes (and frees) its list. */
    kb_auth_allow_t *again = kb_auth_allow_new();
    kb_auth_allow_add(again, &b.public_key);
    err[0] = '\0';
    kb_auth_t *second = kb_auth_new(ctx, &again, err, sizeof err);
    assert_null(second);
    assert_null(again);
    assert_non_null(strstr(err, "another ZAP handler"));

    void *req = zmq_socket(ctx, ZMQ_REQ);
    int linger = 0;
    zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(req, "inproc://zeromq.zap.01"), 0);

    char pa[KB_AUTH_Z85_LEN + 1];
    s_z85(&a.public_key, pa);
    const uint8_t *ka = a.public_key.bytes, *kb = b.public_key.bytes;
    /* version, id, domain, address, routing id, mechanism, credentials... */
    {
        const void *d[] = {"1.0", "7", "carls", "127.0.0.1", "", "CURVE", ka};
        const size_t l[] = {3, 1, 5, 9, 0, 5, 32};
        s_zap_exchange(req, d, l, 7, "200", pa);
    }
    {
        const void *d[] = {"1.0", "id-8", "carls", "127.0.0.1", "", "CURVE", kb};
        const size_t l[] = {3, 4, 5, 9, 0, 5, 32};
        s_zap_exchange(req, d, l, 7, "400", "");
    }
    { /* another domain */
        const void *d[] = {"1.0", "9", "other", "127.0.0.1", "", "CURVE", ka};
        const size_t l[] = {3, 1, 5, 9, 0, 5, 32};
        s_zap_exchange(req, d, l, 7, "400", "");
    }
    { /* another mechanism */
        const void *d[] = {"1.0", "10", "carls", "127.0.0.1", "", "PLAIN", "user", "password"};
        const size_t l[] = {3, 2, 5, 9, 0, 5, 4, 8};
        s_zap_exchange(req, d, l, 8, "400", "");
    }
    { /* another version */
        const void *d[] = {"2.0", "11", "carls", "127.0.0.1", "", "CURVE", ka};
        const size_t l[] = {3, 2, 5, 9, 0, 5, 32};
        s_zap_exchange(req, d, l, 7, "500", "");
    }
    { /* a short key */
        const void *d[] = {"1.0", "12", "carls", "127.0.0.1", "", "CURVE", ka};
        const size_t l[] = {3, 2, 5, 9, 0, 5, 31};
        s_zap_exchange(req, d, l, 7, "500", "");
    }
    { /* too few frames */
        const void *d[] = {"1.0", "13", "carls"};
        const size_t l[] = {3, 2, 5};
        s_zap_exchange(req, d, l, 3, "500", "");
    }
    { /* too many frames: drained, answered, and the handler still works afterwards */
        const void *d[12] = {"1.0", "14", "carls", "127.0.0.1", "", "CURVE"};
        size_t l[12] = {3, 2, 5, 9, 0, 5};
        for (int i = 6; i < 12; i++) {
            d[i] = ka;
            l[i] = 32;
        }
        s_zap_exchange(req, d, l, 12, "500", "");
    }
    {
        const void *d[] = {"1.0", "15", "carls", "127.0.0.1", "", "CURVE", ka};
        const size_t l[] = {3, 2, 5, 9, 0, 5, 32};
        s_zap_exchange(req, d, l, 7, "200", pa);
    }
    assert_int_equal(kb_auth_allowed(auth), 2);
    assert_int_equal(kb_auth_denied(auth), 7);

    zmq_close(req);
    kb_auth_destroy(&auth);
    assert_null(auth);
    kb_auth_destroy(&auth);
    kb_auth_destroy(NULL);
    assert_int_equal(zmq_ctx_term(ctx), 0);
}

/* Terminating the context first also ends the handler (its socket closes), and destroy still works. */
static void test_zap_handler_context_terminated_first(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    kb_auth_keypair_t a = s_pair();
    kb_auth_t *auth = s_auth_allowing(ctx, &a);
    assert_int_equal(zmq_ctx_term(ctx), 0); /* returns once the handler has closed its socket */
    kb_auth_destroy(&auth);
}

/* ---- real CURVE connections -------------------------------------------------------------------------- */

static void test_setup_server_needs_handler(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    kb_auth_keypair_t server = s_pair();
    char err[256];
    s_expect_error(kb_auth_setup_server(router, &server, NULL, err, sizeof err), KB_AUTH_EINVAL, err, "ZAP handler");
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* A ROUTER on a fresh context, with keys for the server and for one client a: with curve it does CURVE as
 * server and a ZAP handler admits a only; without, it is plain ZeroMQ (and auth is NULL). */
typedef struct {
    void *ctx;
    kb_auth_keypair_t server, a;
    kb_auth_t *auth;
    void *router;
    char endpoint[256];
} s_server_t;

static void s_server_open(s_server_t *srv, bool curve)
{
    srv->ctx = zmq_ctx_new();
    srv->server = s_pair();
    srv->a = s_pair();
    srv->auth = curve ? s_auth_allowing(srv->ctx, &srv->a) : NULL;
    srv->router = s_router(srv->ctx, curve ? &srv->server : NULL, srv->auth, srv->endpoint, sizeof srv->endpoint);
}

/* Closes the router and the handler; the context then terminates, every other socket being closed. */
static void s_server_close(s_server_t *srv)
{
    zmq_close(srv->router);
    kb_auth_destroy(&srv->auth);
    assert_int_equal(zmq_ctx_term(srv->ctx), 0);
}

/* Client a, trusting the server's key, sends a request: nothing may reach the router. */
static void s_assert_a_gets_nowhere(s_server_t *srv)
{
    void *da = s_dealer(srv->ctx, &srv->a, &srv->server.public_key, srv->endpoint);
    zmq_send(da, "hello", 5, ZMQ_DONTWAIT);
    assert_false(s_readable(srv->router, S_SILENCE_MS));
    zmq_close(da);
}

static void test_curve_allow_list_enforced(void **state)
{
    (void)state;
    s_server_t srv;
    s_server_open(&srv, true);
    kb_auth_keypair_t b = s_pair();
    int mechanism = -1;
    size_t mechanism_len = sizeof mechanism;
    assert_int_equal(zmq_getsockopt(srv.router, ZMQ_MECHANISM, &mechanism, &mechanism_len), 0);
    assert_int_equal(mechanism, ZMQ_CURVE);

    /* A listed client gets through, is identified by its key, and gets the answer. */
    void *da = s_dealer(srv.ctx, &srv.a, &srv.server.public_key, srv.endpoint);
    mechanism_len = sizeof mechanism;
    assert_int_equal(zmq_getsockopt(da, ZMQ_MECHANISM, &mechanism, &mechanism_len), 0);
    assert_int_equal(mechanism, ZMQ_CURVE);
    assert_int_equal(zmq_send(da, "hello", 5, 0), 5);
    char user_id[64], pa[KB_AUTH_Z85_LEN + 1];
    zmq_msg_t identity = s_router_expect(srv.router, "hello", user_id, sizeof user_id);
    s_z85(&srv.a.public_key, pa);
    assert_string_equal(user_id, pa);
    assert_true(zmq_msg_send(&identity, srv.router, ZMQ_SNDMORE) >= 0);
    assert_int_equal(zmq_send(srv.router, "world", 5, 0), 5);
    assert_true(s_readable(da, S_ARRIVAL_MS));
    char reply[16];
    assert_int_equal(zmq_recv(da, reply, sizeof reply, 0), 5);
    assert_memory_equal(reply, "world", 5);
    assert_int_equal(kb_auth_allowed(srv.auth), 1);
    assert_int_equal(kb_auth_denied(srv.auth), 0);

    /* An unlisted client proves its key but is refused: nothing arrives, one refusal is counted. */
    void *db = s_dealer(srv.ctx, &b, &srv.server.public_key, srv.endpoint);
    zmq_send(db, "intruder", 8, ZMQ_DONTWAIT);
    assert_false(s_readable(srv.router, S_SILENCE_MS));
    s_wait_denied(srv.auth, 1);

    /* A client without CURVE cannot even start the handshake (the handler is never asked). */
    void *dn = s_dealer(srv.ctx, NULL, NULL, srv.endpoint);
    zmq_send(dn, "plain", 5, ZMQ_DONTWAIT);
    assert_false(s_readable(srv.router, S_SILENCE_MS));

    /* A listed client that trusts another server key (a man in the middle's, say) gets nowhere either:
     * the real server cannot read its handshake. */
    void *dw = s_dealer(srv.ctx, &srv.a, &b.public_key, srv.endpoint);
    zmq_send(dw, "wrong-server", 12, ZMQ_DONTWAIT);
    assert_false(s_readable(srv.router, S_SILENCE_MS));
    assert_int_equal(kb_auth_denied(srv.auth), 1);
    assert_int_equal(kb_auth_allowed(srv.auth), 1);

    /* The listed client is still served. */
    assert_int_equal(zmq_send(da, "again", 5, 0), 5);
    zmq_msg_close(&identity);
    identity = s_router_expect(srv.router, "again", NULL, 0);
    zmq_msg_close(&identity);

    zmq_close(da);
    zmq_close(db);
    zmq_close(dn);
    zmq_close(dw);
    s_server_close(&srv);
}

/* Should the handler be gone while the server socket lives on, clients are refused rather than all
 * admitted (libzmq's ZMQ_ZAP_ENFORCE_DOMAIN, set by kb_auth_setup_server where libzmq has it). */
static void test_no_handler_no_entry(void **state)
{
    (void)state;
    s_server_t srv;
    s_server_open(&srv, true);
    int enforce = 0;
    size_t enforce_len = sizeof enforce;
    if (zmq_getsockopt(srv.router, 93 /* ZMQ_ZAP_ENFORCE_DOMAIN, a draft option */, &enforce, &enforce_len) != 0) {
        fprintf(stderr, "libzmq without ZMQ_ZAP_ENFORCE_DOMAIN: not tested\n");
    } else {
        assert_int_equal(enforce, 1);
        kb_auth_destroy(&srv.auth);
        s_assert_a_gets_nowhere(&srv);
    }
    s_server_close(&srv);
}

/* A CURVE client cannot be talked into plain text by a server that does not do CURVE. */
static void test_curve_client_refuses_plain_server(void **state)
{
    (void)state;
    s_server_t srv;
    s_server_open(&srv, false);
    s_assert_a_gets_nowhere(&srv);
    s_server_close(&srv);
}

/* A TCP relay between one client and the server that records the bytes going each way. */
typedef struct {
    int listen_fd;
    int listen_port;
    int target_port;
    atomic_bool stop;
    pthread_t thread;
    unsigned char up[1 << 16]; /* client to server, the first 64 KiB */
    size_t up_len;
    unsigned char down[1 << 16]; /* server to client */
    size_t down_len;
} s_relay_t;

static void s_record(unsigned char *buf, size_t *len, size_t cap, const unsigned char *data, size_t n)
{
    size_t room = cap - *len;
    if (n > room)
        n = room;
    memcpy(buf + *len, data, n);
    *len += n;
}

static void *s_relay_thread(void *arg)
{
    s_relay_t *relay = arg;
    int client = -1, server = -1;
    while (!atomic_load(&relay->stop) && client < 0) {
        struct pollfd p = {.fd = relay->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 20) > 0)
            client = accept(relay->listen_fd, NULL, NULL);
    }
    if (client < 0)
        return NULL;
    server = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)relay->target_port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (server < 0 || connect(server, (struct sockaddr *)&addr, sizeof addr) != 0)
        goto done;
    unsigned char buf[8192];
    while (!atomic_load(&relay->stop)) {
        struct pollfd p[2] = {{.fd = client, .events = POLLIN}, {.fd = server, .events = POLLIN}};
        if (poll(p, 2, 20) <= 0)
            continue;
        for (int side = 0; side < 2; side++) {
            if (!(p[side].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(p[side].fd, buf, sizeof buf);
            if (n <= 0)
                goto done;
            /* Recorded before it is forwarded, so by the time the far end has the message, so do we. */
            if (side == 0)
                s_record(relay->up, &relay->up_len, sizeof relay->up, buf, (size_t)n);
            else
                s_record(relay->down, &relay->down_len, sizeof relay->down, buf, (size_t)n);
            int to = side == 0 ? server : client;
            for (ssize_t done = 0; done < n;) {
                ssize_t w = write(to, buf + done, (size_t)(n - done));
                if (w <= 0)
                    goto done;
                done += w;
            }
        }
    }
done:
    close(client);
    if (server >= 0)
        close(server);
    return NULL;
}

static s_relay_t *s_relay_start(const char *target_endpoint)
{
    s_relay_t *relay = calloc(1, sizeof *relay);
    assert_non_null(relay);
    relay->target_port = atoi(strrchr(target_endpoint, ':') + 1);
    relay->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(relay->listen_fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(relay->listen_fd, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(listen(relay->listen_fd, 4), 0);
    socklen_t len = sizeof addr;
    assert_int_equal(getsockname(relay->listen_fd, (struct sockaddr *)&addr, &len), 0);
    relay->listen_port = ntohs(addr.sin_port);
    atomic_init(&relay->stop, false);
    assert_int_equal(pthread_create(&relay->thread, NULL, s_relay_thread, relay), 0);
    return relay;
}

static void s_relay_stop(s_relay_t *relay)
{
    atomic_store(&relay->stop, true);
    pthread_join(relay->thread, NULL);
    close(relay->listen_fd);
}

/* Sends a marked request through the relay and a marked reply back; returns the relay (stopped) so the
 * caller can look at the bytes. curve selects CURVE on both ends (with a and server, auth running) or
 * plain ZeroMQ. */
static s_relay_t *s_exchange_through_relay(bool curve)
{
    s_server_t srv;
    s_server_open(&srv, curve);
    char relay_endpoint[64];
    s_relay_t *relay = s_relay_start(srv.endpoint);
    snprintf(relay_endpoint, sizeof relay_endpoint, "tcp://127.0.0.1:%d", relay->listen_port);
    void *dealer = s_dealer(srv.ctx, curve ? &srv.a : NULL, &srv.server.public_key, relay_endpoint);

    static const char request[] = "CARLS-SECRET-REQUEST-PAYLOAD-0123456789";
    static const char answer[] = "CARLS-SECRET-ANSWER-PAYLOAD-9876543210";
    assert_int_equal(zmq_send(dealer, request, sizeof request - 1, 0), (int)sizeof request - 1);
    zmq_msg_t identity = s_router_expect(srv.router, request, NULL, 0);
    assert_true(zmq_msg_send(&identity, srv.router, ZMQ_SNDMORE) >= 0);
    assert_int_equal(zmq_send(srv.router, answer, sizeof answer - 1, 0), (int)sizeof answer - 1);
    assert_true(s_readable(dealer, S_ARRIVAL_MS));
    char got[64];
    assert_int_equal(zmq_recv(dealer, got, sizeof got, 0), (int)sizeof answer - 1);
    zmq_msg_close(&identity);

    zmq_close(dealer);
    s_server_close(&srv);
    s_relay_stop(relay);
    return relay;
}

static void test_wire_is_encrypted(void **state)
{
    (void)state;
    /* Control: without CURVE the relay sees both payloads, so the check below is meaningful. */
    s_relay_t *plain = s_exchange_through_relay(false);
    assert_non_null(memmem(plain->up, plain->up_len, "CARLS-SECRET-REQUEST", 20));
    assert_non_null(memmem(plain->down, plain->down_len, "CARLS-SECRET-ANSWER", 19));
    assert_null(memmem(plain->up, plain->up_len, "CURVE", 5));
    free(plain);

    /* With CURVE the greeting names the mechanism in clear, the payloads never appear. */
    s_relay_t *curve = s_exchange_through_relay(true);
    assert_non_null(memmem(curve->up, curve->up_len, "CURVE", 5));
    assert_non_null(memmem(curve->down, curve->down_len, "CURVE", 5));
    assert_null(memmem(curve->up, curve->up_len, "CARLS-SECRET", 12));
    assert_null(memmem(curve->down, curve->down_len, "CARLS-SECRET", 12));
    assert_null(memmem(curve->up, curve->up_len, "REQUEST", 7));
    assert_null(memmem(curve->down, curve->down_len, "ANSWER", 6));
    free(curve);
}

int main(void)
{
    carls_log_init_from_env();
    if (!zmq_has("curve")) {
        fprintf(stderr, "libzmq without CURVE: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_z85_round_trip),
        cmocka_unit_test(test_key_files_round_trip),
        cmocka_unit_test(test_key_file_variants),
        cmocka_unit_test(test_malformed_files_refused),
        cmocka_unit_test(test_allow_list_api),
        cmocka_unit_test(test_allow_list_dir_and_file),
        cmocka_unit_test(test_zap_handler_answers),
        cmocka_unit_test(test_zap_handler_context_terminated_first),
        cmocka_unit_test(test_setup_server_needs_handler),
        cmocka_unit_test(test_curve_allow_list_enforced),
        cmocka_unit_test(test_no_handler_no_entry),
        cmocka_unit_test(test_curve_client_refuses_plain_server),
        cmocka_unit_test(test_wire_is_encrypted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
