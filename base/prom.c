/* Prometheus text and /metrics over HTTP (see prom.h). */
#include "prom.h"

#include "log.h"
#include "util.h"

#include <arpa/inet.h>
#include <assert.h>
#include <microhttpd.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- text ---- */

void carls_prom_label_value(FILE *f, const char *value)
{
    for (const char *p = value ? value : ""; *p; p++) {
        if (*p == '\\')
            fputs("\\\\", f);
        else if (*p == '"')
            fputs("\\\"", f);
        else if (*p == '\n')
            fputs("\\n", f);
        else
            fputc(*p, f);
    }
}

void carls_prom_family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void carls_prom_metric(FILE *f, const char *name, const char *type, double value, const char *help)
{
    carls_prom_family(f, name, type, help);
    fprintf(f, "%s %.15g\n", name, value);
}

void carls_prom_histogram(FILE *f, const char *name, const char *labels, const double *bounds,
                          const uint64_t *cumulative, size_t n, uint64_t count, double sum)
{
    const char *sep = labels && *labels ? "," : "";
    labels = labels ? labels : "";
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s_bucket{%s%sle=\"%.9g\"} %llu\n", name, labels, sep, bounds[i],
                (unsigned long long)cumulative[i]);
    fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)count);
    if (*labels) {
        fprintf(f, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels, sum, name, labels,
                (unsigned long long)count);
    } else {
        fprintf(f, "%s_sum %.9g\n%s_count %llu\n", name, sum, name, (unsigned long long)count);
    }
}

/* ---- HTTP ---- */

struct carls_prom_server {
    carls_prom_render_fn render;
    void *ctx;
    struct MHD_Daemon *daemon;
    uint16_t port;
    atomic_uint_fast64_t scrapes;
};

static void s_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    LOG_WARN("metrics http: %s", line);
}

static enum MHD_Result s_reply_text(struct MHD_Connection *conn, unsigned int status, const char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result s_handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                const char *version, const char *upload_data, size_t *upload_data_size,
                                void **con_cls)
{
    (void)version;
    (void)upload_data;
    (void)con_cls;
    carls_prom_server_t *self = cls;
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0, head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!get && !head) {
        *upload_data_size = 0; /* whatever body came is ignored */
        return s_reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    if (strcmp(url, "/metrics") != 0)
        return s_reply_text(conn, MHD_HTTP_NOT_FOUND, "not found: metrics are on /metrics\n");
    char *text = NULL;
    size_t len = 0;
    if (self->render(self->ctx, &text, &len) != 0)
        return s_reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "metrics unavailable\n");
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    atomic_fetch_add(&self->scrapes, 1);
    return rc;
}

int carls_prom_server_start(carls_prom_render_fn render, void *ctx, const char *address, uint16_t port,
                            carls_prom_server_t **out, char *err, size_t errlen)
{
    assert(render && address && out);
    *out = NULL;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (inet_pton(AF_INET, address, &addr.sin_addr) != 1)
        return carls_errorf(err, errlen, -1, "metrics address '%s' is not an IPv4 address", address);
    carls_prom_server_t *self = carls_xcalloc(1, sizeof *self);
    self->render = render;
    self->ctx = ctx;
    atomic_init(&self->scrapes, 0);
    /* The logger first: libmicrohttpd logs option errors as it reads the options. */
    self->daemon = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, port, NULL, NULL, s_handle,
                                    self, MHD_OPTION_EXTERNAL_LOGGER, s_mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
                                    (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)16,
                                    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10, MHD_OPTION_END);
    if (!self->daemon) {
        free(self);
        return carls_errorf(err, errlen, -1, "cannot serve metrics on %s:%u (port in use, or not allowed)", address,
                            port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(self->daemon, MHD_DAEMON_INFO_BIND_PORT);
    self->port = info ? info->port : port;
    *out = self;
    return 0;
}

uint16_t carls_prom_server_port(const carls_prom_server_t *self) { return self->port; }

uint64_t carls_prom_server_scrapes(const carls_prom_server_t *self)
{
    return atomic_load(&((carls_prom_server_t *)self)->scrapes);
}

void carls_prom_server_stop(carls_prom_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    MHD_stop_daemon((*self_p)->daemon);
    free(*self_p);
    *self_p = NULL;
}

/* ---- a program's progress ---- */

struct carls_prom_progress {
    pthread_mutex_t mu;
    char program[32];
    char *labels;                /* escaped info labels, or NULL */
    uint64_t steps, items;       /* totals */
    double work_s, wait_s;       /* totals */
    double rate, wait_ratio;     /* the latest report's */
    int64_t step, planned;
    bool has_eval;
    double loss, score;
};

carls_prom_progress_t *carls_prom_progress_new(const char *program, const char *labels)
{
    carls_prom_progress_t *self = carls_xcalloc(1, sizeof *self);
    pthread_mutex_init(&self->mu, NULL);
    snprintf(self->program, sizeof self->program, "%s", program);
    if (labels && *labels) {
        self->labels = carls_xmalloc(strlen(labels) + 1);
        strcpy(self->labels, labels);
    }
    return self;
}

void carls_prom_progress_add(carls_prom_progress_t *self, uint64_t steps, uint64_t items, double work_s,
                             double bank_wait_s)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->mu);
    self->steps += steps;
    self->items += items;
    self->work_s += work_s;
    self->wait_s += bank_wait_s;
    self->rate = work_s > 0 ? (double)items / work_s : 0.0;
    self->wait_ratio = work_s > 0 ? bank_wait_s / work_s : 0.0;
    pthread_mutex_unlock(&self->mu);
}

void carls_prom_progress_set_step(carls_prom_progress_t *self, int64_t step, int64_t planned)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->mu);
    self->step = step;
    self->planned = planned;
    pthread_mutex_unlock(&self->mu);
}

void carls_prom_progress_set_eval(carls_prom_progress_t *self, double loss, double score)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->mu);
    self->has_eval = true;
    self->loss = loss;
    self->score = score;
    pthread_mutex_unlock(&self->mu);
}

/* One metric of the progress family: carls_<program>_<what>. */
static void s_progress_metric(FILE *f, const carls_prom_progress_t *p, const char *what, const char *type,
                              double value, const char *help)
{
    char name[96];
    snprintf(name, sizeof name, "carls_%s_%s", p->program, what);
    carls_prom_metric(f, name, type, value, help);
}

int carls_prom_progress_render(void *ctx, char **text_out, size_t *len_out)
{
    carls_prom_progress_t *p = ctx;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return -1;
    pthread_mutex_lock(&p->mu);
    char name[96];
    snprintf(name, sizeof name, "carls_%s_info", p->program);
    carls_prom_family(f, name, "gauge", "What this process is, as labels (value 1).");
    fprintf(f, "%s{%s} 1\n", name, p->labels ? p->labels : "");
    s_progress_metric(f, p, "steps_total", "counter", (double)p->steps, "Steps (trainer) or passes (maker) done.");
    s_progress_metric(f, p, "items_total", "counter", (double)p->items,
                      "Items processed: training examples, or items a maker computed knowledge for.");
    s_progress_metric(f, p, "work_seconds_total", "counter", p->work_s,
                      "Seconds spent on the steps counted (bank waits included).");
    s_progress_metric(f, p, "bank_wait_seconds_total", "counter", p->wait_s,
                      "Seconds of that work spent waiting for the knowledge bank.");
    s_progress_metric(f, p, "items_per_second", "gauge", p->rate, "Items per second over the latest report.");
    s_progress_metric(f, p, "bank_wait_ratio", "gauge", p->wait_ratio,
                      "Share of the latest report's time spent waiting for the bank (0..1).");
    s_progress_metric(f, p, "step", "gauge", (double)p->step, "The latest step (a maker: the checkpoint's).");
    s_progress_metric(f, p, "steps_planned", "gauge", (double)p->planned, "Steps the run will take (0: open-ended).");
    if (p->has_eval) {
        s_progress_metric(f, p, "eval_loss", "gauge", p->loss, "Loss at the latest evaluation.");
        s_progress_metric(f, p, "eval_score", "gauge", p->score,
                          "Score at the latest evaluation: accuracy, or the experiment's recall (0..1).");
    }
    pthread_mutex_unlock(&p->mu);
    if (fclose(f) != 0) {
        free(text);
        return -1;
    }
    *text_out = text;
    *len_out = len;
    return 0;
}

void carls_prom_progress_destroy(carls_prom_progress_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    pthread_mutex_destroy(&(*self_p)->mu);
    free((*self_p)->labels);
    free(*self_p);
    *self_p = NULL;
}
