/* Small helpers every kind of test program needs: scratch directories, whole-file reads, a seeded random
 * stream, the last line of a log, and the sanitizer switches. Plain C (no cmocka): the callers check the
 * results with their own assertions. */
#ifndef CARLS_TEST_UTIL_H
#define CARLS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* TEST_SANITIZED is defined when this file is compiled with AddressSanitizer (GCC or clang): tests that
 * measure memory or time loosen their bounds then. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif

/* Makes a fresh directory /tmp/carls-<tag>-XXXXXX; dir (size bytes) receives its path. 0, or -1 (perror'd). */
int test_tmpdir(char *dir, size_t size, const char *tag);

/* cmocka group fixtures (pass them to cmocka_run_group_tests) for a program whose tests share one scratch
 * directory, test_scratch_dir: test_scratch_setup makes it (/tmp/carls-test-XXXXXX), test_scratch_teardown
 * removes it with everything in it. */
extern char test_scratch_dir[256];
int test_scratch_setup(void **state);
int test_scratch_teardown(void **state);

/* rm -rf path. 0, or -1 when the removal failed. */
int test_rmrf(const char *path);

/* The whole of path in a new buffer with `spare` more bytes after the content (caller frees); *len gets the
 * content's size. NULL when path cannot be read. */
unsigned char *test_read_file(const char *path, size_t spare, size_t *len);

/* xorshift64* (Vigna): a fast seeded stream for test data; *state must not be 0. */
uint64_t test_xorshift64(uint64_t *state);

/* Uniform in [-1, 1), 24 bits of Marsaglia's xorshift64 (13, 7, 17) stream *state (*state != 0). */
float test_uniform_pm1(uint64_t *state);

/* The last non-empty line of path (with its newline) into line (len bytes); "" when there is none. */
void test_last_line(const char *path, char *line, size_t len);


/* An HTTP/1.0 request (method, path) to 127.0.0.1:port: the whole answer, head and body (malloc'd, caller
 * frees), or NULL when the connection failed. */
char *test_http(uint16_t port, const char *method, const char *path);

/* The port of the first "metrics: http://127.0.0.1:PORT/metrics" line in the log file path, or 0. */
uint16_t test_logged_metrics_port(const char *path);

/* Runs `promtool check metrics` (Debian package prometheus) on a Prometheus text page. 0: accepted with no
 * problem; 1: refused or linted, with promtool's words in out (outlen bytes); 77: promtool is not installed
 * (out says so). */
int test_promtool_check(const char *text, char *out, size_t outlen);

/* Appends options ("a=1:b=2") to ASAN_OPTIONS for the child processes this test starts. */
void test_asan_options_append(const char *options);

#endif
