/* splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014): a
 * bijection of 64-bit words that spreads small or sequential keys. One home for the C parts that use it
 * (sim/_lruset.c's hash index, workload/_blockids.c's block ids; workload/tokens.py mix64 is its numpy twin). */
#ifndef RACKSERVE_SPLITMIX_H
#define RACKSERVE_SPLITMIX_H

#include <stdint.h>

static inline uint64_t splitmix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

#endif
