/* CURVE keys, key files and client allow-lists (see docs/SECURITY.md). The server's ZAP handler, which
 * checks connecting clients against an allow-list, is knowledge_bank/kb_zap.h.
 *
 * Two parts:
 *   - keys and key files: generate a key pair, write it as a secret file (0600) plus a public file, load
 *     them back, and load an allow-list of client public keys;
 *   - client socket set-up: kb_auth_setup_client for a DEALER.
 *
 * Key file format (text, one item per line; the layout of czmq's zcert files, so czmq/pyzmq certificates
 * load here and ours load there):
 *
 *     #   carls-c CURVE secret key, written by kb-keygen   <- comment: the first non-blank character is '#'
 *                                                          <- blank line: skipped
 *     metadata                                             <- section names "metadata", "curve": skipped
 *     curve
 *         public-key = "<40 characters of Z85>"            <- name = value; the value may be in double quotes
 *         secret-key = "<40 characters of Z85>"
 *
 * Keys are Z85 text (40 characters for 32 bytes). A secret file (NAME.key) holds secret-key and, normally,
 * public-key (checked against the secret; derived when absent). A public file (NAME.pub) holds public-key
 * only. Other names are accepted (and ignored) only under "metadata", where czmq keeps its metadata; a line
 * that is none of the above is an error. Z85 has '#' among its digits, but only as the value 84, which
 * cannot start a valid key (the first character of each 5-character group is at most '%'), so a line
 * starting with '#' is never a key.
 *
 * Allow-list (kb_auth_allow_load PATH):
 *   - a directory: every regular file whose name ends in ".pub" is a public key file, one key each; other
 *     files (secret ".key" files included) are ignored;
 *   - a file: one client key per line, either a bare 40-character Z85 key or a `public-key = "..."` line
 *     (so a single NAME.pub file is an allow-list of one); comments, blank lines and the section names
 *     "metadata" and "curve" are skipped. A secret-key line is refused (a secret file given by mistake).
 * An allow-list that names no key is refused: it would lock every client out.
 *
 * Return convention: 0 on success, a negative KB_AUTH_E* code on failure with a message in err (err may be
 * NULL when errlen is 0). */
#ifndef KB_KEYS_H
#define KB_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_AUTH_KEY_BYTES 32 /* a CURVE key */
#define KB_AUTH_Z85_LEN 40   /* its Z85 text, without the terminating NUL */

/* The ZAP domain the server socket asks for; the handler refuses requests for any other domain. */
#define KB_AUTH_DOMAIN "carls"

enum {
    KB_AUTH_OK = 0,
    KB_AUTH_EIO = -1,     /* a file is missing, unreadable or cannot be written */
    KB_AUTH_EFORMAT = -2, /* a file's content is malformed (bad line, wrong length, not Z85, no key) */
    KB_AUTH_EZMQ = -3,    /* a ZeroMQ call failed (no CURVE support, bind failed, bad socket) */
    KB_AUTH_EINVAL = -4,  /* the call's arguments are wrong */
};

/* A CURVE key in binary form. */
typedef struct {
    uint8_t bytes[KB_AUTH_KEY_BYTES];
} kb_auth_key_t;

/* A key pair: the secret key and the public key that belongs to it. */
typedef struct {
    kb_auth_key_t public_key;
    kb_auth_key_t secret_key;
} kb_auth_keypair_t;

/* ---- keys and key files ------------------------------------------------------------------------------ */

/* Fills *out with a fresh key pair from libzmq (libsodium or tweetnacl randomness). KB_AUTH_EZMQ when this
 * libzmq was built without CURVE. */
int kb_auth_keypair_generate(kb_auth_keypair_t *out, char *err, size_t errlen);

/* Writes the pair as secret_path (mode 0600, public and secret key) and public_path (mode 0644, public key
 * only), each through a temporary file, fsync and rename/link so a crash never leaves half a key. Without
 * overwrite an existing file is an error (KB_AUTH_EIO) and nothing is written; with it both are replaced. */
int kb_auth_keypair_write(const kb_auth_keypair_t *pair, const char *secret_path, const char *public_path,
                          bool overwrite, char *err, size_t errlen);

/* Loads a secret key file into *out. When the file also names public-key it must belong to the secret key;
 * when it does not, the public key is derived. Warns (does not fail) when the file is readable by group or
 * others. */
int kb_auth_load_secret(const char *path, kb_auth_keypair_t *out, char *err, size_t errlen);

/* Loads a public key file (public-key line) into *out. A secret key file also works: its public key is
 * read, the secret is ignored. */
int kb_auth_load_public(const char *path, kb_auth_key_t *out, char *err, size_t errlen);

/* Decodes 40 characters of Z85 (text need not be NUL-terminated after them; exactly len must be 40).
 * KB_AUTH_EFORMAT with the reason (wrong length, a character outside Z85, a group out of range). */
int kb_auth_key_from_z85(const char *text, size_t len, kb_auth_key_t *out, char *err, size_t errlen);

/* Writes the Z85 text of key into out (KB_AUTH_Z85_LEN characters + NUL). */
void kb_auth_key_to_z85(const kb_auth_key_t *key, char out[KB_AUTH_Z85_LEN + 1]);

/* ---- allow-list -------------------------------------------------------------------------------------- */

typedef struct kb_auth_allow kb_auth_allow_t;

/* An empty allow-list. Caller owns it (kb_auth_allow_destroy, or hand it to kb_auth_new). */
kb_auth_allow_t *kb_auth_allow_new(void);

/* Frees the list; accepts NULL and *self_p == NULL; nulls *self_p. */
void kb_auth_allow_destroy(kb_auth_allow_t **self_p);

/* Adds key (a key already on the list is not added twice). */
void kb_auth_allow_add(kb_auth_allow_t *self, const kb_auth_key_t *key);

/* True when key is on the list. */
bool kb_auth_allow_contains(const kb_auth_allow_t *self, const kb_auth_key_t *key);

/* Number of distinct keys on the list. */
size_t kb_auth_allow_count(const kb_auth_allow_t *self);

/* Loads the allow-list at path (a directory or a file, see the top of this header) into a new list in
 * *out (caller owns it). Fails, with *out untouched, on the first bad file or line or when no key is
 * found. */
int kb_auth_allow_load(const char *path, kb_auth_allow_t **out, char *err, size_t errlen);

/* KB_AUTH_EZMQ with a message unless this libzmq can do CURVE (it needs libsodium or its own tweetnacl). */
int kb_auth_require_curve(char *err, size_t errlen);

/* ---- socket set-up ----------------------------------------------------------------------------------- */

/* Makes socket (a client DEALER, before zmq_connect) a CURVE client with its own key pair, trusting only a
 * server that holds the secret key of server_public. Apply it again to every new socket (a reconnecting
 * client that reopens its socket must set it up again). */
int kb_auth_setup_client(void *socket, const kb_auth_keypair_t *client, const kb_auth_key_t *server_public,
                         char *err, size_t errlen);

#endif
