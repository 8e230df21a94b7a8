/* Small helpers every kind of test program needs (see test_util.h). */
#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int test_tmpdir(char *dir, size_t size, const char *tag)
{
    snprintf(dir, size, "/tmp/carls-%s-XXXXXX", tag);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

int test_rmrf(const char *path)
{
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) {
        fprintf(stderr, "warning: %s failed\n", cmd);
        return -1;
    }
    return 0;
}

char test_scratch_dir[256];

int test_scratch_setup(void **state)
{
    (void)state;
    return test_tmpdir(test_scratch_dir, sizeof test_scratch_dir, "test");
}

int test_scratch_teardown(void **state)
{
    (void)state;
    return test_rmrf(test_scratch_dir);
}

unsigned char *test_read_file(const char *path, size_t spare, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    unsigned char *buf = NULL;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + spare + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        *len = (size_t)n;
    return buf;
}

uint64_t test_xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

float test_uniform_pm1(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

void test_last_line(const char *path, char *line, size_t len)
{
    FILE *f = fopen(path, "r");
    char buf[8192];
    line[0] = '\0';
    while (f && fgets(buf, sizeof buf, f)) {
        if (buf[0] != '\n')
            snprintf(line, len, "%s", buf);
    }
    if (f)
        fclose(f);
}

void test_asan_options_append(const char *options)
{
    const char *old = getenv("ASAN_OPTIONS");
    char joined[1024];
    snprintf(joined, sizeof joined, "%s%s%s", old ? old : "", old && old[0] ? ":" : "", options);
    setenv("ASAN_OPTIONS", joined, 1);
}

int test_promtool_check(const char *text, char *out, size_t outlen)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        snprintf(out, outlen, "promtool is not installed (Debian package prometheus, scripts/setup.sh)");
        return 77;
    }
    char dir[256], path[300], cmd[400];
    if (test_tmpdir(dir, sizeof dir, "promtool") != 0) {
        snprintf(out, outlen, "no scratch directory");
        return 1;
    }
    snprintf(path, sizeof path, "%s/page.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        snprintf(out, outlen, "cannot write %s", path);
        test_rmrf(dir);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", path);
    FILE *p = popen(cmd, "r");
    size_t len = 0;
    out[0] = '\0';
    if (p) {
        len = fread(out, 1, outlen - 1, p);
        out[len] = '\0';
    }
    int st = p ? pclose(p) : -1;
    test_rmrf(dir);
    /* promtool says nothing and exits 0 when the page is clean; lint problems exit 3, parse errors 1 */
    return st == 0 && len == 0 ? 0 : 1;
}

char *test_http(uint16_t port, const char *method, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0) {
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

uint16_t test_logged_metrics_port(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1024];
    unsigned port = 0;
    while (!port && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "metrics: http://127.0.0.1:");
        if (p)
            port = (unsigned)strtoul(p + strlen("metrics: http://127.0.0.1:"), NULL, 10);
    }
    fclose(f);
    return port < 65536 ? (uint16_t)port : 0;
}
