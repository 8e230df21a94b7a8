/* carls: the experiment launcher (see carls_run.h; with --slurm, carls_slurm.h). */
#include "carls_run.h"
#include "carls_slurm.h"

#include "log.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    if (argc >= 2 && strcmp(argv[1], "run") == 0) {
        if (argc >= 3 && strcmp(argv[2], "--help") == 0) {
            int st = carls_run_main(argc - 1, argv + 1);
            carls_slurm_print_help(stdout);
            return st;
        }
        int n = argc - 1;
        char **args = argv + 1;
        char *orig[argc];
        memcpy(orig, args, (size_t)argc * sizeof *orig); /* args[0..n-1] and the NULL after them */
        int mode = carls_slurm_take_args(&n, args);
        if (mode == 2) {
            return 2;
        }
        if (mode == 1 && n >= 2 && strcmp(args[1], "--resume") == 0) {
            fprintf(stderr, "carls: --resume is for local runs; it does not go with --slurm\n");
            return 2;
        }
        if (mode == 1 && !carls_slurm_in_allocation()) {
            return carls_slurm_allocate(orig);
        }
        return carls_run_main(n, args);
    }
    FILE *out = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) ? stdout : stderr;
    fprintf(out, "usage: carls run CONFIG.ini [--set key=value]... [--quiet] [--slurm [--slurm-nodes N] ...]\n"
                 "  runs one experiment (kb-server, maker fleets, trainer) and writes runs/<name>/\n"
                 "  example: carls run experiments/graphreg.ini --set label_seed=3\n"
                 "  --slurm: the same experiment as one Slurm job across nodes (carls run --help, docs/SLURM.md)\n");
    return out == stdout ? 0 : 2;
}
