/* kb-maker: a knowledge maker (see km_maker.h). SIGTERM/SIGINT end it cleanly. */
#include "km_maker.h"

#include "log.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t s_stop = 0;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    km_opts_t o;
    int parsed = km_opts_parse(argc, argv, &o);
    if (parsed != 0) {
        return parsed > 0 ? 0 : 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal; /* no SA_RESTART: a blocking poll returns with EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    carls_prom_server_t *http = NULL;
    if (o.metrics_port >= 0) {
        static const char *const tasks[] = {"embed", "graph", "label", "words"};
        char labels[128], err[256];
        snprintf(labels, sizeof labels, "task=\"%s\",worker=\"%u/%u\"", tasks[o.task], o.worker, o.workers);
        km_prom = carls_prom_progress_new("maker", labels);
        if (carls_prom_server_start(carls_prom_progress_render, km_prom, o.metrics_address, (uint16_t)o.metrics_port,
                                    &http, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            carls_prom_progress_destroy(&km_prom);
            return 1;
        }
        LOG_INFO("metrics: http://%s:%u/metrics", o.metrics_address, carls_prom_server_port(http));
    }
    int rc = km_maker_run(&o, &s_stop);
    carls_prom_server_stop(&http);
    carls_prom_progress_destroy(&km_prom);
    return rc;
}
