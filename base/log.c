#include "log.h"

#include "util.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int s_level = CARLS_LOG_INFO;

static const char *s_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

void carls_log_set_level(carls_log_level_t level) { atomic_store(&s_level, (int)level); }

carls_log_level_t carls_log_get_level(void) { return (carls_log_level_t)atomic_load(&s_level); }

int carls_log_parse_level(const char *name, carls_log_level_t *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"}; /* in carls_log_level_t order */
    const int i = carls_name_index(name, names, (int)(sizeof names / sizeof names[0]));
    if (i < 0)
        return -1;
    *out = (carls_log_level_t)i;
    return 0;
}

int carls_log_level_option(const char *program, const char *text)
{
    carls_log_level_t level;
    if (carls_log_parse_level(text, &level) != 0) {
        fprintf(stderr, "%s: --log-level: '%s' is not debug, info, warn, error or off\n", program, text);
        return -1;
    }
    carls_log_set_level(level);
    return 0;
}

void carls_log_init_from_env(void)
{
    const char *env = getenv("CARLS_LOG_LEVEL");
    carls_log_level_t level;
    if (env && carls_log_parse_level(env, &level) == 0)
        carls_log_set_level(level);
}

void carls_log_write(carls_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    if ((int)level < atomic_load(&s_level) || level >= CARLS_LOG_OFF)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    /* One fprintf per line so lines from different threads do not interleave. */
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s:%d %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
            tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L, s_names[level], base, line, msg);
}
