// The kernels' raw entry points, for the fused decoder layer (layer.cpp) to call without the
// dispatcher: the same code the ops run (superblock_linear, group_linear, attend), so a layer
// computed in one call gives each product and each query the bits the separate ops give.
#pragma once

#include <cstdint>

namespace quickdraft_kernels {

// y [rows, n] = x [rows, k] W^T + b, W packed as superblock.cpp states; bias may be null.
// path: 1 AVX-512 VNNI, 2 AVX2 (the caller checked the CPU runs it). sub: 32, or 16 for 6-bit
// codes in a GGUF's Q6_K form (a signed sub-scale per 16 inputs). half: the records hold their
// float factors in float16.
void superblock_product(const float* x, int64_t rows, const uint8_t* packed, int64_t n,
                        int64_t k, const float* bias, int64_t path, int64_t bits, int64_t sub,
                        bool half, float* y);

// The same for groups.cpp's layout (bits 4 or 8).
void group_product(const float* x, int64_t rows, const uint8_t* packed, int64_t n, int64_t k,
                   const float* bias, int64_t path, int64_t bits, float* y);

// Bytes of the packed weights of an n x k layer in each layout: what the ops check.
int64_t superblock_bytes(int64_t n, int64_t k, int64_t bits, int64_t sub, bool half);
int64_t group_bytes(int64_t n, int64_t k, int64_t bits);

// Attention of G queries, each over exactly the cache slots it sees, in their order.
struct Attention {
  const float* q;          // query g's heads at q + token(g) * q_stride, [H, D] contiguous
  const float* keys;       // [B, S, Hkv, D] with the strides below, [Hkv, D] contiguous
  const float* values;     // the same layout
  const int64_t* tokens;   // [G]: query g's row of q and out; null: g itself
  const int64_t* rows;     // [G]: the cache row query g reads
  const int64_t* slots;    // [G, width]: query g's first counts[g] entries are its slots
  const int64_t* counts;   // [G]
  float* out;              // query g's [H, D] at out + token(g) * out_stride
  int64_t queries, heads, kv_heads, dim, width;
  int64_t q_stride, out_stride;
  int64_t key_row_stride, key_slot_stride, value_row_stride, value_slot_stride;
  float scale;
};

// path: 1 AVX-512, 2 AVX2. Threads over (query, head) pairs when the work pays for them.
void attend_queries(const Attention& problem, int64_t path);

}  // namespace quickdraft_kernels
