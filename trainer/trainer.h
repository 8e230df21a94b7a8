/* The trainer's subcommands. Each takes the arguments after the subcommand's name (argv[0] is the
 * subcommand) and returns the process exit status: 0 success, 1 failure at run time, 2 bad usage. */
#ifndef TRAINER_H
#define TRAINER_H

/* trainer supervised: MLP encoder + softmax classifier on Fashion-MNIST (trainer_supervised.c). */
int trainer_supervised_main(int argc, char **argv);
/* trainer inspect FILE|DIR: what a checkpoint holds (trainer_inspect.c). */
int trainer_inspect_main(int argc, char **argv);
/* trainer bench-sgemm: OpenBLAS (or cuBLAS) sgemm FLOP/s, the yardstick for the training loop (trainer_bench.c). */
int trainer_bench_main(int argc, char **argv);
/* trainer twotower: reverse dictionary on GCIDE, rows and negatives in the bank (trainer_twotower.c). */
int trainer_twotower_main(int argc, char **argv);
/* trainer gcide-tfidf: the TF-IDF reverse-dictionary baseline on GCIDE (trainer_gcide_cmd.c). */
int trainer_gcide_tfidf_main(int argc, char **argv);

#endif
