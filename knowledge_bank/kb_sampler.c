/* Candidate sampler; the contracts and the distributions are in kb_sampler.h. */
#include "kb_sampler.h"

#include "kb_memory.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define KB_SAMPLER_UNIGRAM_POWER 0.75

/* (row id, snapshot index), sorted by row id for kb_sampler_prob_of. */
typedef struct {
    int64_t row_id;
    size_t index;
} sampler_key_t;

struct kb_sampler {
    kb_sampler_strategy_t strategy;
    size_t n;               /* entries */
    int64_t *row_ids;       /* (n) row id by snapshot index */
    double *prob;           /* (n) P(index) for one draw */
    sampler_key_t *by_id;   /* (n) sorted by row id */
    double mass;            /* see kb_sampler_mass */
    /* log-uniform */
    size_t *rank_to_index;  /* (n) snapshot index of rank r (rank 0: most frequent) */
    double log_n1;          /* log(N + 1) */
    /* unigram (Vose's alias method) */
    double *alias_cut;      /* (n) keep column i when u < alias_cut[i] */
    size_t *alias;          /* (n) otherwise take alias[i] */
};

/* Each strategy's name, for parsing and printing alike ("log-uniform" is parsed too). */
static const char *const s_strategy_names[] = {
    [KB_SAMPLER_UNIFORM] = "uniform",
    [KB_SAMPLER_LOG_UNIFORM] = "log_uniform",
    [KB_SAMPLER_UNIGRAM] = "unigram",
};

#define S_N_STRATEGIES (sizeof s_strategy_names / sizeof s_strategy_names[0])

int kb_sampler_strategy_parse(const char *name, kb_sampler_strategy_t *out)
{
    if (name && strcmp(name, "log-uniform") == 0) {
        name = s_strategy_names[KB_SAMPLER_LOG_UNIFORM];
    }
    int s = carls_name_index(name, s_strategy_names, (int)S_N_STRATEGIES);
    if (s < 0 || strcmp(name, s_strategy_names[s]) != 0) { /* the names in lower case only */
        return -EINVAL;
    }
    *out = (kb_sampler_strategy_t)s;
    return 0;
}

const char *kb_sampler_strategy_name(kb_sampler_strategy_t strategy)
{
    return (size_t)strategy < S_N_STRATEGIES ? s_strategy_names[strategy] : "?";
}

/* ---- random numbers ---- */

/* Uniform in [0, 1) with 53 random bits. */
static double s_unit(uint64_t *rng)
{
    return (double)(carls_splitmix64(rng) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n), n > 0, without modulo bias: values below 2^64 mod n are redrawn (rare unless n is
 * close to 2^64), so every residue is equally likely. */
static size_t s_below(uint64_t *rng, size_t n)
{
    uint64_t threshold = (0 - (uint64_t)n) % (uint64_t)n; /* 2^64 mod n */
    for (;;) {
        uint64_t x = carls_splitmix64(rng);
        if (x >= threshold) {
            return (size_t)(x % (uint64_t)n);
        }
    }
}

/* ---- construction ---- */

/* Orders by row id. */
static int s_cmp_key(const void *a, const void *b)
{
    const sampler_key_t *x = a, *y = b;
    return x->row_id < y->row_id ? -1 : x->row_id > y->row_id;
}

/* (frequency, snapshot index) for ranking. */
typedef struct {
    uint64_t frequency;
    size_t index;
} sampler_rank_t;

/* Ranking for log-uniform: higher frequency first, then lower snapshot index (a stable order). */
static int s_cmp_rank(const void *a, const void *b)
{
    const sampler_rank_t *x = a, *y = b;
    if (x->frequency != y->frequency) {
        return x->frequency > y->frequency ? -1 : 1;
    }
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Ranks the entries and sets P(index) = P(rank of index) (kb_sampler.h). */
static void s_build_log_uniform(kb_sampler_t *self, const kb_sampler_entry_t *entries)
{
    size_t n = self->n;
    sampler_rank_t *order = carls_xmalloc(n * sizeof(sampler_rank_t));
    for (size_t i = 0; i < n; i++) {
        order[i].frequency = entries[i].frequency;
        order[i].index = i;
    }
    qsort(order, n, sizeof(sampler_rank_t), s_cmp_rank);
    self->rank_to_index = carls_xmalloc(n * sizeof(size_t));
    for (size_t r = 0; r < n; r++) {
        self->rank_to_index[r] = order[r].index;
    }
    free(order);
    self->log_n1 = log1p((double)n);
    for (size_t r = 0; r < n; r++) {
        /* log(r+2) - log(r+1) = log1p(1/(r+1)), without the cancellation of two close logs. */
        self->prob[self->rank_to_index[r]] = log1p(1.0 / (double)(r + 1)) / self->log_n1;
    }
    self->mass = (double)n;
}

/* Vose's alias method: column i of an N-column table keeps i with probability alias_cut[i] and otherwise
 * gives alias[i]; columns are picked uniformly, so P(i) = (alias_cut[i] + sum over columns aliased to i of
 * (1 - cut)) / N = w_i / W. */
static void s_build_unigram(kb_sampler_t *self, const kb_sampler_entry_t *entries)
{
    size_t n = self->n;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        double w = entries[i].frequency ? pow((double)entries[i].frequency, KB_SAMPLER_UNIGRAM_POWER) : 0.0;
        self->prob[i] = w;
        total += w;
    }
    self->mass = total;
    if (total <= 0.0) {
        return; /* nothing to draw; prob stays all zero */
    }
    self->alias_cut = carls_xmalloc(n * sizeof(double));
    self->alias = carls_xmalloc(n * sizeof(size_t));
    size_t *small = carls_xmalloc(n * sizeof(size_t));
    size_t *large = carls_xmalloc(n * sizeof(size_t));
    size_t ns = 0, nl = 0;
    for (size_t i = 0; i < n; i++) {
        self->prob[i] /= total;
        self->alias_cut[i] = self->prob[i] * (double)n; /* scaled so that the mean is 1 */
        self->alias[i] = i;
        if (self->alias_cut[i] < 1.0) {
            small[ns++] = i;
        } else {
            large[nl++] = i;
        }
    }
    while (ns > 0 && nl > 0) {
        size_t s = small[--ns], l = large[nl - 1];
        self->alias[s] = l; /* column s: keep s with cut[s], else l */
        self->alias_cut[l] -= 1.0 - self->alias_cut[s];
        if (self->alias_cut[l] < 1.0) {
            nl--;
            small[ns++] = l;
        }
    }
    /* What is left is 1 up to rounding: those columns always keep their own entry. */
    while (nl > 0) {
        self->alias_cut[large[--nl]] = 1.0;
    }
    while (ns > 0) {
        size_t s = small[--ns];
        /* A zero-weight entry must never be kept, even if rounding left it here. */
        self->alias_cut[s] = self->prob[s] > 0.0 ? 1.0 : 0.0;
        if (self->prob[s] <= 0.0 && self->alias[s] == s) {
            /* Its column needs some drawable alias; any positive-weight entry has cut 1 or a valid alias. */
            for (size_t j = 0; j < n; j++) {
                if (self->prob[j] > 0.0) {
                    self->alias[s] = j;
                    break;
                }
            }
        }
    }
    free(small);
    free(large);
}

int kb_sampler_new(kb_sampler_strategy_t strategy, const kb_sampler_entry_t *entries, size_t n, kb_sampler_t **out)
{
    assert(out);
    *out = NULL;
    if (strategy != KB_SAMPLER_UNIFORM && strategy != KB_SAMPLER_LOG_UNIFORM && strategy != KB_SAMPLER_UNIGRAM) {
        return -EINVAL;
    }
    if (n > 0 && !entries) {
        return -EINVAL;
    }
    kb_sampler_t *self = carls_xcalloc(1, sizeof(*self));
    self->strategy = strategy;
    self->n = n;
    if (n == 0) {
        *out = self;
        return 0;
    }
    self->row_ids = carls_xmalloc(n * sizeof(int64_t));
    self->prob = carls_xcalloc(n, sizeof(double));
    self->by_id = carls_xmalloc(n * sizeof(sampler_key_t));
    for (size_t i = 0; i < n; i++) {
        self->row_ids[i] = entries[i].row_id;
        self->by_id[i].row_id = entries[i].row_id;
        self->by_id[i].index = i;
    }
    qsort(self->by_id, n, sizeof(sampler_key_t), s_cmp_key);
    for (size_t i = 1; i < n; i++) {
        if (self->by_id[i].row_id == self->by_id[i - 1].row_id) {
            kb_sampler_destroy(&self);
            return -EINVAL;
        }
    }
    switch (strategy) {
    case KB_SAMPLER_UNIFORM:
        for (size_t i = 0; i < n; i++) {
            self->prob[i] = 1.0 / (double)n;
        }
        self->mass = (double)n;
        break;
    case KB_SAMPLER_LOG_UNIFORM:
        s_build_log_uniform(self, entries);
        break;
    case KB_SAMPLER_UNIGRAM:
        s_build_unigram(self, entries);
        break;
    }
    *out = self;
    return 0;
}

void kb_sampler_destroy(kb_sampler_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    kb_sampler_t *self = *self_p;
    free(self->row_ids);
    free(self->prob);
    free(self->by_id);
    free(self->rank_to_index);
    free(self->alias_cut);
    free(self->alias);
    free(self);
    *self_p = NULL;
}

/* ---- drawing ---- */

/* One draw: a snapshot index. The sampler can draw (mass > 0). */
static size_t s_draw_one(const kb_sampler_t *self, uint64_t *rng)
{
    switch (self->strategy) {
    case KB_SAMPLER_UNIFORM:
        return s_below(rng, self->n);
    case KB_SAMPLER_LOG_UNIFORM: {
        double x = exp(s_unit(rng) * self->log_n1) - 1.0; /* in [0, N) up to rounding */
        size_t r = x <= 0.0 ? 0 : (size_t)x;
        if (r >= self->n) {
            r = self->n - 1;
        }
        return self->rank_to_index[r];
    }
    case KB_SAMPLER_UNIGRAM: {
        size_t col = s_below(rng, self->n);
        return s_unit(rng) < self->alias_cut[col] ? col : self->alias[col];
    }
    }
    return 0;
}

int kb_sampler_draw(const kb_sampler_t *self, uint64_t *rng, size_t n, size_t *out_index, int64_t *out_row_id,
                    double *out_prob)
{
    assert(self);
    if (n == 0) {
        return 0;
    }
    if (!rng || !out_index) {
        return -EINVAL;
    }
    if (self->n == 0 || self->mass <= 0.0) {
        return -ENODATA;
    }
    for (size_t j = 0; j < n; j++) {
        size_t i = s_draw_one(self, rng);
        out_index[j] = i;
        if (out_row_id) {
            out_row_id[j] = self->row_ids[i];
        }
        if (out_prob) {
            out_prob[j] = self->prob[i];
        }
    }
    return 0;
}

double kb_sampler_prob_at(const kb_sampler_t *self, size_t index)
{
    assert(self);
    return index < self->n ? self->prob[index] : 0.0;
}

int kb_sampler_prob_of(const kb_sampler_t *self, int64_t row_id, double *prob, size_t *index)
{
    assert(self && prob);
    *prob = 0.0;
    if (self->n == 0) {
        return -ENOENT;
    }
    sampler_key_t key = {row_id, 0};
    const sampler_key_t *hit = bsearch(&key, self->by_id, self->n, sizeof(sampler_key_t), s_cmp_key);
    if (!hit) {
        return -ENOENT;
    }
    *prob = self->prob[hit->index];
    if (index) {
        *index = hit->index;
    }
    return 0;
}

size_t kb_sampler_size(const kb_sampler_t *self)
{
    assert(self);
    return self->n;
}

size_t kb_sampler_memory(const kb_sampler_t *self)
{
    assert(self);
    size_t n = self->n ? self->n : 1;
    size_t bytes = kb_memory_chunk(sizeof *self) + kb_memory_chunk(n * sizeof(int64_t)) +
                   kb_memory_chunk(n * sizeof(double)) + kb_memory_chunk(n * sizeof(sampler_key_t));
    if (self->rank_to_index)
        bytes += kb_memory_chunk(n * sizeof(size_t));
    if (self->alias_cut)
        bytes += kb_memory_chunk(n * sizeof(double)) + kb_memory_chunk(n * sizeof(size_t));
    return bytes;
}

double kb_sampler_mass(const kb_sampler_t *self)
{
    assert(self);
    return self->mass;
}

kb_sampler_strategy_t kb_sampler_strategy(const kb_sampler_t *self)
{
    assert(self);
    return self->strategy;
}
