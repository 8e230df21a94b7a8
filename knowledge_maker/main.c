/* kb-maker: a knowledge maker (see km_maker.h). SIGTERM/SIGINT end it cleanly. */
#include "km_maker.h"

#include "log.h"

#include <signal.h>
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
    return km_maker_run(&o, &s_stop);
}
