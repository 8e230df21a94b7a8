/* Prometheus metrics: the text exposition format (0.0.4) and a small HTTP server for /metrics, shared by every
 * program that exports metrics (kb-server's kb_metrics, the trainer, kb-maker) so that one Prometheus can watch
 * a whole run, and `promtool check metrics` accepts each page.
 *
 * Naming, as Prometheus asks: carls_<program>_<what>_<unit>, counters end in _total, times in seconds, sizes
 * in bytes, latencies are histograms (_bucket with cumulative le labels ending at +Inf, _sum, _count) so they
 * can be aggregated over shards and processes.
 *
 * The HTTP server (libmicrohttpd, its own thread) answers GET and HEAD of /metrics with the text a callback
 * renders (200, text/plain; version=0.0.4), anything else with 404 or 405; at most 16 connections at a time
 * with a 10 s idle timeout. There is no authentication: bind it to loopback (the default) or a trusted
 * network. This is the only network code in base/, and it knows nothing of ZeroMQ or protobuf. */
#ifndef CARLS_PROM_H
#define CARLS_PROM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- text ---- */

/* "# HELP name help" and "# TYPE name type" (type: counter, gauge, histogram, summary, untyped). */
void carls_prom_family(FILE *f, const char *name, const char *type, const char *help);

/* A label value with Prometheus's escapes (backslash, double quote, newline); NULL writes nothing. */
void carls_prom_label_value(FILE *f, const char *value);

/* A metric without labels: its family and its one sample. */
void carls_prom_metric(FILE *f, const char *name, const char *type, double value, const char *help);

/* The samples of one histogram series: name_bucket{LABELS,le="b"} for each of the n bounds (ascending, in the
 * family's unit) with its cumulative count, le="+Inf" with count, then name_sum and name_count. labels is the
 * already-escaped text inside the braces without a trailing comma ("" or NULL: none). The family line is the
 * caller's (carls_prom_family with type "histogram"). */
void carls_prom_histogram(FILE *f, const char *name, const char *labels, const double *bounds,
                          const uint64_t *cumulative, size_t n, uint64_t count, double sum);

/* ---- HTTP ---- */

/* Renders the page: 0 with *text (malloc'd, caller frees) and *len, or -1 (answered with a 500). Called on
 * the server's thread, one scrape at a time or concurrently: the callback synchronises what it reads. */
typedef int (*carls_prom_render_fn)(void *ctx, char **text, size_t *len);

typedef struct carls_prom_server carls_prom_server_t;

/* Serves /metrics on address:port (IPv4; port 0 picks a free one) from render(ctx) (ctx borrowed: it must
 * outlive the server). Returns 0 and *out (caller owns it), or -1 with *out NULL and a one-line reason in err. */
int carls_prom_server_start(carls_prom_render_fn render, void *ctx, const char *address, uint16_t port,
                            carls_prom_server_t **out, char *err, size_t errlen);

/* The port actually bound. */
uint16_t carls_prom_server_port(const carls_prom_server_t *self);

/* Scrapes answered so far (GET or HEAD of /metrics with a 200). */
uint64_t carls_prom_server_scrapes(const carls_prom_server_t *self);

/* Stops the HTTP thread (waiting for scrapes in progress) and frees the server. Accepts NULL; nulls *self_p. */
void carls_prom_server_stop(carls_prom_server_t **self_p);

/* ---- a program's progress ---- */

/* The progress of a long-running program (the trainer, a maker) as metrics, prefix carls_<program>_:
 *   steps_total, items_total, work_seconds_total, bank_wait_seconds_total   counters (what carls_prom_progress_add
 *                                                                            adds up)
 *   items_per_second, bank_wait_ratio    gauges: the latest report's rate and the share of its time spent
 *                                        waiting for the bank (Prometheus can also take rate() of the counters)
 *   step, steps_planned                  gauges (carls_prom_progress_set_step)
 *   eval_loss, eval_score                gauges: the latest evaluation (accuracy, or the experiment's recall)
 *   info{LABELS} 1                       what the process is (labels given at creation)
 * Every function accepts NULL (and then does nothing), so callers report unconditionally. Thread-safe. */
typedef struct carls_prom_progress carls_prom_progress_t;

/* program: "trainer", "maker" (a metric-name part); labels: escaped label text for the info metric, e.g.
 * "experiment=\"graphreg\"" (NULL: none). Caller owns the result. */
carls_prom_progress_t *carls_prom_progress_new(const char *program, const char *labels);
void carls_prom_progress_add(carls_prom_progress_t *self, uint64_t steps, uint64_t items, double work_s,
                             double bank_wait_s);
void carls_prom_progress_set_step(carls_prom_progress_t *self, int64_t step, int64_t planned);
void carls_prom_progress_set_eval(carls_prom_progress_t *self, double loss, double score);
/* A carls_prom_render_fn over a carls_prom_progress_t (ctx). */
int carls_prom_progress_render(void *ctx, char **text, size_t *len);
/* Stops nothing: the caller stops its server first. Accepts NULL; nulls *self_p. */
void carls_prom_progress_destroy(carls_prom_progress_t **self_p);

#endif
