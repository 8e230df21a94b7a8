/* Counter-based random numbers shared by the CPU and the CUDA code, so that both draw exactly the same
 * values (dropout masks) from the same seed without carrying a generator state.
 *
 * nn_hash_uniform(seed, i) is a float in [0, 1) made from the top 24 bits of a splitmix64 finaliser over
 * seed and i; every value is exactly representable in float, so host and device agree bit for bit. */
#ifndef NN_HASH_H
#define NN_HASH_H

#include "nn_host_device.h"

#include <stdint.h>

static inline NN_HOST_DEVICE uint64_t nn_hash_mix(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline NN_HOST_DEVICE float nn_hash_uniform(uint64_t seed, uint64_t i)
{
    return (float)(nn_hash_mix(seed, i) >> 40) * (1.0f / 16777216.0f);
}

#endif
