#include "kb_dedup.h"

#include "kb_memory.h"

#include "util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t client_id; /* 0 = empty slot */
    uint64_t max_seq;
    uint8_t window[KB_DEDUP_WINDOW_BYTES]; /* bit i: max_seq - i has been applied */
    bool dirty;
} s_client_t;

struct kb_dedup {
    pthread_mutex_t mutex;
    s_client_t *slots; /* open addressing, capacity a power of two */
    size_t capacity, count;
};

kb_dedup_t *kb_dedup_new(void)
{
    kb_dedup_t *self = carls_xcalloc(1, sizeof *self);
    pthread_mutex_init(&self->mutex, NULL);
    self->capacity = 64;
    self->slots = carls_xcalloc(self->capacity, sizeof *self->slots);
    return self;
}

void kb_dedup_destroy(kb_dedup_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_dedup_t *self = *self_p;
    pthread_mutex_destroy(&self->mutex);
    free(self->slots);
    free(self);
    *self_p = NULL;
}

static s_client_t *s_find_slot(s_client_t *slots, size_t capacity, uint64_t client_id)
{
    uint64_t state = client_id;
    size_t mask = capacity - 1;
    for (size_t i = carls_splitmix64(&state) & mask;; i = (i + 1) & mask)
        if (slots[i].client_id == client_id || slots[i].client_id == 0)
            return &slots[i];
}

/* The client's slot, created if absent. Called with the mutex held. */
static s_client_t *s_client(kb_dedup_t *self, uint64_t client_id)
{
    s_client_t *c = s_find_slot(self->slots, self->capacity, client_id);
    if (c->client_id == client_id)
        return c;
    if ((self->count + 1) * 2 > self->capacity) {
        size_t cap = self->capacity * 2;
        s_client_t *slots = carls_xcalloc(cap, sizeof *slots);
        for (size_t i = 0; i < self->capacity; i++)
            if (self->slots[i].client_id)
                *s_find_slot(slots, cap, self->slots[i].client_id) = self->slots[i];
        free(self->slots);
        self->slots = slots;
        self->capacity = cap;
        c = s_find_slot(self->slots, self->capacity, client_id);
    }
    memset(c, 0, sizeof *c);
    c->client_id = client_id;
    self->count++;
    return c;
}

static bool s_bit(const uint8_t *w, uint64_t i) { return (w[i / 8] >> (i % 8)) & 1u; }
static void s_set_bit(uint8_t *w, uint64_t i) { w[i / 8] |= (uint8_t)(1u << (i % 8)); }

/* Shifts the window so that bit 0 stands for max_seq + shift. */
static void s_shift_window(uint8_t *w, uint64_t shift)
{
    if (shift >= KB_DEDUP_WINDOW) {
        memset(w, 0, KB_DEDUP_WINDOW_BYTES);
        return;
    }
    uint8_t old[KB_DEDUP_WINDOW_BYTES];
    memcpy(old, w, sizeof old);
    memset(w, 0, KB_DEDUP_WINDOW_BYTES);
    for (uint64_t i = 0; i + shift < KB_DEDUP_WINDOW; i++)
        if (s_bit(old, i))
            s_set_bit(w, i + shift);
}

bool kb_dedup_check_and_record(kb_dedup_t *self, uint64_t client_id, uint64_t seq)
{
    pthread_mutex_lock(&self->mutex);
    s_client_t *c = s_client(self, client_id);
    bool duplicate = false;
    if (seq > c->max_seq) {
        s_shift_window(c->window, seq - c->max_seq);
        c->max_seq = seq;
        s_set_bit(c->window, 0);
        c->dirty = true;
    } else {
        uint64_t age = c->max_seq - seq;
        if (age >= KB_DEDUP_WINDOW || s_bit(c->window, age)) {
            duplicate = true;
        } else {
            s_set_bit(c->window, age);
            c->dirty = true;
        }
    }
    pthread_mutex_unlock(&self->mutex);
    return duplicate;
}

void kb_dedup_forget(kb_dedup_t *self, uint64_t client_id, uint64_t seq)
{
    pthread_mutex_lock(&self->mutex);
    s_client_t *c = s_client(self, client_id);
    if (seq <= c->max_seq && c->max_seq - seq < KB_DEDUP_WINDOW) {
        uint64_t age = c->max_seq - seq;
        c->window[age / 8] &= (uint8_t) ~(1u << (age % 8));
        c->dirty = true;
    }
    pthread_mutex_unlock(&self->mutex);
}

int kb_dedup_restore(kb_dedup_t *self, uint64_t client_id, uint64_t max_seq, const uint8_t *window, size_t len)
{
    if (client_id == 0 || len != KB_DEDUP_WINDOW_BYTES)
        return -1;
    pthread_mutex_lock(&self->mutex);
    s_client_t *c = s_client(self, client_id);
    c->max_seq = max_seq;
    memcpy(c->window, window, KB_DEDUP_WINDOW_BYTES);
    c->dirty = false;
    pthread_mutex_unlock(&self->mutex);
    return 0;
}

size_t kb_dedup_take_dirty(kb_dedup_t *self, kb_dedup_record_t **out, size_t *capacity)
{
    size_t n = 0;
    pthread_mutex_lock(&self->mutex);
    for (size_t i = 0; i < self->capacity; i++) {
        s_client_t *c = &self->slots[i];
        if (!c->client_id || !c->dirty)
            continue;
        if (n == *capacity) {
            *capacity = *capacity ? *capacity * 2 : 16;
            *out = carls_xrealloc(*out, *capacity * sizeof **out);
        }
        (*out)[n].client_id = c->client_id;
        (*out)[n].max_seq = c->max_seq;
        memcpy((*out)[n].window, c->window, KB_DEDUP_WINDOW_BYTES);
        c->dirty = false;
        n++;
    }
    pthread_mutex_unlock(&self->mutex);
    return n;
}

size_t kb_dedup_memory(kb_dedup_t *self)
{
    pthread_mutex_lock(&self->mutex);
    size_t bytes = kb_memory_chunk(sizeof *self) + kb_memory_chunk(self->capacity * sizeof *self->slots);
    pthread_mutex_unlock(&self->mutex);
    return bytes;
}

size_t kb_dedup_client_count(kb_dedup_t *self)
{
    pthread_mutex_lock(&self->mutex);
    size_t n = self->count;
    pthread_mutex_unlock(&self->mutex);
    return n;
}
