/* Levelled logging to stderr, shared by every program and library.
 *
 * Lines look like "2026-11-22T21:48:00.123Z INFO  kb_server.c:120 listening on tcp://...". The level
 * threshold is process-wide; set it once at start-up (from --log-level or CARLS_LOG_LEVEL). */
#ifndef CARLS_LOG_H
#define CARLS_LOG_H

typedef enum {
    CARLS_LOG_DEBUG = 0,
    CARLS_LOG_INFO = 1,
    CARLS_LOG_WARN = 2,
    CARLS_LOG_ERROR = 3,
    CARLS_LOG_OFF = 4,
} carls_log_level_t;

/* Sets the threshold; messages below it are dropped. */
void carls_log_set_level(carls_log_level_t level);
carls_log_level_t carls_log_get_level(void);

/* Parses "debug", "info", "warn", "error" or "off". Returns 0 and sets *out, or -1 for an unknown name. */
int carls_log_parse_level(const char *name, carls_log_level_t *out);

/* For a program's --log-level option: parses text and sets the level, or prints
 * "PROGRAM: --log-level: 'TEXT' is not debug, info, warn, error or off" to stderr and returns -1. */
int carls_log_level_option(const char *program, const char *text);

/* Reads CARLS_LOG_LEVEL from the environment if set and valid. */
void carls_log_init_from_env(void);

void carls_log_write(carls_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define LOG_DEBUG(...) carls_log_write(CARLS_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_INFO(...) carls_log_write(CARLS_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) carls_log_write(CARLS_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) carls_log_write(CARLS_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

/* Out of memory or another unrecoverable resource failure: log file:line and abort. Never for bad input. */
#define CARLS_FATAL(...)                                                                                    \
    do {                                                                                                    \
        carls_log_write(CARLS_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__);                                  \
        abort();                                                                                            \
    } while (0)

#endif
