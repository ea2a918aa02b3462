// Counter-based random numbers: a value depends only on (seed, stream, index), never on thread
// count or call order, so runs are reproducible for a fixed seed at any number of threads.
#pragma once

#include <cstdint>

namespace diffuse {

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

inline uint64_t rng_key(uint64_t seed, uint64_t a, uint64_t b) {
    return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

// Uniform in the open interval (0, 1), 53 bits.
inline double uniform01(uint64_t key, uint64_t index) {
    const uint64_t r = splitmix64(key ^ splitmix64(index));
    return ((double) (r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace diffuse
