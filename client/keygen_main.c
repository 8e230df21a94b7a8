/* kb-keygen: makes CURVE key pairs for kb-server and its clients. See `kb-keygen --help` and
 * docs/SECURITY.md. The file format is described in proto/kb_keys.h. */
#include "kb_keys.h"
#include "log.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kb-keygen [--force] NAME\n"
            "       kb-keygen --show FILE\n"
            "\n"
            "Makes a ZeroMQ CURVE key pair for kb-server or one of its clients (docs/SECURITY.md):\n"
            "  NAME.key  the secret key (with its public key), mode 0600: keep it private\n"
            "  NAME.pub  the public key: give a server's to its clients, put a client's on the\n"
            "            server's allow-list (kb-server --curve-allow DIR holds *.pub files)\n"
            "\n"
            "options:\n"
            "  --force            replace NAME.key and NAME.pub if they exist (default: refuse)\n"
            "  --show FILE        print the Z85 public key of a .pub or .key file on one line, as an\n"
            "                     allow-list file expects it (kb-keygen --show alice.pub >> clients.allow)\n"
            "  --log-level LEVEL  debug, info, warn, error (default info; or CARLS_LOG_LEVEL)\n"
            "  -h, --help         this help\n");
}

/* Prints the public key of path. Returns the exit status. */
static int s_show(const char *path)
{
    char err[512];
    kb_auth_key_t key;
    if (kb_auth_load_public(path, &key, err, sizeof err) != KB_AUTH_OK) {
        fprintf(stderr, "kb-keygen: %s\n", err);
        return 1;
    }
    char z85[KB_AUTH_Z85_LEN + 1];
    kb_auth_key_to_z85(&key, z85);
    printf("%s\n", z85);
    return 0;
}

/* Writes NAME.key and NAME.pub. Returns the exit status. */
static int s_generate(const char *name, bool force)
{
    int status = 1;
    char err[512];
    size_t len = strlen(name) + sizeof ".key";
    char *secret_path = malloc(len);
    char *public_path = malloc(len);
    kb_auth_keypair_t pair;
    if (!secret_path || !public_path) {
        fprintf(stderr, "kb-keygen: out of memory\n");
        goto cleanup;
    }
    snprintf(secret_path, len, "%s.key", name);
    snprintf(public_path, len, "%s.pub", name);
    if (kb_auth_keypair_generate(&pair, err, sizeof err) != KB_AUTH_OK ||
        kb_auth_keypair_write(&pair, secret_path, public_path, force, err, sizeof err) != KB_AUTH_OK) {
        fprintf(stderr, "kb-keygen: %s\n", err);
        goto cleanup;
    }
    char z85[KB_AUTH_Z85_LEN + 1];
    kb_auth_key_to_z85(&pair.public_key, z85);
    printf("wrote %s (secret, mode 0600: keep it private) and %s (public key %s)\n", secret_path, public_path,
           z85);
    status = 0;
cleanup:
    explicit_bzero(&pair, sizeof pair);
    free(secret_path);
    free(public_path);
    return status;
}

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    bool force = false;
    const char *show = NULL;
    static const struct option options[] = {
        {"force", no_argument, NULL, 'f'},
        {"show", required_argument, NULL, 's'},
        {"log-level", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case 'f':
            force = true;
            break;
        case 's':
            show = optarg;
            break;
        case 'L':
            if (carls_log_level_option("kb-keygen", optarg) != 0)
                return 2;
            break;
        case 'h':
            s_usage(stdout);
            return 0;
        default:
            s_usage(stderr);
            return 2;
        }
    }
    if (show) {
        if (optind != argc || force) {
            s_usage(stderr);
            return 2;
        }
        return s_show(show);
    }
    if (optind != argc - 1 || argv[optind][0] == '\0') {
        s_usage(stderr);
        return 2;
    }
    return s_generate(argv[optind], force);
}
