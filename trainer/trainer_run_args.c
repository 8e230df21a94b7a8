/* The trainer's shared run options (see trainer_run_args.h). */
#include "trainer_run_args.h"

#include <assert.h>
#include <string.h>

void trainer_run_args(trainer_run_args_t *g, const char **ckpt_dir, int *keep, bool *resume, const char **metrics,
                      const char **device, int *threads)
{
    assert((device == NULL) == (threads == NULL));
    *keep = 3;
    const carls_arg_t rows[] = {
        carls_arg_string("ckpt-dir", ckpt_dir),
        carls_arg_int("keep", keep, 1, 1000000),
        carls_arg_set("resume", resume),
        carls_arg_string("metrics", metrics),
        device ? carls_arg_string("device", device) : (carls_arg_t){0},
        device ? carls_arg_int("threads", threads, 1, 1024) : (carls_arg_t){0},
        {0},
    };
    _Static_assert(sizeof rows == sizeof g->rows, "trainer_run_args_t holds the rows");
    memcpy(g->rows, rows, sizeof rows);
    if (device) {
        *device = "auto";
    }
}
