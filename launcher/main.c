/* carls: the experiment launcher (see carls_run.h). */
#include "carls_run.h"

#include "log.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    if (argc >= 2 && strcmp(argv[1], "run") == 0) {
        return carls_run_main(argc - 1, argv + 1);
    }
    FILE *out = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) ? stdout : stderr;
    fprintf(out, "usage: carls run CONFIG.ini [--set key=value]... [--quiet]\n"
                 "  runs one experiment (kb-server, maker fleets, trainer) and writes runs/<name>/\n"
                 "  example: carls run experiments/graphreg.ini --set label_seed=3\n");
    return out == stdout ? 0 : 2;
}
