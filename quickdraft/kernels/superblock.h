// The superblock layer's layout in code (superblock.cpp describes it): its sizes, the row
// activations every path reads, and how many rows a tile takes.
#pragma once

#include "simd.h"

#include <cstdint>
#include <vector>

namespace quickdraft_superblock {

using namespace quickdraft_simd;

constexpr int64_t kSuper = 8;  // groups a superblock
// A record's sub-scales and minimums: 8 groups of 16 lanes, a byte each of both (or, in the
// Q6_K form, a signed byte for each half group).
constexpr int64_t kScaleBytes = kSuper * kLanes * 2;
// The code forms a tile computes: 4, 6 and 8 bits with a sub-scale and minimum per 32 inputs,
// and kQ6K, a GGUF's Q6_K: 6-bit codes with a signed sub-scale per 16 inputs that is also its
// minimum's (w = d * sc * q + dmin * sc, dmin = -32 d).
constexpr int kQ6K = 16;
template <int Form>
constexpr int kBits = Form == kQ6K ? 6 : Form;

// A record's bytes after its codes: the sub-scales and minimums, then d and dmin per lane in
// float32, or with ``half`` in float16 (what a GGUF's Q4_K and Q6_K blocks hold), where the
// Q6_K form keeps d alone (its dmin is -32 d).
constexpr int64_t meta_bytes(bool q6k, bool half) {
  return kScaleBytes + (half ? (q6k ? 1 : 2) * kLanes * 2 : 2 * kLanes * 4);
}
template <int Form, bool Half>
constexpr int64_t kMetaBytes = meta_bytes(Form == kQ6K, Half);

// A group's codes in a block of 16 outputs.
template <int Form>
constexpr int64_t code_bytes() {
  return kLanes * kGroup * kBits<Form> / 8;
}

inline int64_t supers_of(int64_t groups) { return (groups + kSuper - 1) / kSuper; }

// Bytes of one block of 16 outputs over k inputs.
inline int64_t block_bytes(int64_t k, int64_t bits, bool q6k, bool half) {
  const int64_t groups = k / kGroup;
  return groups * kLanes * kGroup * bits / 8 + supers_of(groups) * meta_bytes(q6k, half);
}

// Row activations, quantized per superblock: codes, the scale, the int16 sums of the codes
// per group of 32 inputs, or per 16 for kQ6K.
struct Activations {
  std::vector<int8_t> codes;  // [rows, k]
  std::vector<float> scale;   // [rows, supers]
  std::vector<int16_t> sums;  // [rows, supers, per], zero past a short superblock
  int64_t supers = 0;
  int64_t per = kSuper;       // sums a superblock: 8, or 16 for kQ6K
};

// Rows of a block go in tiles of up to kTile, their integer sums in registers; the block's
// records are read again (from cache) for each tile. 16 rows: 16 sums, a group's 8 code
// vectors and its sub-scales fill 25 of the 32 vector registers, and a 16-row verify unpacks
// each group's codes once.
constexpr int kTile = 16;
// A group's share of its superblock's lines (its codes, an eighth of the sub-scales and
// floats), which a tile prefetches ``kAheadBytes`` ahead (simd.h).
template <int Form>
constexpr int kAheadLines = code_bytes<Form>() / 64 + 1;

}  // namespace quickdraft_superblock
