/* Prometheus metrics for kb-server: the `stats` answer rendered as Prometheus text (exposition format
 * 0.0.4) and served over HTTP on /metrics by libmicrohttpd (kb-server --metrics-port).
 *
 * Everything a `stats` request answers is exported (kbctl stats shows the same): server-wide request,
 * error, malformed-frame and duplicate-write counters, commits, uptime, and per operation the request count
 * and latency; per table (label table="NAME"): rows, estimated bytes, requests and latency per
 * operation, request errors, pending gradients, gradients received/applied, outliers dropped, optimizer
 * steps by trigger, keys looked up, rows put, admission (not admitted / not persisted), evictions, and the
 * nearest-neighbour index's size, staleness (pending changes, seconds since the last build) and builds.
 * Counters end in _total. Latencies are histograms in seconds (carls_bank_request_duration_seconds{op} and
 * carls_bank_table_request_duration_seconds{table,op}: _bucket at le = 2^i microseconds, exact, _sum, _count;
 * from the summaries' le_counts, which the server fills with kb_latency_summarize), so Prometheus can aggregate
 * them over shards, plus their maxima as gauges (..._max_seconds). Metric names start with carls_bank_ and
 * `promtool check metrics` accepts the page with no problem (test_kb_metrics).
 *
 * The HTTP server is base/prom.h's (GET and HEAD of /metrics, its own thread, no authentication: bind it to
 * loopback, the default, or a trusted network); each scrape takes a stats snapshot (kb_service_stats_snapshot). */
#ifndef KB_METRICS_H
#define KB_METRICS_H

#include "carls.pb-c.h"
#include "kb_service.h"

#include <stddef.h>
#include <stdint.h>

/* Renders stats as Prometheus text. Returns 0 with *text_out (malloc'd, NUL-terminated; caller frees) and
 * *len_out its length without the NUL, or -1 when memory for the text could not be had. */
int kb_metrics_render(const Carls__StatsResult *stats, char **text_out, size_t *len_out);

typedef struct kb_metrics_server kb_metrics_server_t;

/* Starts serving /metrics for service (borrowed; it must outlive the server) on address:port. address is an
 * IPv4 address ("127.0.0.1", "0.0.0.0"); port 0 picks a free port (see kb_metrics_server_port). Returns 0 and
 * *out (caller owns it), or -1 with *out NULL and a one-line reason in err. */
int kb_metrics_server_start(kb_service_t *service, const char *address, uint16_t port, kb_metrics_server_t **out,
                            char *err, size_t errlen);

/* The port actually bound. */
uint16_t kb_metrics_server_port(const kb_metrics_server_t *self);

/* Scrapes answered so far (GET or HEAD of /metrics). */
uint64_t kb_metrics_server_scrapes(const kb_metrics_server_t *self);

/* Stops the HTTP thread (waiting for scrapes in progress) and frees the server. Accepts NULL; nulls *self_p. */
void kb_metrics_server_stop(kb_metrics_server_t **self_p);

#endif
