/* trainer: trains models for carls-c and writes the checkpoints knowledge makers read. */
#include "trainer.h"
#include "trainer_graphreg.h"
#include "trainer_w2v.h"

#include "log.h"
#include "prom.h"
#include "trainer_util.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer [--metrics-port P [--metrics-address A]] <command> [options]\n"
            "  --metrics-port P     serve the run's progress (carls_trainer_*: steps, examples/s, bank wait share,\n"
            "                       latest evaluation) for Prometheus on http://A:P/metrics (0: a free port, logged)\n"
            "  --metrics-address A  IPv4 address for --metrics-port (default 127.0.0.1; no authentication)\n"
            "commands:\n"
            "  supervised   train an MLP encoder + softmax classifier on Fashion-MNIST\n"
            "  graphreg     semi-supervised: labels + bank pseudo-labels + graph regulariser (neighbours from the bank)\n"
            "  word2vec     skip-gram word vectors whose vocabulary lives in the knowledge bank (no dictionary)\n"
            "  twotower     reverse dictionary on GCIDE: two towers, rows and negatives from the bank\n"
            "  w2v-eval     score word vectors (word2vec text files): hand-made pairs, word groups, overlap\n"
            "  gcide-tfidf  reverse dictionary on GCIDE: TF-IDF baseline ranking headwords for held-out definitions\n"
            "  inspect      print what a checkpoint file (or a checkpoint directory's latest) holds\n"
            "  bench-sgemm  measure sgemm FLOP/s (OpenBLAS on the CPU, cuBLAS on a GPU)\n"
            "run 'trainer <command> --help' for a command's options\n");
}

/* Runs the command argv[1]. */
static int s_command(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        s_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "supervised") == 0) {
        return trainer_supervised_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "graphreg") == 0) {
        return trainer_graphreg_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "word2vec") == 0) {
        return trainer_word2vec_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "twotower") == 0) {
        return trainer_twotower_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "w2v-eval") == 0) {
        return trainer_w2v_eval_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "gcide-tfidf") == 0) return trainer_gcide_tfidf_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "inspect") == 0) {
        return trainer_inspect_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "bench-sgemm") == 0) {
        return trainer_bench_main(argc - 1, argv + 1);
    }
    fprintf(stderr, "trainer: unknown command '%s'\n", argv[1]);
    s_usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    carls_log_init_from_env();
    int port = -1;
    const char *address = "127.0.0.1";
    while (argc >= 3 && (strcmp(argv[1], "--metrics-port") == 0 || strcmp(argv[1], "--metrics-address") == 0)) {
        if (strcmp(argv[1], "--metrics-port") == 0) {
            int64_t v;
            if (carls_parse_i64(argv[2], &v) != 0 || v < 0 || v > 65535) {
                fprintf(stderr, "trainer: --metrics-port '%s' is not a port (0..65535)\n", argv[2]);
                return 2;
            }
            port = (int)v;
        } else {
            address = argv[2];
        }
        argv[2] = argv[0];
        argc -= 2;
        argv += 2;
    }
    carls_prom_server_t *http = NULL;
    if (port >= 0) {
        char err[256];
        trainer_prom = carls_prom_progress_new("trainer", NULL);
        if (carls_prom_server_start(carls_prom_progress_render, trainer_prom, address, (uint16_t)port, &http, err,
                                    sizeof err) != 0) {
            fprintf(stderr, "trainer: %s\n", err);
            carls_prom_progress_destroy(&trainer_prom);
            return 2;
        }
        LOG_INFO("metrics: http://%s:%u/metrics", address, carls_prom_server_port(http));
    }
    int rc = s_command(argc, argv);
    carls_prom_server_stop(&http);
    carls_prom_progress_destroy(&trainer_prom);
    return rc;
}
