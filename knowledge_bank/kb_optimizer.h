/* Server-side optimizers for embedding rows: SGD, momentum, AdaGrad, Adam.
 *
 * One call takes ONE optimizer step on one row with one gradient (for the lazy update, the outlier-filtered
 * average of the pending gradients). Per-row state lives in a float array of kb_optimizer_state_floats(kind,
 * dim) values owned by the caller (persisted with the row); `steps` counts steps taken (Adam's bias
 * correction uses it). A new row's state is all zeros except AdaGrad's accumulator, which
 * kb_optimizer_state_init() sets to initial_accumulator. */
#ifndef KB_OPTIMIZER_H
#define KB_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KB_OPT_SGD = 0,
    KB_OPT_MOMENTUM = 1,
    KB_OPT_ADAGRAD = 2,
    KB_OPT_ADAM = 3,
} kb_optimizer_kind_t;

typedef struct {
    kb_optimizer_kind_t kind;
    float learning_rate;       /* all */
    float momentum;            /* momentum: m = momentum*m + g; w -= lr*m */
    float beta1, beta2;        /* adam */
    float epsilon;             /* adagrad: w -= lr*g/(sqrt(a)+eps); adam: w -= lr*mhat/(sqrt(vhat)+eps) */
    float initial_accumulator; /* adagrad: a starts here */
} kb_optimizer_config_t;

/* Fills the documented defaults (lr 0.01, momentum 0.9, beta1 0.9, beta2 0.999, eps 1e-8 for Adam and
 * 1e-7 for AdaGrad, initial accumulator 0.1) into fields that are zero. */
void kb_optimizer_config_defaults(kb_optimizer_config_t *cfg);

/* Checks ranges (lr >= 0 and finite, 0 <= momentum < 1, 0 <= beta < 1, eps > 0, accumulator >= 0).
 * Returns 0 when valid, otherwise -1 and a message in err (size errlen). */
int kb_optimizer_config_validate(const kb_optimizer_config_t *cfg, char *err, size_t errlen);

/* Floats of state per row: SGD 0, momentum dim, AdaGrad dim, Adam 2*dim (m then v). */
uint32_t kb_optimizer_state_floats(kb_optimizer_kind_t kind, uint32_t dim);

/* Initializes a new row's state (kb_optimizer_state_floats values). */
void kb_optimizer_state_init(const kb_optimizer_config_t *cfg, float *state, uint32_t dim);

/* One step: updates weights[dim] and state in place with gradient grad[dim]; increments *steps. */
void kb_optimizer_step(const kb_optimizer_config_t *cfg, float *weights, float *state, uint64_t *steps,
                       const float *grad, uint32_t dim);

/* "sgd", "momentum", "adagrad", "adam" <-> kind. Parse returns 0 on success, -1 for an unknown name. */
const char *kb_optimizer_name(kb_optimizer_kind_t kind);
int kb_optimizer_parse(const char *name, kb_optimizer_kind_t *out);

#endif
