#include "kb_memory.h"

#include "util.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

struct kb_memory {
    uint64_t limit;            /* 0 = unlimited */
    atomic_int_fast64_t used;  /* the estimate; signed so that a free racing ahead of its add stays sane */
    atomic_uint_fast64_t reserved;
};

kb_memory_t *kb_memory_new(uint64_t limit)
{
    kb_memory_t *self = carls_xcalloc(1, sizeof *self);
    self->limit = limit;
    atomic_init(&self->used, 0);
    atomic_init(&self->reserved, 0);
    return self;
}

void kb_memory_destroy(kb_memory_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free(*self_p);
    *self_p = NULL;
}

void kb_memory_add(kb_memory_t *self, int64_t delta)
{
    if (self && delta)
        atomic_fetch_add(&self->used, delta);
}

uint64_t kb_memory_used(const kb_memory_t *self)
{
    if (!self)
        return 0;
    int64_t v = atomic_load(&((kb_memory_t *)self)->used);
    return v > 0 ? (uint64_t)v : 0;
}

uint64_t kb_memory_limit(const kb_memory_t *self) { return self ? self->limit : 0; }

uint64_t kb_memory_reserved(const kb_memory_t *self)
{
    return self ? atomic_load(&((kb_memory_t *)self)->reserved) : 0;
}

int kb_memory_reserve(kb_memory_t *self, uint64_t bytes)
{
    if (!self || bytes == 0)
        return 0;
    uint64_t r = atomic_load(&self->reserved);
    for (;;) {
        if (self->limit) {
            uint64_t used = kb_memory_used(self);
            if (used > self->limit || r > self->limit - used || bytes > self->limit - used - r)
                return -1;
        }
        if (atomic_compare_exchange_weak(&self->reserved, &r, r + bytes))
            return 0;
    }
}

void kb_memory_release(kb_memory_t *self, uint64_t bytes)
{
    if (self && bytes)
        atomic_fetch_sub(&self->reserved, bytes);
}

size_t kb_memory_chunk(size_t size)
{
    /* glibc: blocks at or above the mmap threshold (128 KiB unless it has adapted) are mapped alone. */
    if (size >= (128u << 10)) {
        long page = sysconf(_SC_PAGESIZE);
        size_t p = page > 0 ? (size_t)page : 4096u;
        return (size + 16 + p - 1) / p * p;
    }
    size_t chunk = (size + 8 + 15) & ~(size_t)15;
    return chunk < 32 ? 32 : chunk;
}

int kb_memory_parse(const char *text, uint64_t *out)
{
    if (!text || !*text)
        return -1;
    if (strcasecmp(text, "none") == 0 || strcasecmp(text, "unlimited") == 0) {
        *out = 0;
        return 0;
    }
    const char *p = text;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    unsigned shift = 0;
    switch (toupper((unsigned char)*p)) {
    case '\0': break;
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: return -1;
    }
    if (*p) {
        p++;
        /* Accepted spellings after the letter: nothing, "B", "iB". */
        if (strcasecmp(p, "") != 0 && strcasecmp(p, "b") != 0 && strcasecmp(p, "ib") != 0)
            return -1;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

uint64_t kb_memory_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    unsigned long long size = 0, resident = 0;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (n != 2 || page <= 0)
        return 0;
    return (uint64_t)resident * (uint64_t)page;
}

uint64_t kb_memory_proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    uint64_t kb = 0;
    size_t flen = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, flen) == 0 && line[flen] == ':')
            kb = strtoull(line + flen + 1, NULL, 10);
    fclose(f);
    return kb;
}
