/* trainer graphreg: semi-supervised Fashion-MNIST with a graph regulariser whose neighbour embeddings come
 * from the knowledge bank (trainer_graphreg.c). Same exit convention as trainer.h. */
#ifndef TRAINER_GRAPHREG_H
#define TRAINER_GRAPHREG_H

int trainer_graphreg_main(int argc, char **argv);

#endif
